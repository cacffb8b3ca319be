// ebb chat: an interactive conversation that keeps its KV between turns.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/options.h"
#include "model/chat_template.h"
#include "platform/error.h"

namespace ebb::cli {
namespace {

struct ChatArgs {
  ModelArgs model;
  SamplerOptions sampling;
  std::string system;
  int64_t n_predict = 512;
  std::string format;
};

constexpr const char* kHelp =
    "commands: /help, /reset (forget the conversation), /save FILE, /load FILE, /memory,\n"
    "          /evict SIZE|PCT (give memory back, e.g. /evict 50%), /restore,\n"
    "          /limit SIZE|PCT|off (cap memory: answers stream what does not fit), /quit\n";

class Chat {
 public:
  Chat(Engine& engine, const ChatArgs& a) : engine_(engine), a_(a), session_(engine, session_options(a.model)) {
    if (a.format.empty()) {
      fmt_ = detect_chat_format(engine.model().chat_template(), engine.config().arch_name);
    } else {
      auto f = parse_chat_format(a.format);
      if (!f) throw Error("--format '" + a.format + "' is not one of chatml, llama3, llama2, plain");
      fmt_ = *f;
    }
    reset();
  }

  void reset() {
    session_.clear();
    history_.clear();
    rendered_.clear();
    if (!a_.system.empty()) history_.push_back({"system", a_.system});
  }

  // One user turn: feed only what the conversation adds, stream the answer.
  void turn(const std::string& user) {
    history_.push_back({"user", user});
    const std::string full = apply_chat_template(fmt_, history_, true);
    // The session holds the rendering of everything before this turn, so
    // only the new suffix is tokenized and run.
    // Templates may trim the stored answer, so the session's text can end in
    // whitespace the new rendering lacks; that tail is harmless to keep.
    size_t common = 0;
    while (common < rendered_.size() && common < full.size() && rendered_[common] == full[common]) ++common;
    const bool tail_is_space = rendered_.find_first_not_of(" \t\n", common) == std::string::npos;
    std::string delta = full;
    if (tail_is_space) {
      delta = full.substr(common);
    } else {
      session_.clear();  // the template re-rendered earlier text: start again
    }
    EncodeOptions eo;
    eo.add_bos = session_.tokens().empty() && engine_.tokenizer().add_bos_default();
    eo.parse_special = true;
    const std::vector<TokenId> toks = engine_.tokenizer().encode(delta, eo);
    GenerateOptions go;
    go.max_tokens = a_.n_predict;
    go.sampling = a_.sampling;
    go.stop_strings = chat_stop_strings(fmt_);
    const GenerateStats st = generate(session_, toks, go, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputc('\n', stdout);
    // Templates write "Assistant: {content}"-style headers with their own
    // separator, so the answer's leading space belongs to the header.
    std::string content = st.text;
    if (!content.empty() && content[0] == ' ') content.erase(0, 1);
    history_.push_back({"assistant", content});
    // What the session now holds, as text: the rendered prompt plus every
    // generated token, end marker included (it is pending in the session).
    rendered_ = full;
    for (TokenId t : st.tokens) rendered_ += engine_.tokenizer().token_to_piece(t, true);
    std::fprintf(stderr, "[%s]\n", summary_line(engine_, st).c_str());
  }

  void memory() const {
    const Footprint f = engine_.footprint();
    std::fprintf(stderr, "context %zu/%lld tokens | weights %s | kv %s | scratch %s | total %s\n",
                 session_.tokens().size(), static_cast<long long>(session_.n_ctx()),
                 format_bytes(f.weights() + f.globals).c_str(), format_bytes(f.kv()).c_str(),
                 format_bytes(f.scratch).c_str(), format_bytes(f.total()).c_str());
    if (ElasticMemory* em = engine_.elastic()) {
      std::fprintf(stderr, "in RAM: weights %s, kv %s, compressed %s | on storage: weights %s (the model file), kv %s\n",
                   format_bytes(f.weights()).c_str(), format_bytes(f.kv()).c_str(), format_bytes(f.compressed).c_str(),
                   format_bytes(f.weights_stored).c_str(), format_bytes(f.kv_stored).c_str());
      std::fprintf(stderr, "layer W |KV chunks|   W resident, . dropped;  # resident, c compressed, s stored, z stored compressed\n%s",
                   em->residency().grid().c_str());
    }
  }

  // `/evict 50%` or `/evict 200MiB`: percent of what can be evicted (layer
  // weights and KV in RAM).
  void evict(const std::string& arg) {
    const Footprint f = engine_.footprint();
    const uint64_t evictable = f.weights() + f.kv();
    const uint64_t bytes = parse_size(arg, evictable);
    const EvictReport r = engine_.evict(bytes);
    std::fprintf(stderr,
                 "evicted %s of %s asked in %.1f ms (stage %s): %lld KV chunks compressed, %lld to storage, "
                 "%lld weight layers dropped, %lld compressed chunks to storage; in RAM now %s\n",
                 format_bytes(r.freed).c_str(), format_bytes(bytes).c_str(), r.seconds * 1e3,
                 std::string(evict_stage_name(r.last_stage)).c_str(), static_cast<long long>(r.kv_to_compressed),
                 static_cast<long long>(r.kv_to_storage), static_cast<long long>(r.weights_dropped),
                 static_cast<long long>(r.compressed_to_storage), format_bytes(r.after.in_ram()).c_str());
    if (!r.note.empty()) std::fprintf(stderr, "note: %s\n", r.note.c_str());
  }

  void limit(const std::string& arg) {
    const Footprint f = engine_.footprint();
    const uint64_t bytes = arg == "off" ? 0 : parse_size(arg, f.weights() + f.weights_stored + f.kv());
    const EvictReport r = engine_.set_memory_limit(bytes);
    if (bytes == 0) {
      std::fprintf(stderr, "no memory limit: the next answer restores everything\n");
    } else {
      std::fprintf(stderr, "memory limit %s: gave back %s now; answers stream the weight layers that do not fit\n",
                   format_bytes(bytes).c_str(), format_bytes(r.freed).c_str());
    }
  }

  void restore() {
    const RestoreReport r = engine_.restore();
    std::fprintf(stderr, "restored in %.1f ms: %lld weight layers, %lld chunks read, %lld decompressed, %s from storage\n",
                 r.seconds * 1e3, static_cast<long long>(r.weights_loaded), static_cast<long long>(r.chunks_read),
                 static_cast<long long>(r.chunks_decompressed), format_bytes(r.bytes_read).c_str());
    if (r.chunks_lost > 0)
      std::fprintf(stderr, "%lld KV chunks failed their checksum; they are recomputed on the next turn\n",
                   static_cast<long long>(r.chunks_lost));
  }

  Session& session() { return session_; }

 private:
  Engine& engine_;
  const ChatArgs& a_;
  Session session_;
  ChatFormat fmt_;
  std::vector<ChatMessage> history_;
  std::string rendered_;
};

int chat(ChatArgs& a) {
  std::unique_ptr<Engine> engine = make_engine(a.model);
  Chat chat(*engine, a);
  std::fprintf(stderr, "ebb chat: %s (%s). %s", engine->config().name.c_str(), engine->config().arch_name.c_str(),
               kHelp);
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    try {
      if (line == "/quit" || line == "/exit") break;
      if (line == "/help") {
        std::fputs(kHelp, stderr);
      } else if (line == "/reset") {
        chat.reset();
      } else if (line == "/memory") {
        chat.memory();
      } else if (line.rfind("/evict ", 0) == 0) {
        chat.evict(line.substr(7));
      } else if (line.rfind("/limit ", 0) == 0) {
        chat.limit(line.substr(7));
      } else if (line == "/restore") {
        chat.restore();
      } else if (line.rfind("/save ", 0) == 0) {
        chat.session().save(line.substr(6));
        std::fprintf(stderr, "saved %zu tokens\n", chat.session().tokens().size());
      } else if (line.rfind("/load ", 0) == 0) {
        chat.session().load(line.substr(6));
        std::fprintf(stderr, "loaded %zu tokens (the transcript is not restored, only the model's state)\n",
                     chat.session().tokens().size());
      } else {
        chat.turn(line);
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "ebb: error: %s\n", e.what());
    }
  }
  return 0;
}

}  // namespace

void add_chat_command(CLI::App& app, int* rc) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* sub = app.add_subcommand("chat", "Interactive chat that keeps the conversation's KV between turns");
  add_model_options(sub, a->model);
  sub->add_option("--system", a->system, "System message");
  sub->add_option("-n,--n-predict", a->n_predict, "Tokens per answer at most")->capture_default_str();
  sub->add_option("--format", a->format, "Chat format: chatml, llama3, llama2, plain (default: from the model)");
  add_sampling_options(sub, a->sampling);
  sub->callback([a, rc] { *rc = chat(*a); });
}

}  // namespace ebb::cli
