#include "cli/line_reader.h"

#include <unistd.h>

#include <cerrno>
#include <clocale>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <cwchar>
#include <utility>

#ifdef EBB_HAVE_LIBEDIT
#include <histedit.h>
#endif

namespace ebb::cli {
namespace {

volatile std::sig_atomic_t g_interrupt = 0;

void on_sigint(int) { g_interrupt = 1; }

#ifdef EBB_HAVE_LIBEDIT
// One byte from fd 0, retrying reads that a signal other than SIGINT cut.
// Returns 1, 0 at end of input, -1 on an error or a Ctrl-C.
int read_byte(char* c) {
  for (;;) {
    if (g_interrupt) return -1;
    const ssize_t n = ::read(STDIN_FILENO, c, 1);
    if (n == 1) return 1;
    if (n == 0) return 0;
    if (errno != EINTR) return -1;
  }
}

// libedit's character source: our own read, so a Ctrl-C ends el_gets() at
// once (libedit's own reader retries interrupted reads). Multi-byte UTF-8
// characters are assembled into one wide character.
int edit_getc(EditLine*, wchar_t* wc) {
  std::mbstate_t st{};
  for (;;) {
    char c;
    const int r = read_byte(&c);
    if (r <= 0) return r;
    const size_t n = std::mbrtowc(wc, &c, 1, &st);
    if (n == static_cast<size_t>(-2)) continue;  // more bytes to come
    if (n == static_cast<size_t>(-1)) {
      *wc = static_cast<unsigned char>(c);  // not valid in the locale: pass the byte
      st = {};
    }
    return 1;
  }
}

const char* g_prompt = "> ";
const char* edit_prompt(EditLine*) { return g_prompt; }
#endif

}  // namespace

struct LineReader::Impl {
  struct sigaction old_action {};
  std::string pending;  // plain mode: bytes read past the last line
  size_t max_line = 0;  // plain mode: longest line (0: no limit)
#ifdef EBB_HAVE_LIBEDIT
  EditLine* el = nullptr;
  History* hist = nullptr;
#endif
};

LineReader::LineReader() : impl_(std::make_unique<Impl>()) {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocked read returns EINTR
  ::sigaction(SIGINT, &sa, &impl_->old_action);
  g_interrupt = 0;
#ifdef EBB_HAVE_LIBEDIT
  if (::isatty(STDIN_FILENO) && ::isatty(STDERR_FILENO)) {
    std::setlocale(LC_CTYPE, "");
    impl_->el = el_init("ebb", stdin, stderr, stderr);
    impl_->hist = history_init();
    if (impl_->el && impl_->hist) {
      HistEvent ev;
      history(impl_->hist, &ev, H_SETSIZE, 1000);
      history(impl_->hist, &ev, H_SETUNIQUE, 1);
      el_set(impl_->el, EL_EDITOR, "emacs");
      el_set(impl_->el, EL_SIGNAL, 0);  // our handler; el_gets restores the terminal itself
      el_set(impl_->el, EL_PROMPT, edit_prompt);
      el_set(impl_->el, EL_HIST, history, impl_->hist);
      el_wset(impl_->el, EL_GETCFN, edit_getc);
      el_source(impl_->el, nullptr);  // the user's ~/.editrc, if any
    } else {
      if (impl_->el) el_end(impl_->el);
      if (impl_->hist) history_end(impl_->hist);
      impl_->el = nullptr;
      impl_->hist = nullptr;
    }
  }
#endif
}

LineReader::~LineReader() {
#ifdef EBB_HAVE_LIBEDIT
  if (impl_->el) el_end(impl_->el);
  if (impl_->hist) history_end(impl_->hist);
#endif
  ::sigaction(SIGINT, &impl_->old_action, nullptr);
}

bool LineReader::interrupted() { return g_interrupt != 0; }
void LineReader::clear_interrupt() { g_interrupt = 0; }

bool LineReader::editing() const {
#ifdef EBB_HAVE_LIBEDIT
  return impl_->el != nullptr;
#else
  return false;
#endif
}

void LineReader::set_max_line(size_t bytes) { impl_->max_line = bytes; }

LineReader::Status LineReader::read(const char* prompt, std::string& line) {
  line.clear();
#ifdef EBB_HAVE_LIBEDIT
  if (impl_->el) {
    g_prompt = prompt;
    int count = 0;
    const char* s = el_gets(impl_->el, &count);
    if (g_interrupt) return Status::kInterrupted;
    if (!s || count <= 0) return Status::kEof;
    line.assign(s, static_cast<size_t>(count));
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (!line.empty()) {
      HistEvent ev;
      history(impl_->hist, &ev, H_ENTER, line.c_str());
    }
    return Status::kLine;
  }
#endif
  std::fputs(prompt, stderr);
  std::fflush(stderr);
  for (;;) {
    const size_t nl = impl_->pending.find('\n');
    if (nl != std::string::npos) {
      line = impl_->pending.substr(0, nl);
      impl_->pending.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return Status::kLine;
    }
    if (impl_->max_line > 0 && impl_->pending.size() > impl_->max_line) {
      impl_->pending.clear();
      return Status::kTooLong;
    }
    char buf[4096];
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n > 0) {
      impl_->pending.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR && !g_interrupt) continue;
    if (g_interrupt) return Status::kInterrupted;
    if (impl_->pending.empty()) return Status::kEof;
    line = std::exchange(impl_->pending, {});  // a last line without a newline
    return Status::kLine;
  }
}

}  // namespace ebb::cli
