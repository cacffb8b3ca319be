// ebb chat: an interactive conversation that keeps its KV between turns.
//
// The session's tokens are the conversation: each turn appends only what the
// turn adds (the close of the previous answer, the user's message, the
// header of the new answer) and runs only those tokens. The history is never
// re-rendered into the session, so an answer that a stop string ended, or
// that the template would trim, costs nothing on the next turn.
#include <algorithm>
#include <filesystem>
#include <limits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "cli/chat_commands.h"
#include "cli/line_reader.h"
#include "cli/options.h"
#include "model/chat_template.h"
#include "platform/error.h"
#include "platform/timer.h"

namespace ebb::cli {
namespace {

struct ChatArgs {
  ModelArgs model;
  SamplerOptions sampling;
  ChatTemplateArgs chat_template;
  std::string system;
  int64_t n_predict = kAnswerFromContext;
  std::vector<std::string> stop;
  bool resume = false;  // continue the conversation saved in --cache-dir
  int64_t keep = -2;    // --keep (llama.cpp): accepted, noted; -2: not given
  static constexpr int64_t kAnswerFromContext = -2;
};

// The default answer length: a quarter of the context, at most 512 tokens,
// so an answer leaves room for the turns around it.
int64_t default_answer_tokens(int64_t n_ctx) { return std::max<int64_t>(1, std::min<int64_t>(512, n_ctx / 4)); }

constexpr const char* kHelp =
    "commands: /help, /reset (forget the conversation), /shift (keep the system message and the latest turns\n"
    "          that fit in half the context, run again), /save FILE, /load FILE, /memory,\n"
    "          /evict SIZE|PCT (give memory back, e.g. /evict 50%), /restore,\n"
    "          /limit SIZE|PCT|off (cap memory: answers stream what does not fit),\n"
    "          /lora [load FILE | bind NAME [SCALE] | unbind NAME|all | scale NAME SCALE] (LoRA adapters), /quit\n"
    "          (a message that starts with / is written //; Ctrl-C stops an answer, Ctrl-C at the prompt exits)\n";

// Content that no template alters (no surrounding whitespace, no markers),
// used to find where an answer's rendering ends.
constexpr const char* kSentinel = "EBBSENTINEL7f3a";

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

class Chat {
 public:
  Chat(Engine& engine, ChatArgs& a)
      : engine_(engine),
        a_(a),
        session_(engine, session_options(a.model)),
        template_(resolve_chat_template(a.chat_template, engine, a.model.quiet)),
        fmt_(template_.renderer) {
    max_tokens_ = a.n_predict == ChatArgs::kAnswerFromContext ? default_answer_tokens(session_.n_ctx())
                                                                : max_tokens_of(a.n_predict);
    session_.set_adapters(adapter_bindings(a.model));
    reset();
  }

  std::string answer_limit() const {
    return max_tokens_ == std::numeric_limits<int64_t>::max() ? std::string("any number of") : std::to_string(max_tokens_);
  }

  std::string format_note() const {
    return "chat template: " + fmt_.name() + " (" + template_.source + ")";
  }

  void reset() {
    session_.clear();
    messages_.clear();
    if (!a_.system.empty()) messages_.push_back({"system", a_.system});
    state_ = State::kEmpty;
    carry_.clear();
  }

  // One user turn: feed only what the conversation adds, stream the answer.
  // A turn that fails leaves the conversation as it was before it. Returns
  // false when it failed.
  bool turn(const std::string& user) {
    const int64_t n_before = static_cast<int64_t>(session_.tokens().size());
    try {
      run_turn(user);
      return true;
    } catch (const std::bad_alloc&) {
      rollback(n_before);
      std::fprintf(stderr, "ebb: error: out of memory during this turn; it was undone (the conversation is kept): "
                           "/evict or /limit give memory back, /reset starts over\n");
    } catch (const std::system_error& e) {
      rollback(n_before);
      std::fprintf(stderr, "ebb: error: the system refused memory or threads during this turn (%s); it was undone\n",
                   e.what());
    } catch (const Error& e) {
      rollback(n_before);
      std::fprintf(stderr, "ebb: error: %s\nthis turn was undone; the conversation is kept\n", e.what());
    }
    return false;
  }

  // `/shift`: keeps the system message and the most recent turns whose
  // rendering fits in half the context, and runs them again (a documented
  // way out of a full context that keeps the latest exchanges). A turn that
  // would not fit shifts by itself (automatic), saying so in one line.
  // Returns false when even the system message is too long.
  bool shift(bool automatic = false) {
    std::vector<ChatMessage> sys, turns;
    for (const ChatMessage& m : messages_) (m.role == "system" ? sys : turns).push_back(m);
    EncodeOptions eo;
    eo.add_bos = engine_.tokenizer().add_bos_default();
    eo.parse_special = true;
    const size_t limit = static_cast<size_t>(session_.n_ctx() / 2);
    size_t drop = 0;  // whole user + assistant pairs from the front
    std::string text;
    std::vector<TokenId> toks;
    for (;; drop += 2) {
      std::vector<ChatMessage> kept = sys;
      kept.insert(kept.end(), turns.begin() + static_cast<long>(std::min(drop, turns.size())), turns.end());
      text = kept.empty() ? "" : fmt_.render(kept, false);
      eo.add_bos = engine_.tokenizer().add_bos_default() && !fmt_.writes_bos(text);
      toks = engine_.tokenizer().encode(text, eo);
      if (toks.size() <= limit || drop >= turns.size()) {
        messages_ = kept;
        break;
      }
    }
    if (toks.size() > limit) {
      std::fprintf(stderr, "the system message alone is %zu tokens, over half the context; /reset instead\n",
                   toks.size());
      return false;
    }
    session_.clear();
    carry_.clear();
    if (messages_.empty() || (messages_.size() == 1 && messages_[0].role == "system" && toks.empty())) {
      state_ = State::kEmpty;
    } else {
      session_.feed(toks);
      state_ = State::kClosed;
      closed_text_ = text;
    }
    std::fprintf(stderr, "%skept %zu of the conversation's messages (%zu tokens, run again)\n",
                 automatic ? "the context is full: shifted it, " : "", messages_.size(), toks.size());
    return true;
  }

  void lora(const std::string& arg) { lora_command(engine_, session_, arg); }
  void memory() const { memory_command(engine_, session_); }
  void evict(const std::string& arg) { evict_command(engine_, arg); }
  void limit(const std::string& arg) { limit_command(engine_, arg); }
  void restore() { restore_command(engine_); }

  // /save FILE: the model's state in FILE, the transcript beside it in
  // FILE.chat.json (what /load shows and continues from).
  void save(const std::string& path) {
    session_.save(path);
    write_json(transcript_json(), transcript_path(path));
    std::fprintf(stderr, "saved %zu tokens and %zu messages\n", session_.tokens().size(), messages_.size());
  }

  void load(const std::string& path) {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(st)) throw Error("/load: '" + path + "' does not exist");
    if (std::filesystem::is_directory(st)) throw Error("/load: '" + path + "' is a directory, not a session file");
    if (!std::filesystem::is_regular_file(st))
      throw Error("/load: '" + path + "' is not a regular file (a pipe or a device); give a file made by /save");
    session_.load(path);
    // The transcript is beside the model's state (FILE.chat.json) when /save
    // wrote it. Without it, a saved chat ends in an answer (its last token
    // pending), so the next turn closes it first, and the text the session
    // holds is shown instead.
    messages_.clear();
    if (!a_.system.empty()) messages_.push_back({"system", a_.system});
    carry_.clear();
    state_ = session_.tokens().empty() ? State::kEmpty : State::kOpenAnswer;
    last_eog_ = false;
    std::ifstream f(transcript_path(path));
    nlohmann::json j;
    bool have = false;
    if (f) {
      try {
        j = nlohmann::json::parse(f);
        have = j.value("tokens", std::vector<TokenId>{}) == session_.tokens();
      } catch (const nlohmann::json::exception&) {
        have = false;
      }
    }
    if (have) {
      read_transcript(j);
      std::fprintf(stderr, "loaded %zu tokens and %zu messages:\n", session_.tokens().size(), messages_.size());
      for (const ChatMessage& m : messages_) std::fprintf(stderr, "  %s: %s\n", m.role.c_str(), m.content.c_str());
      return;
    }
    std::string text;
    for (TokenId t : session_.tokens()) text += engine_.tokenizer().token_to_piece(t, true);
    std::fprintf(stderr, "loaded %zu tokens (no transcript beside the file; the text they hold):\n%s\n",
                 session_.tokens().size(), text.c_str());
  }

  // With --cache-dir: the conversation (tokens, transcript and where the
  // session stands) is written after every turn; its KV goes to the prefix
  // cache's files as chunks fill. --resume reads it back and takes the KV
  // from those files instead of recomputing it.
  std::string conversation_path() const { return a_.model.cache_dir + "/chat-conversation.json"; }

  static std::string transcript_path(const std::string& session_file) { return session_file + ".chat.json"; }

  // The conversation as --cache-dir and /save keep it: tokens, transcript
  // and where the session stands.
  nlohmann::json transcript_json() const {
    nlohmann::json j;
    j["model_fingerprint"] = engine_.model_fingerprint();
    j["format"] = fmt_.name();
    j["tokens"] = session_.tokens();
    j["state"] = static_cast<int>(state_);
    j["carry"] = carry_;
    j["last_eog"] = last_eog_;
    j["last_eog_piece"] = last_eog_piece_;
    j["closed_text"] = closed_text_;
    for (const ChatMessage& m : messages_) j["messages"].push_back({{"role", m.role}, {"content", m.content}});
    return j;
  }

  void read_transcript(const nlohmann::json& j) {
    messages_.clear();
    for (const auto& m : j.value("messages", nlohmann::json::array()))
      messages_.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    state_ = static_cast<State>(j.value("state", 0));
    carry_ = j.value("carry", std::string());
    last_eog_ = j.value("last_eog", false);
    last_eog_piece_ = j.value("last_eog_piece", std::string());
    closed_text_ = j.value("closed_text", std::string());
  }

  void save_conversation() const {
    if (a_.model.cache_dir.empty()) return;
    write_json(transcript_json(), conversation_path());
  }

  static void write_json(const nlohmann::json& j, const std::string& path) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << j.dump();
      if (!f.flush()) {
        f.close();
        std::filesystem::remove(tmp);
        std::fprintf(stderr, "note: cannot save the conversation to %s (disk full?)\n", path.c_str());
        return;
      }
    }
    std::filesystem::rename(tmp, path);
  }

  void resume() {
    const std::string path = conversation_path();
    std::ifstream f(path);
    if (!f) throw Error("--resume: no saved conversation in " + a_.model.cache_dir + " (" + path + ")");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw Error(path + ": not a saved conversation (" + e.what() + ")");
    }
    if (j.value("model_fingerprint", uint64_t{0}) != engine_.model_fingerprint()) {
      throw Error(path + ": the conversation was held with another model; start a new one without --resume");
    }
    const std::vector<TokenId> toks = j.at("tokens").get<std::vector<TokenId>>();
    reset();
    if (!toks.empty()) {
      // The last token of an answer is pending in a live session: run the
      // rest (its KV read back from the cache files), keep that one pending.
      const Stopwatch sw;
      session_.feed(std::span<const TokenId>(toks).first(toks.size() - 1));
      session_.append_pending(toks.back());
      std::fprintf(stderr, "resumed %zu tokens in %.3f s: %lld from the cache directory, %lld recomputed\n",
                   toks.size(), sw.seconds(), static_cast<long long>(session_.reused_tokens()),
                   static_cast<long long>(session_.tokens_run()));
    }
    read_transcript(j);
  }

 private:
  // What the session ends with, which decides what the next turn appends.
  enum class State {
    kEmpty,       // nothing yet: the next turn renders the system message too
    kOpenAnswer,  // a generated answer (not closed unless it ended on an end-of-turn token)
    kClosed,      // a rendering that ends after a closed message (/shift)
  };

  // The text the next turn adds to the session for `user`.
  std::string delta_for(const std::string& user) const {
    std::vector<ChatMessage> msgs;
    if (!a_.system.empty()) msgs.push_back({"system", a_.system});
    if (state_ == State::kEmpty) {
      msgs.push_back({"user", user});
      return fmt_.render(msgs, true);
    }
    if (state_ == State::kClosed) {
      std::vector<ChatMessage> with = messages_;
      with.push_back({"user", user});
      const std::string full = fmt_.render(with, true);
      if (full.compare(0, closed_text_.size(), closed_text_) == 0) return full.substr(closed_text_.size());
      // Not a prefix (a template that rewrites earlier turns): the new
      // message rendered after a closed answer, as below.
    }
    // The text after an answer, found by rendering one with sentinel content:
    // the answer's close, the user's message and the new answer's header.
    // Earlier turns do not change it in any supported format.
    msgs.push_back({"user", "hi"});
    msgs.push_back({"assistant", kSentinel});
    msgs.push_back({"user", user});
    const std::string full = fmt_.render(msgs, true);
    const size_t at = full.rfind(kSentinel);
    EBB_CHECK_MSG(at != std::string::npos, "the chat template dropped the sentinel answer");
    std::string after = full.substr(at + std::string(kSentinel).size());
    if (state_ == State::kOpenAnswer && last_eog_) {
      // The answer ended on its end-of-turn token, which the session holds:
      // the close starts after it.
      const size_t p = after.find(last_eog_piece_);
      if (!last_eog_piece_.empty() && p != std::string::npos &&
          after.find_first_not_of(" \t\r\n") == p) {
        after.erase(0, p + last_eog_piece_.size());
      }
    }
    return carry_ + after;
  }

  std::vector<TokenId> turn_tokens(const std::string& user) const {
    EncodeOptions eo;
    const std::string text = delta_for(user);
    eo.add_bos = session_.tokens().empty() && engine_.tokenizer().add_bos_default() && !fmt_.writes_bos(text);
    eo.parse_special = true;
    return engine_.tokenizer().encode(text, eo);
  }

  void run_turn(const std::string& user) {
    std::vector<TokenId> toks = turn_tokens(user);
    // A turn whose message and answer would not fit shifts the context
    // first (keeping the system message and the latest turns).
    const int64_t room = std::min<int64_t>(max_tokens_, session_.n_ctx() / 4);
    if (state_ != State::kEmpty &&
        static_cast<int64_t>(session_.tokens().size() + toks.size()) + room >= session_.n_ctx() && shift(true)) {
      toks = turn_tokens(user);
    }
    const int64_t have = static_cast<int64_t>(session_.tokens().size());
    if (have + static_cast<int64_t>(toks.size()) >= session_.n_ctx()) {
      throw Error("the context is full: this turn needs " + std::to_string(toks.size()) + " tokens and " +
                  std::to_string(session_.n_ctx() - have) + " of " + std::to_string(session_.n_ctx()) +
                  " are left. /shift keeps the system message and the latest turns, /reset starts over, or restart "
                  "with a larger --ctx");
    }
    GenerateOptions go;
    go.max_tokens = max_tokens_;
    go.sampling = a_.sampling;
    go.stop_strings = fmt_.stop_strings();
    go.stop_strings.insert(go.stop_strings.end(), a_.stop.begin(), a_.stop.end());
    LineReader::clear_interrupt();
    const int64_t prompt_end = have + static_cast<int64_t>(toks.size());
    GenerateStats st;
    try {
      st = generate(session_, toks, go, [](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return !LineReader::interrupted();
      });
    } catch (const Error& e) {
      std::fputc('\n', stdout);
      std::fflush(stdout);
      throw Error("the answer failed at position " + std::to_string(session_.tokens().size()) + ": " + e.what());
    }
    std::fputc('\n', stdout);
    std::fflush(stdout);
    settle_answer(st, prompt_end);
    // Templates write "Assistant: {content}"-style headers with their own
    // separator, so the answer's leading space belongs to the header.
    std::string content = st.text;
    if (!content.empty() && content[0] == ' ') content.erase(0, 1);
    messages_.push_back({"user", user});
    messages_.push_back({"assistant", content});
    if (!a_.model.quiet) {
      std::fprintf(stderr, "[%s | context %zu/%lld]\n", summary_line(engine_, st).c_str(), session_.tokens().size(),
                   static_cast<long long>(session_.n_ctx()));
    }
    if (st.stop == StopReason::kCancelled) {
      std::fprintf(stderr, "[answer stopped; the conversation is kept. Ctrl-C at the prompt exits]\n");
    } else if (st.stop == StopReason::kContextFull) {
      std::fprintf(stderr,
                   "[the context is full (%lld tokens): /shift keeps the system message and the latest turns (the "
                   "next turn does so by itself), /reset starts over, or restart with a larger --ctx]\n",
                   static_cast<long long>(session_.n_ctx()));
    }
    LineReader::clear_interrupt();
  }

  // Makes the session end exactly in the answer as shown: an answer that a
  // stop string ended keeps only the tokens before the stop string (the
  // answer's text that straddles it is appended as text next turn).
  void settle_answer(const GenerateStats& st, int64_t prompt_end) {
    state_ = State::kOpenAnswer;
    carry_.clear();
    last_eog_ = st.stop == StopReason::kEndOfGeneration && !st.tokens.empty();
    last_eog_piece_ = last_eog_ ? engine_.tokenizer().token_to_piece(st.tokens.back(), true) : "";
    if (st.stop != StopReason::kStopString) return;
    std::string kept_text;
    int64_t keep = 0;
    for (TokenId t : st.tokens) {
      const std::string piece = engine_.tokenizer().token_to_piece(t, true);
      if (st.text.compare(kept_text.size(), piece.size(), piece) != 0 ||
          kept_text.size() + piece.size() > st.text.size())
        break;
      kept_text += piece;
      ++keep;
    }
    session_.truncate(prompt_end + keep);
    carry_ = st.text.substr(kept_text.size());
  }

  void rollback(int64_t n_before) {
    if (static_cast<int64_t>(session_.tokens().size()) > n_before) session_.truncate(n_before);
    LineReader::clear_interrupt();
  }

  Engine& engine_;
  ChatArgs& a_;
  Session session_;
  ResolvedChatTemplate template_;
  const ChatRenderer& fmt_;  // template_.renderer
  int64_t max_tokens_ = 0;
  std::vector<ChatMessage> messages_;  // the transcript as shown (for /shift)
  State state_ = State::kEmpty;
  std::string carry_;                  // answer text not in the session's tokens (kOpenAnswer)
  bool last_eog_ = false;              // the last answer ended on an end-of-turn token
  std::string last_eog_piece_;         // that token's text
  std::string closed_text_;            // kClosed: the rendering the session holds
};

// A slash command and its argument: "/evict 50%" -> ("/evict", "50%").
struct Command {
  std::string name;
  std::string arg;
};

Command parse_command(const std::string& line) {
  const std::string t = trim(line);
  const size_t sp = t.find_first_of(" \t");
  if (sp == std::string::npos) return {t, ""};
  return {t.substr(0, sp), trim(t.substr(sp))};
}

int chat(ChatArgs& a) {
  double load_s = 0;
  std::unique_ptr<Engine> engine = make_engine(a.model, &load_s);
  resolve_seed(a.sampling);
  Chat chat(*engine, a);
  if (a.resume) {
    if (a.model.cache_dir.empty()) throw UsageError("--resume needs --cache-dir (where the conversation was kept)");
    chat.resume();
  }
  LineReader input;
  const uint64_t max_line = static_cast<uint64_t>(context_of(a.model, *engine)) * kPromptBytesPerToken;
  input.set_max_line(max_line);
  if (a.keep != -2 && !a.model.quiet)
    std::fprintf(stderr, "note: --keep is ignored: a shift of the context always keeps the system message\n");
  if (!a.model.quiet) {
    std::fprintf(stderr, "ebb chat: %s (%s), loaded in %.2f s; %s; answers of %s tokens at most\n%s",
                 engine->config().name.c_str(), engine->config().arch_name.c_str(), load_s, chat.format_note().c_str(),
                 chat.answer_limit().c_str(), kHelp);
  }
  int failed = 0;
  std::string line;
  for (;;) {
    const LineReader::Status s = input.read("> ", line);
    if (s == LineReader::Status::kInterrupted) {
      // Ctrl-C at the prompt is how a person leaves: a clean exit.
      std::fputc('\n', stderr);
      return 0;
    }
    if (s == LineReader::Status::kEof) break;
    if (s == LineReader::Status::kTooLong) {
      // Input from a pipe or a file that is not lines of text (/dev/zero,
      // a binary file): stop rather than read it all.
      std::fprintf(stderr, "\nebb: error: an input line is longer than %s, more than the context holds (%lld "
                           "tokens); the chat stops\n",
                   format_bytes(max_line).c_str(), static_cast<long long>(context_of(a.model, *engine)));
      return 1;
    }
    if (trim(line).empty()) continue;
    try {
      if (line[0] == '/' && line.rfind("//", 0) != 0) {
        const Command c = parse_command(line);
        auto need_arg = [&](const char* what) {
          if (c.arg.empty()) throw Error(c.name + " needs " + what + " (see /help)");
        };
        if (c.name == "/quit" || c.name == "/exit") break;
        if (c.name == "/help") {
          std::fputs(kHelp, stderr);
        } else if (c.name == "/reset") {
          chat.reset();
          std::fprintf(stderr, "the conversation is forgotten\n");
        } else if (c.name == "/shift") {
          chat.shift();
        } else if (c.name == "/memory") {
          chat.memory();
        } else if (c.name == "/lora") {
          chat.lora(c.arg);
        } else if (c.name == "/evict") {
          need_arg("a size: /evict 50% or /evict 200MiB");
          chat.evict(c.arg);
        } else if (c.name == "/limit") {
          need_arg("a size or off: /limit 300MiB, /limit 40%, /limit off");
          chat.limit(c.arg);
        } else if (c.name == "/restore") {
          chat.restore();
        } else if (c.name == "/save") {
          need_arg("a file name: /save FILE");
          chat.save(c.arg);
        } else if (c.name == "/load") {
          need_arg("a file name: /load FILE");
          chat.load(c.arg);
        } else {
          std::fprintf(stderr, "unknown command '%s' (a message that starts with / is written //)\n%s",
                       c.name.c_str(), kHelp);
        }
      } else {
        if (!chat.turn(line[0] == '/' ? line.substr(1) : line)) ++failed;
        chat.save_conversation();
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "ebb: error: %s\n", e.what());
    }
  }
  // A script learns that some turn failed from the exit status.
  return failed > 0 ? 1 : 0;
}

}  // namespace

void add_chat_command(CLI::App& app, int* rc) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* sub = app.add_subcommand("chat", "Interactive chat that keeps the conversation's KV between turns");
  add_model_options(sub, a->model);
  sub->add_option("--system,--system-prompt", a->system, "System message (also spelled -sys)");
  sub->add_option("-n,--n-predict", a->n_predict,
                  "Tokens per answer at most (-1: until a stop or the context ends; default: a quarter of the "
                  "context, at most 512)");
  sub->add_option("-r,--reverse-prompt,--stop", a->stop, "End the answer before this string (repeatable)");
  add_chat_template_options(sub, a->chat_template);
  sub->add_flag("-q,--quiet", a->model.quiet, "No banner, load progress or statistics after each answer");
  sub->add_flag("--resume", a->resume,
                "Continue the last conversation kept in --cache-dir, its KV read back instead of recomputed");
  sub->add_option("--keep", a->keep,
                  "Accepted for llama.cpp and ignored: a shift of the context always keeps the system message")
      ->group(kEngineGroup);
  add_sampling_options(sub, a->sampling);
  sub->callback([a, rc] { *rc = chat(*a); });
}

}  // namespace ebb::cli
