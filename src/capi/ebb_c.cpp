// The C API (include/ebb/ebb.h) over the C++ runtime: Engine, Session,
// generate(), the sampler's options and the tokenizer.
//
// Every exported function runs its body through guarded(), which turns each
// exception into a status and the thread's last-error message, so no C++
// exception crosses the boundary. Bad input the C API can see (NULL, a
// struct not made by its default, an option out of range, a missing file, a
// context overflow) is checked here first, so its status is exact; what the
// runtime throws after that gets the status the call names as its default
// (EBB_ERR_MODEL while loading, EBB_ERR_FAILED elsewhere).
#include "ebb/ebb.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "memory/residency.h"
#include "model/chat_parse.h"
#include "model/chat_renderer.h"
#include "platform/error.h"
#include "runtime/grammar/constraint.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_trie.h"
#include "runtime/grammar/tool_grammar.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"

#ifndef EBB_VERSION_STRING
#error "EBB_VERSION_STRING must be defined by the build"
#endif

struct ebb_engine {
  std::unique_ptr<ebb::Engine> engine;
  // Serializes every call on the engine and its sessions. Recursive, so a
  // text callback may call the read-only functions on its own thread.
  std::recursive_mutex mu;
  int n_sessions = 0;
  bool in_callback = false;  // a generate's text callback is running (on the lock's owner)
  std::string arch, name, isa;
  // Chat: the renderer (the model's template, or ebb_engine_set_chat_template's),
  // made at the first use; the vocabulary trie constraints walk, likewise.
  std::unique_ptr<ebb::ChatRenderer> renderer;
  std::shared_ptr<const ebb::grammar::TokenTrie> trie;
};

struct ebb_constraint {
  ebb_engine* owner = nullptr;
  // A constraint at its start, its DFA warmed by the generations so far;
  // each generation runs on a copy (under the owner's lock).
  std::unique_ptr<ebb::grammar::GrammarConstraint> prototype;
};

// What an ebb_chat_result points into. The result handed out is the first
// member of a standard-layout block, so ebb_chat_result_free gets the block
// back from it.
struct ChatResultData {
  std::string content, reasoning, text;
  std::vector<ebb::ToolCall> calls;
  std::vector<ebb_tool_call> c_calls;
};
struct ebb_chat_result_owned {
  ebb_chat_result c{};
  ChatResultData* data = nullptr;  // owned
};
static_assert(std::is_standard_layout_v<ebb_chat_result_owned>);

struct ebb_session {
  ebb_engine* owner = nullptr;
  std::unique_ptr<ebb::Session> session;
  // The session's logits belong to its last token: true after a feed ran
  // everything, false after a generate (its last token is pending), a
  // truncate or a load.
  bool logits_valid = false;
};

namespace {

thread_local std::string t_last_error;

// A status with its message, thrown inside guarded() bodies.
struct Failure {
  ebb_status status;
  std::string message;
};

[[noreturn]] void fail(ebb_status s, std::string msg) { throw Failure{s, std::move(msg)}; }

// Records "fn: kind what" as the thread's last error. Never throws: when even the
// message cannot be allocated, the status alone is returned.
ebb_status record(ebb_status s, const char* fn, std::string_view what, std::string_view kind = {}) noexcept {
  try {
    t_last_error.assign(fn).append(": ").append(kind).append(what);
  } catch (...) {
    t_last_error.clear();
  }
  return s;
}

// Runs body(); maps every exception to a status. `on_ebb_error` is the
// status of an ebb::Error the body did not classify itself.
template <typename Body>
ebb_status guarded(const char* fn, ebb_status on_ebb_error, Body&& body) noexcept {
  try {
    body();
    return EBB_OK;
  } catch (const Failure& f) {
    return record(f.status, fn, f.message);
  } catch (const ebb::Error& e) {
    // The allocator reports a failed allocation as an ebb::Error whose
    // message starts so (platform/allocator.cpp).
    const std::string_view what = e.what();
    return record(what.starts_with("out of memory") ? EBB_ERR_OUT_OF_MEMORY : on_ebb_error, fn, what);
  } catch (const std::bad_alloc&) {
    return record(EBB_ERR_OUT_OF_MEMORY, fn, "out of memory");
  } catch (const std::system_error& e) {
    return record(EBB_ERR_FAILED, fn, e.what(), "system error: ");
  } catch (const std::exception& e) {
    return record(EBB_ERR_INTERNAL, fn, e.what(), "unexpected error: ");
  } catch (...) {
    return record(EBB_ERR_INTERNAL, fn, "unexpected error of unknown type");
  }
}

template <typename T>
void need(const T* p, const char* what) {
  if (!p) fail(EBB_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

template <typename Opts>
void need_options(const Opts* o, const char* what, const char* init) {
  need(o, what);
  if (o->struct_size != sizeof(Opts)) {
    fail(EBB_ERR_INVALID_ARGUMENT, std::string(what) + ".struct_size is " + std::to_string(o->struct_size) +
                                       ", not " + std::to_string(sizeof(Opts)) + ": initialise it with " + init +
                                       "() (and build against this library's ebb.h)");
  }
}

// An options struct that gained fields at its end: its current size, or
// `earlier` (the size before them) from a caller built against an earlier
// ebb.h, whose bytes are copied over the defaults.
template <typename Opts>
Opts read_options(const Opts* o, size_t earlier, const char* what, const char* init, Opts defaults) {
  need(o, what);
  if (o->struct_size == sizeof(Opts)) return *o;
  if (o->struct_size != earlier) {
    fail(EBB_ERR_INVALID_ARGUMENT, std::string(what) + ".struct_size is " + std::to_string(o->struct_size) +
                                       ", not " + std::to_string(sizeof(Opts)) + " (or an earlier header's " +
                                       std::to_string(earlier) + "): initialise it with " + init + "()");
  }
  std::memcpy(&defaults, o, earlier);
  defaults.struct_size = sizeof(Opts);
  return defaults;
}

void check_range(bool ok, const std::string& what) {
  if (!ok) fail(EBB_ERR_INVALID_ARGUMENT, what);
}

// Refuses calls that change the engine or a session from inside a text
// callback (the lock is recursive, so they would reach the runtime midway
// through a generation).
void need_not_in_callback(const ebb_engine* e) {
  if (e->in_callback) {
    fail(EBB_ERR_BUSY, "not allowed from inside a text callback (generation is running on this engine)");
  }
}

void check_tokens(const ebb::Engine& e, const ebb_token* tokens, size_t n, const char* what) {
  if (n > 0) need(tokens, what);
  const int64_t n_vocab = e.config().n_vocab;
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab) {
      fail(EBB_ERR_INVALID_ARGUMENT, std::string(what) + "[" + std::to_string(i) + "] = " +
                                         std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                                         std::to_string(n_vocab) + ")");
    }
  }
}

void check_context(const ebb::Session& s, size_t n_new) {
  const uint64_t total = s.tokens().size() + n_new;
  if (total > static_cast<uint64_t>(s.n_ctx())) {
    fail(EBB_ERR_CONTEXT_FULL, "context full: " + std::to_string(total) + " tokens needed, the session's context holds " +
                                   std::to_string(s.n_ctx()) + " (raise ebb_session_options.n_ctx)");
  }
}

// A file the caller names must exist and be a readable regular file.
void check_readable_file(const char* path, const char* what) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) {
    fail(EBB_ERR_IO, std::string(what) + " '" + path + "' cannot be opened: " +
                         (ec ? ec.message() : std::string("no such file")));
  }
  if (std::filesystem::is_directory(st)) fail(EBB_ERR_IO, std::string(what) + " '" + path + "' is a directory");
  if (std::FILE* f = std::fopen(path, "rb")) {
    std::fclose(f);
  } else {
    fail(EBB_ERR_IO, std::string(what) + " '" + path + "' cannot be opened: " + std::strerror(errno));
  }
}

// Writes `items` into a caller's buffer, or the count needed.
template <typename T>
void write_out(const std::vector<T>& items, T* buf, size_t capacity, size_t* n_out) {
  *n_out = items.size();
  if (items.size() > capacity) {
    fail(EBB_ERR_BUFFER_TOO_SMALL,
         std::to_string(items.size()) + " items needed, the buffer holds " + std::to_string(capacity));
  }
  if (!items.empty()) std::memcpy(buf, items.data(), items.size() * sizeof(T));
}

ebb_unit_state to_c(ebb::UnitState s) {
  switch (s) {
    case ebb::UnitState::kResident: return EBB_UNIT_RESIDENT;
    case ebb::UnitState::kCompressed: return EBB_UNIT_COMPRESSED;
    case ebb::UnitState::kStored: return EBB_UNIT_STORED;
    case ebb::UnitState::kStoredCompressed: return EBB_UNIT_STORED_COMPRESSED;
    case ebb::UnitState::kLost: return EBB_UNIT_LOST;
  }
  return EBB_UNIT_LOST;
}

ebb_stop_reason to_c(ebb::StopReason r) {
  switch (r) {
    case ebb::StopReason::kMaxTokens: return EBB_STOP_MAX_TOKENS;
    case ebb::StopReason::kEndOfGeneration: return EBB_STOP_END_OF_GENERATION;
    case ebb::StopReason::kStopString: return EBB_STOP_STOP_STRING;
    case ebb::StopReason::kContextFull: return EBB_STOP_CONTEXT_FULL;
    case ebb::StopReason::kCancelled: return EBB_STOP_CANCELLED;
  }
  return EBB_STOP_MAX_TOKENS;
}

ebb_evict_result to_c(const ebb::EvictReport& r) {
  ebb_evict_result out{};
  out.requested = r.requested;
  out.freed = r.freed;
  out.kv_chunks_compressed = r.kv_to_compressed;
  out.kv_chunks_stored = r.kv_to_storage;
  out.weight_layers_dropped = r.weights_dropped;
  out.seconds = r.seconds;
  return out;
}

ebb::SamplerOptions to_cpp(const ebb_sampling_options& s) {
  ebb::SamplerOptions o;
  o.temperature = s.temperature;
  o.top_k = s.top_k;
  o.top_p = s.top_p;
  o.min_p = s.min_p;
  o.repeat_penalty = s.repeat_penalty;
  o.frequency_penalty = s.frequency_penalty;
  o.presence_penalty = s.presence_penalty;
  o.penalty_last_n = s.penalty_last_n;
  o.seed = s.seed;
  return o;
}

// The snapshot behind an ebb_residency: the public struct points into it.
struct ResidencySnapshot : ebb_residency {
  std::vector<ebb_unit_state> weight_states;          // [n_layer]
  std::vector<int32_t> chunk_counts;                  // [n_layer]
  std::vector<std::vector<ebb_unit_state>> chunk_states;  // [n_layer][chunks]
  std::vector<const ebb_unit_state*> chunk_rows;      // [n_layer]
  std::string grid_text;
};

// Holds the engine's lock and marks a generation's callback window.
class CallbackScope {
 public:
  explicit CallbackScope(ebb_engine* e) : e_(e) { e_->in_callback = true; }
  ~CallbackScope() { e_->in_callback = false; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

 private:
  ebb_engine* e_;
};

// The C++ options of an ebb_generate_options (validated; a seed of 0 drawn).
ebb::GenerateOptions to_cpp(const ebb_generate_options* options) {
  need_options(options, "options", "ebb_generate_options_default");
  need_options(&options->sampling, "options.sampling", "ebb_sampling_options_default");
  const ebb_generate_options& o = *options;
  check_range(o.max_tokens >= 0, "options.max_tokens = " + std::to_string(o.max_tokens) + " is negative");
  if (o.n_stop_strings > 0) need(o.stop_strings, "options.stop_strings");
  ebb::GenerateOptions go;
  go.max_tokens = o.max_tokens;
  go.sampling = to_cpp(o.sampling);
  try {
    go.sampling.validate();
  } catch (const ebb::Error& e) {
    fail(EBB_ERR_INVALID_ARGUMENT, std::string("options.sampling: ") + e.what());
  }
  // A seed of 0 is drawn here rather than in the sampler, so the caller
  // learns it and can repeat the run.
  while (go.sampling.seed == 0) {
    std::random_device rd;
    go.sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  for (size_t i = 0; i < o.n_stop_strings; ++i) {
    if (!o.stop_strings[i]) fail(EBB_ERR_INVALID_ARGUMENT, "options.stop_strings[" + std::to_string(i) + "] is NULL");
    go.stop_strings.emplace_back(o.stop_strings[i]);
  }
  go.stop_at_eog = o.stop_at_eog != 0;
  return go;
}

// Runs one generation on the session (the owner's lock held by the
// caller); `text`, when not null, collects the generated text.
void run_generation(ebb_session* session, const ebb_token* prompt, size_t n_prompt, const ebb::GenerateOptions& go,
                    ebb_text_callback on_text, void* user_data, ebb_generate_result* result, std::string* text) {
  ebb_engine* owner = session->owner;
  need_not_in_callback(owner);
  check_tokens(*owner->engine, prompt, n_prompt, "prompt");
  check_context(*session->session, n_prompt);
  if (session->session->tokens().empty() && n_prompt == 0) {
    fail(EBB_ERR_INVALID_ARGUMENT, "nothing to continue: the session is empty and the prompt has no tokens");
  }
  ebb::TextFn text_fn;
  if (on_text || text) {
    text_fn = [&](std::string_view t) {
      if (text) text->append(t);
      return !on_text || on_text(t.data(), t.size(), user_data) == 0;
    };
  }
  ebb::GenerateStats st;
  session->logits_valid = false;
  {
    const CallbackScope scope(owner);
    st = ebb::generate(*session->session, std::span<const ebb::TokenId>(prompt, n_prompt), go, text_fn);
  }
  if (result) {
    ebb_generate_result r{};
    r.stop = to_c(st.stop);
    r.prompt_tokens = st.prompt_tokens;
    r.generated_tokens = st.generated_tokens;
    r.prefill_seconds = st.prefill_seconds;
    r.decode_seconds = st.decode_seconds;
    r.ttft_seconds = st.ttft_seconds;
    r.seed = go.sampling.seed;
    *result = r;
  }
}

// The engine's vocabulary trie (built at the first use; lock held).
std::shared_ptr<const ebb::grammar::TokenTrie> trie_of(ebb_engine* e) {
  if (!e->trie) e->trie = ebb::grammar::TokenTrie::from_tokenizer(e->engine->tokenizer());
  return e->trie;
}

// The engine's chat renderer (lock held).
const ebb::ChatRenderer& renderer_of(ebb_engine* e) {
  if (!e->renderer) {
    e->renderer = std::make_unique<ebb::ChatRenderer>(ebb::ChatRenderer::for_model(
        e->engine->model().chat_template(), e->engine->config().arch_name, e->engine->tokenizer(), nullptr));
  }
  return *e->renderer;
}

// A fresh constraint for one generation (null for none; lock held).
std::shared_ptr<ebb::grammar::GrammarConstraint> constraint_copy(const ebb_constraint* c, const ebb_engine* owner) {
  if (!c) return nullptr;
  if (c->owner != owner) fail(EBB_ERR_INVALID_ARGUMENT, "the constraint was made for another engine");
  return std::make_shared<ebb::grammar::GrammarConstraint>(c->prototype->copy());
}

// JSON text of an argument; EBB_ERR_INVALID_ARGUMENT naming it when it is not.
nlohmann::ordered_json parse_json_arg(const char* text, const char* what) {
  need(text, what);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(EBB_ERR_INVALID_ARGUMENT, std::string(what) + " is not valid JSON: " + e.what());
  }
}

// Messages as templates take them: tool-call arguments given as JSON text
// parsed into objects; an assistant message that only made calls gets
// content "" rather than null (templates test `'x' in message.content`).
nlohmann::ordered_json template_messages(nlohmann::ordered_json m) {
  if (!m.is_array()) fail(EBB_ERR_INVALID_ARGUMENT, "messages_json must be a JSON array of messages");
  for (auto& x : m) {
    if (!x.is_object() || !x.contains("role") || !x["role"].is_string())
      fail(EBB_ERR_INVALID_ARGUMENT, "each message must be an object with a string \"role\"");
    if (x.contains("content") && x["content"].is_null()) x["content"] = "";
    if (!x.contains("content")) x["content"] = "";
    if (x.contains("tool_calls") && x["tool_calls"].is_array()) {
      for (auto& c : x["tool_calls"]) {
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
        auto& f = c["function"];
        if (f.contains("arguments") && f["arguments"].is_string()) {
          try {
            f["arguments"] = nlohmann::ordered_json::parse(f["arguments"].get<std::string>());
          } catch (const nlohmann::json::exception&) {
            // Not JSON: the template gets the text as it is.
          }
        }
      }
    }
  }
  return m;
}

std::string render_chat(ebb_engine* e, const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                        bool add_generation_prompt) {
  try {
    return renderer_of(e).render(template_messages(messages), tools, add_generation_prompt);
  } catch (const ebb::Error& err) {
    fail(EBB_ERR_INVALID_ARGUMENT, std::string("the chat template cannot render these messages: ") + err.what());
  }
}

ebb_constraint* make_constraint(ebb_engine* e, const std::string& gbnf, ebb::grammar::ConstraintOptions co = {}) {
  std::shared_ptr<const ebb::grammar::Grammar> g;
  try {
    g = ebb::grammar::Grammar::parse(gbnf);
  } catch (const ebb::Error& err) {
    fail(EBB_ERR_INVALID_ARGUMENT, err.what());
  }
  auto c = std::make_unique<ebb_constraint>();
  c->owner = e;
  c->prototype = std::make_unique<ebb::grammar::GrammarConstraint>(std::move(g), trie_of(e), std::move(co));
  return c.release();
}

}  // namespace

extern "C" {

const char* ebb_status_name(ebb_status status) {
  switch (status) {
    case EBB_OK: return "ok";
    case EBB_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case EBB_ERR_IO: return "io";
    case EBB_ERR_MODEL: return "model";
    case EBB_ERR_CONTEXT_FULL: return "context_full";
    case EBB_ERR_OUT_OF_MEMORY: return "out_of_memory";
    case EBB_ERR_BUFFER_TOO_SMALL: return "buffer_too_small";
    case EBB_ERR_BUSY: return "busy";
    case EBB_ERR_FAILED: return "failed";
    case EBB_ERR_INTERNAL: return "internal";
  }
  return "unknown";
}

const char* ebb_stop_reason_name(ebb_stop_reason reason) {
  switch (reason) {
    case EBB_STOP_MAX_TOKENS: return "max_tokens";
    case EBB_STOP_END_OF_GENERATION: return "end_of_generation";
    case EBB_STOP_STOP_STRING: return "stop_string";
    case EBB_STOP_CONTEXT_FULL: return "context_full";
    case EBB_STOP_CANCELLED: return "cancelled";
  }
  return "unknown";
}

const char* ebb_last_error(void) { return t_last_error.c_str(); }

const char* ebb_version(void) { return EBB_VERSION_STRING; }

// ---- engine ----------------------------------------------------------------

ebb_engine_options ebb_engine_options_default(void) {
  const ebb::EngineOptions d;
  ebb_engine_options o{};
  o.struct_size = sizeof(o);
  o.model_path = nullptr;
  o.n_threads = d.n_threads;
  o.kv_chunk_size = d.kv_chunk_size;
  o.prefill_batch = d.prefill_batch;
  o.memory_limit = 0;
  o.swap_dir = nullptr;
  o.profile_path = nullptr;
  o.device = nullptr;
  o.n_gpu_layers = d.n_gpu_layers;
  return o;
}

namespace {

// options.device and n_gpu_layers to the engine's device, checked: the
// syntax and contradictions are EBB_ERR_INVALID_ARGUMENT, a device that is
// not here EBB_ERR_FAILED naming it and what was found.
std::string engine_device(const ebb_engine_options& o) {
  check_range(o.n_gpu_layers >= -1, "options.n_gpu_layers = " + std::to_string(o.n_gpu_layers) +
                                        " is below -1 (-1: all layers on the device; 0: the CPU)");
  std::string dev = o.device ? o.device : (o.n_gpu_layers > 0 ? "vulkan" : "cpu");
  if (dev.empty()) dev = "cpu";
  int index = 0;
  if (dev == "cpu") {
    check_range(o.n_gpu_layers <= 0, "options.n_gpu_layers = " + std::to_string(o.n_gpu_layers) +
                                         " puts layers on a GPU, but options.device is \"cpu\"");
    return dev;
  }
  const std::string digits = dev.rfind("vulkan:", 0) == 0 ? dev.substr(7) : "";
  const bool numbered = !digits.empty() && digits.size() <= 4 &&
                        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  check_range(dev == "vulkan" || numbered,
              "options.device = \"" + dev + "\" is not one of \"cpu\", \"vulkan\", \"vulkan:N\"");
  if (numbered) index = std::stoi(digits);
  check_range(o.n_gpu_layers != 0, "options.n_gpu_layers = 0 puts no layer on the device, but options.device is \"" +
                                       dev + "\"");
  std::string why;
  const std::vector<ebb::DeviceInfo> devs = ebb::list_gpu_devices(&why);
  if (index >= static_cast<int>(devs.size())) {
    fail(EBB_ERR_FAILED, "options.device = \"" + dev + "\": no such device (" + std::to_string(devs.size()) +
                             " Vulkan device" + (devs.size() == 1 ? "" : "s") + " found" +
                             (why.empty() ? "" : ": " + why) + ")");
  }
  return dev;
}

}  // namespace

ebb_status ebb_engine_load(const ebb_engine_options* options, ebb_engine** out) {
  return guarded("ebb_engine_load", EBB_ERR_MODEL, [&] {
    need(out, "out");
    *out = nullptr;
    const ebb_engine_options o = read_options(options, offsetof(ebb_engine_options, device), "options",
                                              "ebb_engine_options_default", ebb_engine_options_default());
    if (!o.model_path) fail(EBB_ERR_INVALID_ARGUMENT, "options.model_path is NULL");
    check_range(o.n_threads >= 0, "options.n_threads = " + std::to_string(o.n_threads) + " is negative (0: all hardware threads)");
    check_range(o.kv_chunk_size >= 0 && o.kv_chunk_size <= (1 << 20),
                "options.kv_chunk_size = " + std::to_string(o.kv_chunk_size) +
                    " is outside [0, 1048576] (0: sized from each session's context)");
    check_range(o.prefill_batch >= 1 && o.prefill_batch <= (1 << 20),
                "options.prefill_batch = " + std::to_string(o.prefill_batch) + " is outside [1, 1048576]");
    check_readable_file(o.model_path, "model file");
    const std::string device = engine_device(o);

    ebb::EngineOptions eo;
    eo.device = device;
    eo.n_gpu_layers = o.n_gpu_layers;
    eo.model_path = o.model_path;
    eo.n_threads = o.n_threads;
    eo.kv_chunk_size = o.kv_chunk_size;
    eo.prefill_batch = o.prefill_batch;
    if (o.swap_dir) eo.elastic_opts.swap_dir = o.swap_dir;
    if (o.profile_path) {
      check_readable_file(o.profile_path, "device profile");
      try {
        eo.elastic_opts.profile = ebb::DeviceProfile::load(o.profile_path);
      } catch (const ebb::Error& e) {
        fail(EBB_ERR_INVALID_ARGUMENT, std::string("options.profile_path: ") + e.what());
      }
    }
    auto h = std::make_unique<ebb_engine>();
    h->engine = std::make_unique<ebb::Engine>(eo);
    const ebb::ModelConfig& c = h->engine->config();
    h->arch = c.arch_name;
    h->name = c.name;
    h->isa = std::string(ebb::isa_name(h->engine->isa()));
    if (o.memory_limit > 0) {
      try {
        h->engine->set_memory_limit(o.memory_limit);
      } catch (const ebb::Error& e) {
        fail(EBB_ERR_FAILED, std::string("options.memory_limit: ") + e.what());
      }
    }
    *out = h.release();
  });
}

ebb_status ebb_engine_free(ebb_engine* engine) {
  if (!engine) return EBB_OK;
  return guarded("ebb_engine_free", EBB_ERR_FAILED, [&] {
    {
      std::lock_guard lock(engine->mu);
      need_not_in_callback(engine);
      if (engine->n_sessions > 0) {
        fail(EBB_ERR_BUSY, std::to_string(engine->n_sessions) +
                               " session(s) of this engine are still alive: free them first (ebb_session_free)");
      }
    }
    delete engine;
  });
}

ebb_status ebb_engine_info(ebb_engine* engine, ebb_model_info* out) {
  return guarded("ebb_engine_info", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    need(out, "out");
    std::lock_guard lock(engine->mu);
    const ebb::Engine& e = *engine->engine;
    const ebb::ModelConfig& c = e.config();
    const ebb::Tokenizer& t = e.tokenizer();
    ebb_model_info info{};
    info.architecture = engine->arch.c_str();
    info.name = engine->name.c_str();
    info.n_vocab = static_cast<int32_t>(c.n_vocab);
    info.n_layer = static_cast<int32_t>(c.n_layer);
    info.n_embd = c.n_embd;
    info.n_ctx_train = c.n_ctx_train;
    info.bos = t.bos();
    info.eos = t.eos();
    info.eot = t.eot();
    info.n_threads = static_cast<int32_t>(engine->engine->pool().size());
    info.kernel_target = engine->isa.c_str();
    *out = info;
  });
}

// ---- tokens ----------------------------------------------------------------

ebb_status ebb_tokenize(ebb_engine* engine, const char* text, size_t len, int add_bos, int parse_special,
                        ebb_token* tokens, size_t capacity, size_t* n_tokens) {
  return guarded("ebb_tokenize", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    need(n_tokens, "n_tokens");
    if (len > 0) need(text, "text");
    if (capacity > 0) need(tokens, "tokens");
    std::lock_guard lock(engine->mu);
    ebb::EncodeOptions eo;
    eo.add_bos = add_bos != 0;
    eo.parse_special = parse_special != 0;
    const std::vector<ebb::TokenId> ids =
        engine->engine->tokenizer().encode(std::string_view(len > 0 ? text : "", len), eo);
    write_out(ids, tokens, capacity, n_tokens);
  });
}

ebb_status ebb_detokenize(ebb_engine* engine, const ebb_token* tokens, size_t n_tokens, int special, char* text,
                          size_t capacity, size_t* n_bytes) {
  return guarded("ebb_detokenize", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    need(n_bytes, "n_bytes");
    if (capacity > 0) need(text, "text");
    std::lock_guard lock(engine->mu);
    check_tokens(*engine->engine, tokens, n_tokens, "tokens");
    const std::string s =
        engine->engine->tokenizer().decode(std::span<const ebb::TokenId>(tokens, n_tokens), special != 0);
    *n_bytes = s.size();
    if (s.size() + 1 > capacity) {
      fail(EBB_ERR_BUFFER_TOO_SMALL, std::to_string(s.size() + 1) + " bytes needed (text and NUL), the buffer holds " +
                                         std::to_string(capacity));
    }
    std::memcpy(text, s.data(), s.size());
    text[s.size()] = '\0';
  });
}

// ---- sessions --------------------------------------------------------------

ebb_session_options ebb_session_options_default(void) {
  ebb_session_options o{};
  o.struct_size = sizeof(o);
  o.n_ctx = 0;
  o.kv_chunk_size = 0;
  o.kv_type = EBB_KV_F16;
  return o;
}

ebb_status ebb_session_create(ebb_engine* engine, const ebb_session_options* options, ebb_session** out) {
  return guarded("ebb_session_create", EBB_ERR_FAILED, [&] {
    need(out, "out");
    *out = nullptr;
    need(engine, "engine");
    need_options(options, "options", "ebb_session_options_default");
    const ebb_session_options& o = *options;
    check_range(o.n_ctx >= 0 && o.n_ctx <= (int64_t{1} << 31),
                "options.n_ctx = " + std::to_string(o.n_ctx) + " is outside [0, 2^31] (0: the model's, at most 4096)");
    check_range(o.kv_chunk_size >= 0 && o.kv_chunk_size <= (1 << 20),
                "options.kv_chunk_size = " + std::to_string(o.kv_chunk_size) + " is outside [0, 1048576] (0: the engine's)");
    check_range(o.kv_type == EBB_KV_F16 || o.kv_type == EBB_KV_F32,
                "options.kv_type = " + std::to_string(static_cast<int>(o.kv_type)) + " is not EBB_KV_F16 or EBB_KV_F32");
    std::lock_guard lock(engine->mu);
    need_not_in_callback(engine);
    ebb::SessionOptions so;
    so.n_ctx = o.n_ctx;
    so.kv_chunk_size = o.kv_chunk_size;
    so.kv_type = o.kv_type == EBB_KV_F32 ? ebb::DType::kF32 : ebb::DType::kF16;
    auto h = std::make_unique<ebb_session>();
    h->owner = engine;
    h->session = std::make_unique<ebb::Session>(*engine->engine, so);
    ++engine->n_sessions;
    *out = h.release();
  });
}

ebb_status ebb_session_free(ebb_session* session) {
  if (!session) return EBB_OK;
  return guarded("ebb_session_free", EBB_ERR_FAILED, [&] {
    ebb_engine* e = session->owner;
    std::lock_guard lock(e->mu);
    need_not_in_callback(e);
    session->session.reset();
    --e->n_sessions;
    delete session;
  });
}

ebb_status ebb_session_feed(ebb_session* session, const ebb_token* tokens, size_t n_tokens) {
  return guarded("ebb_session_feed", EBB_ERR_FAILED, [&] {
    need(session, "session");
    std::lock_guard lock(session->owner->mu);
    need_not_in_callback(session->owner);
    check_tokens(*session->owner->engine, tokens, n_tokens, "tokens");
    check_context(*session->session, n_tokens);
    if (session->session->tokens().empty() && n_tokens == 0) return;  // nothing to run
    session->logits_valid = false;
    session->session->feed(std::span<const ebb::TokenId>(tokens, n_tokens));
    session->logits_valid = true;
  });
}

ebb_status ebb_session_logits(ebb_session* session, const float** logits, int32_t* n_vocab) {
  return guarded("ebb_session_logits", EBB_ERR_FAILED, [&] {
    need(session, "session");
    need(logits, "logits");
    need(n_vocab, "n_vocab");
    std::lock_guard lock(session->owner->mu);
    if (!session->logits_valid) {
      fail(EBB_ERR_FAILED, "no logits for the session's last token: it has not run yet (ebb_session_feed runs "
                           "it, also with no new tokens after a generate, truncate or load)");
    }
    const std::span<const float> l = session->session->last_logits();
    *logits = l.data();
    *n_vocab = static_cast<int32_t>(l.size());
  });
}

ebb_status ebb_session_tokens(ebb_session* session, ebb_token* tokens, size_t capacity, size_t* n_tokens) {
  return guarded("ebb_session_tokens", EBB_ERR_FAILED, [&] {
    need(session, "session");
    need(n_tokens, "n_tokens");
    if (capacity > 0) need(tokens, "tokens");
    std::lock_guard lock(session->owner->mu);
    write_out(session->session->tokens(), tokens, capacity, n_tokens);
  });
}

ebb_status ebb_session_truncate(ebb_session* session, size_t n) {
  return guarded("ebb_session_truncate", EBB_ERR_FAILED, [&] {
    need(session, "session");
    std::lock_guard lock(session->owner->mu);
    need_not_in_callback(session->owner);
    const size_t have = session->session->tokens().size();
    check_range(n <= have, "n = " + std::to_string(n) + " is more than the session's " + std::to_string(have) + " tokens");
    session->logits_valid = false;
    session->session->truncate(static_cast<int64_t>(n));
  });
}

ebb_status ebb_session_save(ebb_session* session, const char* path) {
  return guarded("ebb_session_save", EBB_ERR_IO, [&] {
    need(session, "session");
    need(path, "path");
    std::lock_guard lock(session->owner->mu);
    need_not_in_callback(session->owner);
    session->session->save(path);
  });
}

ebb_status ebb_session_load(ebb_session* session, const char* path) {
  return guarded("ebb_session_load", EBB_ERR_FAILED, [&] {
    need(session, "session");
    need(path, "path");
    check_readable_file(path, "session file");
    std::lock_guard lock(session->owner->mu);
    need_not_in_callback(session->owner);
    session->logits_valid = false;
    session->session->load(path);
  });
}

// ---- generation ------------------------------------------------------------

ebb_sampling_options ebb_sampling_options_default(void) {
  const ebb::SamplerOptions d;
  ebb_sampling_options o{};
  o.struct_size = sizeof(o);
  o.temperature = d.temperature;
  o.top_k = d.top_k;
  o.top_p = d.top_p;
  o.min_p = d.min_p;
  o.repeat_penalty = d.repeat_penalty;
  o.frequency_penalty = d.frequency_penalty;
  o.presence_penalty = d.presence_penalty;
  o.penalty_last_n = d.penalty_last_n;
  o.seed = d.seed;
  return o;
}

ebb_generate_options ebb_generate_options_default(void) {
  const ebb::GenerateOptions d;
  ebb_generate_options o{};
  o.struct_size = sizeof(o);
  o.max_tokens = d.max_tokens;
  o.sampling = ebb_sampling_options_default();
  o.stop_strings = nullptr;
  o.n_stop_strings = 0;
  o.stop_at_eog = d.stop_at_eog ? 1 : 0;
  return o;
}

ebb_status ebb_generate(ebb_session* session, const ebb_token* prompt, size_t n_prompt,
                        const ebb_generate_options* options, ebb_text_callback on_text, void* user_data,
                        ebb_generate_result* result) {
  return guarded("ebb_generate", EBB_ERR_FAILED, [&] {
    need(session, "session");
    ebb::GenerateOptions go = to_cpp(options);
    std::lock_guard lock(session->owner->mu);
    run_generation(session, prompt, n_prompt, go, on_text, user_data, result, nullptr);
  });
}

ebb_status ebb_generate_constrained(ebb_session* session, const ebb_token* prompt, size_t n_prompt,
                                    const ebb_generate_options* options, const ebb_constraint* constraint,
                                    ebb_text_callback on_text, void* user_data, ebb_generate_result* result) {
  return guarded("ebb_generate_constrained", EBB_ERR_FAILED, [&] {
    need(session, "session");
    ebb::GenerateOptions go = to_cpp(options);
    std::lock_guard lock(session->owner->mu);
    go.constraint = constraint_copy(constraint, session->owner);
    run_generation(session, prompt, n_prompt, go, on_text, user_data, result, nullptr);
  });
}

// ---- memory ----------------------------------------------------------------

ebb_status ebb_engine_footprint(ebb_engine* engine, ebb_footprint* out) {
  return guarded("ebb_engine_footprint", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    need(out, "out");
    std::lock_guard lock(engine->mu);
    const ebb::Footprint f = engine->engine->footprint();
    ebb_footprint r{};
    r.weights = f.weights();
    r.globals = f.globals;
    r.kv = f.kv();
    r.scratch = f.scratch;
    r.compressed = f.compressed;
    r.io_buffers = f.io_buffers;
    r.total = f.total();
    r.kv_stored = f.kv_stored;
    r.weights_stored = f.weights_stored;
    r.adapters = f.adapters;
    r.adapters_stored = f.adapters_stored;
    *out = r;
  });
}

ebb_status ebb_engine_evict(ebb_engine* engine, uint64_t bytes, ebb_evict_result* result) {
  return guarded("ebb_engine_evict", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    std::lock_guard lock(engine->mu);
    need_not_in_callback(engine);
    const ebb::EvictReport r = engine->engine->evict(bytes);
    if (result) *result = to_c(r);
  });
}

ebb_status ebb_engine_restore(ebb_engine* engine, ebb_restore_result* result) {
  return guarded("ebb_engine_restore", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    std::lock_guard lock(engine->mu);
    need_not_in_callback(engine);
    const ebb::RestoreReport r = engine->engine->restore();
    if (result) {
      ebb_restore_result out{};
      out.seconds = r.seconds;
      out.bytes_read = r.bytes_read;
      out.weight_layers_loaded = r.weights_loaded;
      out.kv_chunks_read = r.chunks_read;
      out.kv_chunks_decompressed = r.chunks_decompressed;
      *result = out;
    }
  });
}

ebb_status ebb_engine_set_memory_limit(ebb_engine* engine, uint64_t bytes, ebb_evict_result* result) {
  return guarded("ebb_engine_set_memory_limit", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    std::lock_guard lock(engine->mu);
    need_not_in_callback(engine);
    const ebb::EvictReport r = engine->engine->set_memory_limit(bytes);
    if (result) *result = to_c(r);
  });
}

ebb_status ebb_engine_residency(ebb_engine* engine, ebb_residency** out) {
  return guarded("ebb_engine_residency", EBB_ERR_FAILED, [&] {
    need(out, "out");
    *out = nullptr;
    need(engine, "engine");
    std::lock_guard lock(engine->mu);
    ebb::ElasticMemory* em = engine->engine->elastic();
    if (!em) fail(EBB_ERR_FAILED, "elastic memory is off in this engine; there is no residency map");
    const ebb::ResidencyMap m = em->residency();
    auto snap = std::make_unique<ResidencySnapshot>();
    const size_t nl = m.weights.size();
    snap->weight_states.resize(nl);
    snap->chunk_counts.assign(nl, 0);
    snap->chunk_states.resize(nl);
    snap->chunk_rows.resize(nl);
    for (size_t l = 0; l < nl; ++l) {
      snap->weight_states[l] = to_c(m.weights[l]);
      if (l < m.kv.size()) {
        for (ebb::UnitState s : m.kv[l]) snap->chunk_states[l].push_back(to_c(s));
      }
      snap->chunk_counts[l] = static_cast<int32_t>(snap->chunk_states[l].size());
      snap->chunk_rows[l] = snap->chunk_states[l].data();
    }
    snap->grid_text = m.grid();
    snap->n_layer = static_cast<int32_t>(nl);
    snap->weights = snap->weight_states.data();
    snap->n_chunks = snap->chunk_counts.data();
    snap->chunks = snap->chunk_rows.data();
    snap->grid = snap->grid_text.c_str();
    *out = snap.release();
  });
}

// ---- adapters --------------------------------------------------------------

ebb_status ebb_adapter_load(ebb_engine* engine, const char* path, const char* name) {
  return guarded("ebb_adapter_load", EBB_ERR_MODEL, [&] {
    need(engine, "engine");
    need(path, "path");
    std::error_code ec;
    if (!std::filesystem::is_directory(path, ec)) check_readable_file(path, "adapter file");
    std::lock_guard lock(engine->mu);
    need_not_in_callback(engine);
    const std::string n = name ? name : "";
    // A bad name is the caller's; what load_lora throws is about the file.
    try {
      if (!n.empty()) ebb::check_adapter_name(n);
    } catch (const ebb::Error& e) {
      fail(EBB_ERR_INVALID_ARGUMENT, e.what());
    }
    engine->engine->adapters().load(path, n);
  });
}

ebb_status ebb_adapter_unload(ebb_engine* engine, const char* name) {
  return guarded("ebb_adapter_unload", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    need(name, "name");
    std::lock_guard lock(engine->mu);
    need_not_in_callback(engine);
    try {
      engine->engine->adapters().unload(name);
    } catch (const ebb::Error& e) {
      fail(EBB_ERR_INVALID_ARGUMENT, e.what());
    }
  });
}

ebb_status ebb_session_set_adapters(ebb_session* session, const char* const* names, const float* scales, size_t n) {
  return guarded("ebb_session_set_adapters", EBB_ERR_FAILED, [&] {
    need(session, "session");
    if (n > 0) need(names, "names");
    std::vector<ebb::AdapterBinding> set;
    for (size_t i = 0; i < n; ++i) {
      if (!names[i]) fail(EBB_ERR_INVALID_ARGUMENT, "names[" + std::to_string(i) + "] is NULL");
      const float sc = scales ? scales[i] : 1.0f;
      check_range(std::isfinite(sc), "scales[" + std::to_string(i) + "] is not a finite number");
      set.push_back({names[i], sc, 0});
    }
    std::lock_guard lock(session->owner->mu);
    need_not_in_callback(session->owner);
    try {
      session->session->set_adapters(std::move(set));
    } catch (const ebb::Error& e) {
      fail(EBB_ERR_INVALID_ARGUMENT, e.what());
    }
  });
}

void ebb_residency_free(ebb_residency* residency) {
  delete static_cast<ResidencySnapshot*>(residency);
}

// ---- constrained output ------------------------------------------------------

ebb_status ebb_constraint_from_gbnf(ebb_engine* engine, const char* gbnf, ebb_constraint** out) {
  if (out) *out = nullptr;
  return guarded("ebb_constraint_from_gbnf", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    need(gbnf, "gbnf");
    need(out, "out");
    std::lock_guard lock(engine->mu);
    *out = make_constraint(engine, gbnf);
  });
}

ebb_status ebb_constraint_from_json_schema(ebb_engine* engine, const char* schema_json, ebb_constraint** out) {
  if (out) *out = nullptr;
  return guarded("ebb_constraint_from_json_schema", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    need(out, "out");
    std::string gbnf;
    try {
      gbnf = schema_json == nullptr || *schema_json == '\0' ? ebb::grammar::json_object_gbnf()
                                                            : ebb::grammar::json_schema_to_gbnf(std::string_view(schema_json));
    } catch (const ebb::Error& e) {
      fail(EBB_ERR_INVALID_ARGUMENT, e.what());
    }
    std::lock_guard lock(engine->mu);
    *out = make_constraint(engine, gbnf);
  });
}

void ebb_constraint_free(ebb_constraint* constraint) { delete constraint; }

// ---- chat ----------------------------------------------------------------------

ebb_status ebb_engine_set_chat_template(ebb_engine* engine, const char* source) {
  return guarded("ebb_engine_set_chat_template", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    std::lock_guard lock(engine->mu);
    need_not_in_callback(engine);
    if (!source) {
      engine->renderer.reset();
      return;
    }
    try {
      engine->renderer = std::make_unique<ebb::ChatRenderer>(
          ebb::ChatRenderer::from_source(source, engine->engine->config().arch_name, engine->engine->tokenizer()));
    } catch (const ebb::Error& e) {
      fail(EBB_ERR_INVALID_ARGUMENT, e.what());
    }
  });
}

ebb_status ebb_chat_render(ebb_engine* engine, const char* messages_json, const char* tools_json,
                           int add_generation_prompt, char* text, size_t capacity, size_t* n_bytes) {
  return guarded("ebb_chat_render", EBB_ERR_FAILED, [&] {
    need(engine, "engine");
    need(n_bytes, "n_bytes");
    if (capacity > 0) need(text, "text");
    const nlohmann::ordered_json messages = parse_json_arg(messages_json, "messages_json");
    const nlohmann::ordered_json tools = tools_json ? parse_json_arg(tools_json, "tools_json") : nlohmann::ordered_json();
    std::lock_guard lock(engine->mu);
    const std::string s = render_chat(engine, messages, tools, add_generation_prompt != 0);
    *n_bytes = s.size();
    if (s.size() + 1 > capacity) {
      fail(EBB_ERR_BUFFER_TOO_SMALL, std::to_string(s.size() + 1) + " bytes needed (text and NUL), the buffer holds " +
                                         std::to_string(capacity));
    }
    std::memcpy(text, s.data(), s.size());
    text[s.size()] = '\0';
  });
}

ebb_chat_options ebb_chat_options_default(void) {
  ebb_chat_options o{};
  o.struct_size = sizeof(o);
  o.generate = ebb_generate_options_default();
  o.tools_json = nullptr;
  o.tool_choice = EBB_TOOL_CHOICE_AUTO;
  o.parallel_tool_calls = 1;
  o.constraint = nullptr;
  return o;
}

ebb_status ebb_chat(ebb_session* session, const char* messages_json, const ebb_chat_options* options,
                    ebb_text_callback on_text, void* user_data, ebb_chat_result** out) {
  if (out) *out = nullptr;
  return guarded("ebb_chat", EBB_ERR_FAILED, [&] {
    need(session, "session");
    need(out, "out");
    need_options(options, "options", "ebb_chat_options_default");
    ebb::GenerateOptions go = to_cpp(&options->generate);
    const ebb_tool_choice choice = options->tool_choice;
    check_range(choice == EBB_TOOL_CHOICE_AUTO || choice == EBB_TOOL_CHOICE_NONE || choice == EBB_TOOL_CHOICE_REQUIRED,
                "options.tool_choice = " + std::to_string(static_cast<int>(choice)) + " is not an ebb_tool_choice");
    const nlohmann::ordered_json messages = parse_json_arg(messages_json, "messages_json");
    nlohmann::ordered_json tools;
    if (options->tools_json) {
      tools = parse_json_arg(options->tools_json, "options.tools_json");
      if (!tools.is_array()) fail(EBB_ERR_INVALID_ARGUMENT, "options.tools_json must be a JSON array of tools");
      if (tools.empty()) tools = nlohmann::ordered_json();
    }
    const bool has_tools = !tools.is_null();
    if (choice == EBB_TOOL_CHOICE_REQUIRED && !has_tools)
      fail(EBB_ERR_INVALID_ARGUMENT, "options.tool_choice is EBB_TOOL_CHOICE_REQUIRED but there are no tools");
    if (choice == EBB_TOOL_CHOICE_REQUIRED && options->constraint)
      fail(EBB_ERR_INVALID_ARGUMENT, "options.constraint cannot be set with EBB_TOOL_CHOICE_REQUIRED (the tools are the grammar)");

    ebb_engine* owner = session->owner;
    std::lock_guard lock(owner->mu);
    need_not_in_callback(owner);
    const ebb::ChatRenderer& renderer = renderer_of(owner);
    if (has_tools && !renderer.is_jinja()) {
      fail(EBB_ERR_INVALID_ARGUMENT, "tools need a Jinja chat template and the model has none: set one with "
                                     "ebb_engine_set_chat_template");
    }
    const std::string text = render_chat(owner, messages, tools, true);
    ebb::ChatOutputFormat fmt = renderer.output_format();
    fmt.open_think = ebb::prompt_opens_think(text, fmt);
    for (const std::string& s : renderer.stop_strings()) go.stop_strings.push_back(s);

    // The grammar: the caller's, or the tools' (forced, or lazy on the
    // family's call marker with AUTO).
    go.constraint = constraint_copy(options->constraint, owner);
    const bool lazy = has_tools && choice == EBB_TOOL_CHOICE_AUTO && !options->constraint && !fmt.triggers.empty();
    if ((has_tools && choice == EBB_TOOL_CHOICE_REQUIRED) || lazy) {
      ebb::grammar::ToolCallGrammarOptions to;
      to.prefix = fmt.call_prefix;
      to.suffix = fmt.call_suffix;
      to.parallel = choice == EBB_TOOL_CHOICE_AUTO || options->parallel_tool_calls != 0;
      std::string gbnf;
      try {
        gbnf = ebb::grammar::tool_call_gbnf(tools, to);
      } catch (const ebb::Error& e) {
        fail(EBB_ERR_INVALID_ARGUMENT, std::string("options.tools_json: ") + e.what());
      }
      ebb::grammar::ConstraintOptions co;
      if (lazy) {
        co.lazy = true;
        co.trigger_words = fmt.triggers;
        ebb::EncodeOptions eo;
        eo.add_bos = false;
        eo.parse_special = true;
        for (const std::string& w : fmt.triggers) {
          const std::vector<ebb::TokenId> ids = owner->engine->tokenizer().encode(w, eo);
          if (ids.size() == 1) co.trigger_tokens.push_back(ids[0]);
        }
      }
      std::unique_ptr<ebb_constraint> c(make_constraint(owner, gbnf, std::move(co)));
      go.constraint = std::make_shared<ebb::grammar::GrammarConstraint>(c->prototype->copy());
    }

    // The prompt: what the session holds of it already stays.
    const ebb::Tokenizer& tok = owner->engine->tokenizer();
    ebb::EncodeOptions eo;
    eo.add_bos = tok.add_bos_default() && !renderer.writes_bos(text);
    eo.parse_special = true;
    const std::vector<ebb::TokenId> prompt = tok.encode(text, eo);
    if (prompt.empty()) fail(EBB_ERR_INVALID_ARGUMENT, "the rendered prompt is empty");
    const std::vector<ebb::TokenId> have = session->session->tokens();
    size_t keep = 0;
    while (keep < have.size() && keep < prompt.size() && have[keep] == prompt[keep]) ++keep;
    if (keep == prompt.size()) --keep;  // one token at least runs, for the logits
    if (keep < have.size()) session->session->truncate(static_cast<int64_t>(keep));

    auto data = std::make_unique<ChatResultData>();
    ebb_generate_result gen{};
    run_generation(session, prompt.data() + keep, prompt.size() - keep, go, on_text, user_data, &gen, &data->text);
    ChatResultData* res = data.get();
    std::mt19937_64 rng(go.sampling.seed ^ 0x9e3779b97f4a7c15ull);
    ebb::ParsedOutput parsed = ebb::parse_chat_output(fmt, res->text, has_tools && choice != EBB_TOOL_CHOICE_NONE,
                                                      [&rng] { return ebb::make_call_id(rng); });
    res->content = std::move(parsed.content);
    res->reasoning = std::move(parsed.reasoning_content);
    res->calls = std::move(parsed.tool_calls);
    for (const ebb::ToolCall& c : res->calls) res->c_calls.push_back({c.id.c_str(), c.name.c_str(), c.arguments.c_str()});
    auto owned = std::make_unique<ebb_chat_result_owned>();
    owned->c.content = res->content.c_str();
    owned->c.reasoning_content = res->reasoning.c_str();
    owned->c.text = res->text.c_str();
    owned->c.n_tool_calls = res->c_calls.size();
    owned->c.tool_calls = res->c_calls.empty() ? nullptr : res->c_calls.data();
    owned->c.generate = gen;
    owned->data = data.release();
    *out = &owned.release()->c;
  });
}

void ebb_chat_result_free(ebb_chat_result* result) {
  if (!result) return;
  auto* owned = reinterpret_cast<ebb_chat_result_owned*>(result);  // its first member (standard layout)
  delete owned->data;
  delete owned;
}

}  // extern "C"
