// ebb chat as a user drives it: through a pipe (scripts) and on a terminal
// (a pseudo-terminal from forkpty, where Ctrl-C is a real SIGINT from the
// line discipline and lines are edited by libedit).
#include <gtest/gtest.h>

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "support.h"

namespace ebb {
namespace {

using test::run_cli;

// One "[prompt P tok ... | gen G tok ... | stop S | ... | context C/N]" line.
struct TurnLine {
  int64_t prompt = 0, gen = 0, context = 0;
  std::string stop;
};

std::vector<TurnLine> turn_lines(const std::string& err) {
  static const std::regex re(R"(\[prompt (\d+) tok [^|]*\| gen (\d+) tok [^\]]*\| stop (\w+) [^\]]*\| context (\d+)/\d+\])");
  std::vector<TurnLine> v;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator(); ++it) {
    v.push_back({std::stoll((*it)[1]), std::stoll((*it)[2]), std::stoll((*it)[4]), (*it)[3]});
  }
  return v;
}

// Turn k runs only turn k's tokens: its prompt count is what the session grew
// by before generation, plus at most one token (the previous answer's last
// token, sampled but not yet run). A turn that re-ran the conversation
// would process about the whole context instead.
std::vector<TurnLine> expect_turns_run_only_new_tokens(const std::string& model, const std::vector<std::string>& msgs,
                                                        const std::string& extra = "") {
  std::string in;
  for (const std::string& m : msgs) in += m + "\n";
  const test::CliResult r =
      run_cli("chat -m " + test::model_path(model) + " --ctx 512 --temp 0 -n 24 --threads 2 " + extra, in);
  EXPECT_EQ(r.status, 0) << r.err;
  if (r.status != 0) return {};
  const std::vector<TurnLine> t = turn_lines(r.err);
  EXPECT_EQ(t.size(), msgs.size()) << r.err;
  if (t.size() != msgs.size()) return t;
  if (t[0].stop != "stop_string") {
    EXPECT_EQ(t[0].prompt + t[0].gen, t[0].context) << r.err;  // the first turn: everything is new
  }
  for (size_t k = 1; k < t.size(); ++k) {
    SCOPED_TRACE(model + ", turn " + std::to_string(k + 1));
    EXPECT_GT(t[k - 1].gen, 0) << r.err;
    // Tokens the turn added before its answer (the previous turn's last token excluded).
    const int64_t added = t[k].context - t[k - 1].context - t[k].gen;
    const bool settled = t[k].stop == "stop_string";  // an answer cut at a stop string drops its tail tokens
    if (!settled) {
      EXPECT_GE(t[k].prompt, added) << r.err;
      EXPECT_LE(t[k].prompt, added + 1) << r.err;
    }
    // Never the history again.
    EXPECT_LT(t[k].prompt, t[k - 1].context) << r.err;
  }
  return t;
}

TEST(ChatReuse, Stories260KPlainTemplate) {
  expect_turns_run_only_new_tokens("stories260K.gguf",
                                   {"Once upon a time", "Tell me about the cat", "What did Lily do?", "The end"});
}

TEST(ChatReuse, AnswersCutByAStopStringCostNothingLater) {
  // Answers end at their first "e" (a stop string): the session keeps the
  // answer as shown, without the stop string's tokens, and the next turn
  // still runs only its own tokens.
  const std::vector<TurnLine> t = expect_turns_run_only_new_tokens(
      "stories260K.gguf", {"Once upon a time", "Tell me about the cat", "What did Lily do?", "The end"},
      "--stop e");
  int stopped = 0;
  for (const TurnLine& l : t) stopped += l.stop == "stop_string";
  EXPECT_GE(stopped, 2);
}

TEST(ChatReuse, TinyQwen3ChatML) {
  expect_turns_run_only_new_tokens("tiny-qwen3-f16.gguf", {"Hello there", "How are you?", "Tell me a story", "Bye"});
}

TEST(ChatReuse, TinyLlamaTemplate) {
  expect_turns_run_only_new_tokens("tiny-llama-f16.gguf", {"Hello there", "How are you?", "Tell me a story", "Bye"});
}

// The other two formats, forced on tiny-llama (whose file has no template),
// with a system message (Llama 2 folds it into the first turn).
TEST(ChatReuse, Llama2Format) {
  expect_turns_run_only_new_tokens("tiny-llama-f16.gguf", {"Hello there", "How are you?", "Bye"},
                                   "--format llama2 --system Brief");
}

TEST(ChatReuse, Llama3Format) {
  expect_turns_run_only_new_tokens("tiny-llama-f16.gguf", {"Hello there", "How are you?", "Bye"},
                                   "--format llama3 --system Brief");
}

TEST(ChatCli, SaysWhichTemplateWasChosen) {
  const test::CliResult r = run_cli("chat -m " + test::model_path("tiny-qwen3-f16.gguf") + " --threads 1", "/quit\n");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("chat template: chatml"), std::string::npos) << r.err;
  const test::CliResult p =
      run_cli("chat -m " + test::model_path("tiny-qwen3-f16.gguf") + " --threads 1 --format plain", "/quit\n");
  EXPECT_NE(p.err.find("chat template: plain (--format)"), std::string::npos) << p.err;
}

TEST(ChatCli, AFailedTurnIsUndone) {
  // The first message does not fit in a 64-token context: the turn fails
  // and leaves nothing behind, so the next one runs as a first turn.
  std::string big;
  for (int i = 0; i < 120; ++i) big += "the cat sat on the mat ";
  const test::CliResult r = run_cli("chat -m " + test::model_path("stories260K.gguf") +
                                        " --ctx 64 --temp 0 -n 8 --threads 1",
                                    big + "\nLily\n/memory\n");
  EXPECT_EQ(r.status, 1) << r.err;  // a turn failed: scripts see it
  EXPECT_NE(r.err.find("the context is full"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/reset"), std::string::npos) << r.err;  // what to do about it
  EXPECT_NE(r.err.find("undone"), std::string::npos) << r.err;
  const std::vector<TurnLine> t = turn_lines(r.err);
  ASSERT_EQ(t.size(), 1u) << r.err;
  EXPECT_EQ(t[0].prompt + t[0].gen, t[0].context) << r.err;
  EXPECT_LT(t[0].prompt, 30) << r.err;
}

TEST(ChatCli, AFullContextOffersAWayOn) {
  // The third turn would not fit in the 160-token context with room for its
  // answer: the chat shifts by itself (keeping the latest turn) and says so;
  // /shift does the same on request, and the next turn appends to it.
  const test::CliResult r = run_cli("chat -m " + test::model_path("stories260K.gguf") +
                                        " --ctx 160 --temp 0 -n 40 --threads 1",
                                    "Once upon a time\nLily\nThe cat\n/shift\nBye\n");
  EXPECT_EQ(r.status, 0) << r.err;
  const std::vector<TurnLine> t = turn_lines(r.err);
  ASSERT_EQ(t.size(), 4u) << r.err;
  EXPECT_NE(r.err.find("the context is full: shifted it, kept 2 of the conversation's messages"), std::string::npos)
      << r.err;
  EXPECT_LT(t[2].context, t[1].context) << r.err;  // shifted before it ran
  EXPECT_EQ(t[2].stop, "max_tokens") << r.err;
  std::smatch m;
  const std::string after = r.err.substr(r.err.find('\n', r.err.find("shifted it, kept")));  // the /shift's line
  ASSERT_TRUE(std::regex_search(after, m, std::regex(R"(kept (\d+) of the conversation's messages \((\d+) tokens)")))
      << r.err;
  EXPECT_EQ(std::stoi(m[1]), 2) << r.err;  // the last user message and its answer
  const int64_t kept = std::stoll(m[2]);
  EXPECT_LE(kept, 80) << r.err;  // half the context at most
  EXPECT_EQ(t[3].context, kept + t[3].prompt + t[3].gen) << r.err;
  // An answer that runs into the end of the context says what to do. The
  // greedy story goes on for 48 tokens at least: a 40-token context ends it.
  const test::CliResult full =
      run_cli("chat -m " + test::model_path("stories260K.gguf") + " --ctx 40 --temp 0 -n -1 --threads 1",
              "Once upon a time\n");
  EXPECT_EQ(full.status, 0) << full.err;
  const std::vector<TurnLine> f = turn_lines(full.err);
  ASSERT_EQ(f.size(), 1u) << full.err;
  EXPECT_EQ(f[0].stop, "context_full") << full.err;
  EXPECT_EQ(f[0].context, 40) << full.err;
  EXPECT_NE(full.err.find("[the context is full (40 tokens): /shift"), std::string::npos) << full.err;
}

TEST(ChatCli, ASmallContextShiftsByItself) {
  // stories260K holds 128 tokens: the default answer length comes from the
  // context, and a turn that would not fit shifts it (keeping the latest
  // turns) instead of failing.
  const test::CliResult r = run_cli("chat -m " + test::model_path("stories260K.gguf") + " --temp 0 --threads 1",
                                    "Once upon a time\nLily went to the park\nThe cat\nThe dog ran\nBye\n");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("answers of 32 tokens at most"), std::string::npos) << r.err;  // 128 / 4
  const std::vector<TurnLine> t = turn_lines(r.err);
  ASSERT_EQ(t.size(), 5u) << r.err;
  for (const TurnLine& l : t) EXPECT_LE(l.gen, 32) << r.err;
  EXPECT_NE(r.err.find("the context is full: shifted it, kept "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("this turn was undone"), std::string::npos) << r.err;
  // After a shift the context holds less than before it.
  bool shrank = false;
  for (size_t k = 1; k < t.size(); ++k) shrank = shrank || t[k].context < t[k - 1].context;
  EXPECT_TRUE(shrank) << r.err;
}

TEST(ChatCli, InputThatIsNotLinesOfTextStopsTheChat) {
  // /dev/zero has no line ends: the chat stops at 64 bytes per context token
  // instead of reading it all (the inner redirection wins over run_cli's).
  const test::CliResult r = run_cli("--help >/dev/null; { " + std::string(EBB_CLI_PATH) + " chat -m " +
                                    test::model_path("stories260K.gguf") + " --threads 1 </dev/zero; }");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("an input line is longer than 8.0 KiB, more than the context holds (128 tokens)"),
            std::string::npos)
      << r.err;
}

TEST(ChatCli, QuietShowsOnlyTheAnswers) {
  const std::string m = "chat -m " + test::model_path("stories260K.gguf") + " --temp 0 -n 8 --threads 1";
  const test::CliResult loud = run_cli(m, "Lily\n");
  const test::CliResult quiet = run_cli(m + " --quiet", "Lily\n");
  ASSERT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(turn_lines(loud.err).size(), 1u) << loud.err;
  EXPECT_TRUE(turn_lines(quiet.err).empty()) << quiet.err;
  EXPECT_EQ(quiet.err.find("ebb chat:"), std::string::npos) << quiet.err;
  EXPECT_EQ(quiet.out, loud.out);
  EXPECT_FALSE(quiet.out.empty());
}

TEST(ChatCli, LoadShowsTheSavedTranscript) {
  test::TempDir d("ebb-chat");
  const std::string m = "chat -m " + test::model_path("stories260K.gguf") + " --temp 0 -n 8 --threads 1";
  const test::CliResult saved = run_cli(m, "Lily and the cat\n/save " + d.file("s.bin") + "\n");
  ASSERT_EQ(saved.status, 0) << saved.err;
  EXPECT_NE(saved.err.find("and 2 messages"), std::string::npos) << saved.err;
  const test::CliResult loaded = run_cli(m, "/load " + d.file("s.bin") + "\n/memory\n");
  ASSERT_EQ(loaded.status, 0) << loaded.err;
  EXPECT_NE(loaded.err.find("and 2 messages:\n  user: Lily and the cat\n  assistant: "), std::string::npos)
      << loaded.err;
  // Without the transcript beside it, the text the session holds is shown.
  std::filesystem::remove(d.file("s.bin") + ".chat.json");
  const test::CliResult bare = run_cli(m, "/load " + d.file("s.bin") + "\n");
  EXPECT_NE(bare.err.find("no transcript beside the file"), std::string::npos) << bare.err;
  EXPECT_NE(bare.err.find("Lily and the cat"), std::string::npos) << bare.err;
}

TEST(ChatCli, AContextBeyondTrainingWarns) {
  const test::CliResult r =
      run_cli("chat -m " + test::model_path("stories260K.gguf") + " -c 1024 --threads 1", "/quit\n");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --ctx 1024 is beyond the 128 tokens"), std::string::npos) << r.err;
}

TEST(ChatCli, SlashCommandsAreNeverSentToTheModel) {
  const test::CliResult r = run_cli("chat -m " + test::model_path("stories260K.gguf") + " --temp 0 -n 8 --threads 1",
                                    "/foo\n/evict\n/restore\n/load /tmp\n/quit \nLily\n");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("unknown command '/foo'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/evict needs a size"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing is evicted"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
  // "/quit " (trailing space) quits: "Lily" never becomes a turn; nor did any command.
  EXPECT_TRUE(turn_lines(r.err).empty()) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(ChatCli, DoubleSlashSendsAMessageThatStartsWithASlash) {
  const test::CliResult r =
      run_cli("chat -m " + test::model_path("stories260K.gguf") + " --temp 0 -n 4 --threads 1", "//foo\n");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(turn_lines(r.err).size(), 1u) << r.err;
}

// ---- on a terminal ----------------------------------------------------------

class PtyChat {
 public:
  explicit PtyChat(const std::string& args) {
    struct winsize ws {};
    ws.ws_row = 50;
    ws.ws_col = 200;
    pid_ = forkpty(&fd_, nullptr, nullptr, &ws);
    if (pid_ == 0) {
      setenv("TERM", "xterm", 1);
      // exec: ebb itself is the terminal's foreground process (a shell in
      // between would die of the first Ctrl-C).
      const std::string cmd = "exec " + std::string(EBB_CLI_PATH) + " " + args;
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~PtyChat() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  bool started() const { return pid_ > 0; }

  // Reads until `what` appears after offset `from` of the output; false on timeout.
  bool wait_for(const std::string& what, size_t from, double seconds = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (out_.find(what, from) == std::string::npos) {
      if (std::chrono::steady_clock::now() > end) return false;
      if (!read_some(100)) return out_.find(what, from) != std::string::npos;
    }
    return true;
  }
  // Reads until the output is at least n bytes long; false on timeout.
  bool wait_for_bytes(size_t n, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (out_.size() < n) {
      if (std::chrono::steady_clock::now() > end || !read_some(100)) return out_.size() >= n;
    }
    return true;
  }
  void send(const std::string& s) { ASSERT_EQ(::write(fd_, s.data(), s.size()), static_cast<ssize_t>(s.size())); }
  const std::string& out() const { return out_; }
  size_t mark() const { return out_.size(); }

  // Waits for the process to end (reading what it still writes); its status, or -1.
  int wait_exit(double seconds = 30) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      read_some(50);
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    return -1;
  }

 private:
  // False at end of output.
  bool read_some(int ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return true;
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    out_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string out_;
};

TEST(ChatTerminal, CtrlCStopsTheAnswerAndKeepsTheConversation) {
  // tiny-llama's random weights answer until the context ends (-n -1), which
  // takes seconds: long enough to interrupt.
  PtyChat c("chat -m " + test::model_path("tiny-llama-f16.gguf") + " --ctx 1024 -n -1 --temp 0 --threads 1");
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.wait_for("> ", 0)) << c.out();
  size_t m = c.mark();
  c.send("Hello there\r");
  ASSERT_TRUE(c.wait_for("Hello there", m)) << c.out();  // the echo
  m = c.mark();
  // The answer is streaming once well more than the echo has come back.
  ASSERT_TRUE(c.wait_for_bytes(m + 96, 30)) << c.out();
  c.send("\x03");
  ASSERT_TRUE(c.wait_for("[answer stopped", m)) << c.out();
  EXPECT_NE(c.out().find("stop cancelled", m), std::string::npos) << c.out().substr(m);
  ASSERT_TRUE(c.wait_for("> ", m)) << c.out();

  // A turn that fails (it does not fit in what is left of the context) is
  // undone and the chat goes on.
  m = c.mark();
  std::string big;
  for (int i = 0; i < 1100; ++i) big += "the ";
  c.send(big + "\r");
  ASSERT_TRUE(c.wait_for("this turn was undone", m)) << c.out().substr(m);
  EXPECT_NE(c.out().find("the context is full", m), std::string::npos) << c.out().substr(m);
  ASSERT_TRUE(c.wait_for("> ", m)) << c.out();

  // The conversation is still there: the next turn runs only its own tokens.
  m = c.mark();
  c.send("/memory\r");
  ASSERT_TRUE(c.wait_for(" tokens |", m)) << c.out();
  std::smatch ctx;
  const std::string mem = c.out().substr(m);
  ASSERT_TRUE(std::regex_search(mem, ctx, std::regex(R"(context (\d+)/1024 tokens)"))) << mem;
  const int64_t before = std::stoll(ctx[1]);
  EXPECT_GT(before, 0);
  m = c.mark();
  c.send("Go on\r");
  ASSERT_TRUE(c.wait_for("[prompt ", m, 120)) << c.out().substr(m);
  ASSERT_TRUE(c.wait_for("]", c.out().find("[prompt ", m), 120)) << c.out().substr(m);
  std::vector<TurnLine> t = turn_lines(c.out().substr(m));
  if (t.empty()) {  // interrupted lines: read the rest of the summary
    ASSERT_TRUE(c.wait_for("> ", m)) << c.out();
    t = turn_lines(c.out().substr(m));
  }
  // A long answer may be cut by the context, never re-run from the start.
  ASSERT_EQ(t.size(), 1u) << c.out().substr(m);
  const int64_t added = t[0].context - before - t[0].gen;
  EXPECT_GE(t[0].prompt, added) << c.out().substr(m);
  EXPECT_LE(t[0].prompt, added + 1) << c.out().substr(m);

  // The prompt after the turn's summary lines: a "> " inside the answer's
  // text would send the Ctrl-C while the turn is still ending, where it is
  // (rightly) taken as stopping that answer and then forgotten.
  ASSERT_TRUE(c.wait_for("\n> ", c.out().find("[prompt ", m))) << c.out().substr(m);
  m = c.mark();
  c.send("\x03");  // Ctrl-C at the prompt is how a person leaves: a clean exit, status 0
  EXPECT_EQ(c.wait_exit(), 0) << c.out().substr(m);
}

TEST(ChatTerminal, UpArrowRecallsTheLastLine) {
  PtyChat c("chat -m " + test::model_path("stories260K.gguf") + " -n 4 --temp 0 --threads 1");
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.wait_for("> ", 0)) << c.out();
  size_t m = c.mark();
  c.send("Lily\r");
  ASSERT_TRUE(c.wait_for("[prompt ", m)) << c.out();
  ASSERT_TRUE(c.wait_for("> ", m)) << c.out();
  m = c.mark();
  c.send("\x1b[A\r");  // up arrow, enter: "Lily" again
  ASSERT_TRUE(c.wait_for("[prompt ", m)) << c.out().substr(m);
  EXPECT_NE(c.out().find("Lily", m), std::string::npos) << c.out().substr(m);
  ASSERT_TRUE(c.wait_for("> ", m)) << c.out();
  c.send("/quit\r");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

TEST(ChatTerminal, LoadProgressIsOneLineUpdatedInPlace) {
  // On a terminal the progress line is rewritten in place (carriage return,
  // erase to the end of the line) and erased when the load ends.
  PtyChat c("chat -m " + test::model_path("stories260K.gguf") + " -n 4 --temp 0 --threads 1 --progress-after 0");
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.wait_for("> ", 0)) << c.out();
  const std::string out = c.out();
  const size_t at = out.find("\r\x1b[Kloading stories260K.gguf: ");
  ASSERT_NE(at, std::string::npos) << out;
  const size_t done = out.find("100% (", at);
  ASSERT_NE(done, std::string::npos) << out;
  const size_t erased = out.find("\r\x1b[K", done);  // after the last update: the line erased
  ASSERT_NE(erased, std::string::npos) << out;
  EXPECT_NE(out.compare(erased + 4, 7, "loading"), 0) << out;
  EXPECT_EQ(out.substr(at, erased - at).find('\n'), std::string::npos) << "a line end inside the progress: " << out;
  EXPECT_LT(erased, out.find("ebb chat:")) << out;
  c.send("/quit\r");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

}  // namespace
}  // namespace ebb

namespace ebb {
namespace {

// `ebb chat --cache-dir DIR` keeps the conversation; a new process with
// --resume continues it, taking its KV from the cache files: only the tail
// past the last whole chunk is recomputed, and the next turn runs only its
// own tokens.
TEST(ChatResume, ANewProcessContinuesTheConversationFromTheCacheFiles) {
  test::TempDir dir("ebb-chat-resume");
  const std::string base = "chat -m " + test::model_path("stories260K.gguf") +
                           " --ctx 512 --kv-chunk 16 --temp 0 -n 24 --threads 2 --cache-dir " + dir.path();
  const test::CliResult first = test::run_cli(base, "Once upon a time\nTell me about the cat\n");
  ASSERT_EQ(first.status, 0) << first.err;
  const std::vector<TurnLine> t1 = turn_lines(first.err);
  ASSERT_EQ(t1.size(), 2u) << first.err;
  const int64_t held = t1[1].context;

  const test::CliResult second = test::run_cli(base + " --resume", "What did Lily do?\n");
  ASSERT_EQ(second.status, 0) << second.err;
  std::smatch m;
  const std::regex re(R"(resumed (\d+) tokens in [0-9.]+ s: (\d+) from the cache directory, (\d+) recomputed)");
  ASSERT_TRUE(std::regex_search(second.err, m, re)) << second.err;
  EXPECT_EQ(std::stoll(m[1]), held);
  const int64_t reused = std::stoll(m[2]), recomputed = std::stoll(m[3]);
  EXPECT_EQ(reused, (held - 2) / 16 * 16) << "every whole chunk but the one the last tokens fall in";
  EXPECT_EQ(reused + recomputed, held - 1);
  const std::vector<TurnLine> t2 = turn_lines(second.err);
  ASSERT_EQ(t2.size(), 1u) << second.err;
  EXPECT_LT(t2[0].prompt, 40) << "the resumed turn runs only its own tokens";
  EXPECT_GT(t2[0].context, held);

  const test::CliResult none = test::run_cli("chat -m " + test::model_path("stories260K.gguf") + " --resume", "");
  EXPECT_EQ(none.status, 2) << none.err;
  EXPECT_NE(none.err.find("--resume needs --cache-dir"), std::string::npos) << none.err;
}

}  // namespace
}  // namespace ebb
