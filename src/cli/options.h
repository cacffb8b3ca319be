// Command-line options shared by the subcommands, each declared once with its
// help text (STYLE habit 14).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "model/chat_renderer.h"
#include "model/chat_template.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace ebb::grammar {
struct Grammar;
}

namespace ebb::cli {

// A usage error (a bad option value, options that contradict each other):
// main prints it and exits with status 2, as for an unknown option.
class UsageError : public Error {
 public:
  using Error::Error;
};

struct ModelArgs {
  std::string model;
  int threads = 0;
  std::string isa;
  int64_t ctx = 0;
  std::string device;                 // --device cpu|vulkan|vulkan:N ("": cpu, or vulkan when -ngl N > 0)
  std::string n_gpu_layers;           // llama.cpp's -ngl: N layers on the device (the last N), "auto", or "": not given
  std::string device_memory;          // --device-memory SIZE: what -ngl auto fills ("": the device's reported memory)
  int64_t kv_chunk = 0;               // 0: Engine::session_chunk_size (adapts to the context)
  std::string kv_type = "f16";
  bool f16_attention = false;
  int64_t batch = 64;
  std::string memory_budget;          // budget mode: "600MiB", "1.5GiB", "40%" (empty: off)
  std::string budget_system;          // budget mode planner / baseline ("": ebb)
  int budget_window = 3;              // budget mode prefetch window in layers
  std::string swap_dir;               // elastic memory: swap files ("": the user's cache directory)
  bool prefix_cache = false;          // reuse cached prefixes' KV across sessions
  std::string cache_dir;              // the prefix cache's files, kept across runs ("": none)
  std::string cache_namespace;        // sessions in different namespaces never share KV
  std::string kv_codec = "int8";      // elastic memory: codec of compressed KV
  std::string evict_order = "backward";
  std::string overlap = "full";
  std::string profile;                // device profile ("": the saved one, else defaults)
  std::string memory_limit;           // elastic memory's limit: SIZE, PCT or off ("": the cgroup's)
  std::string cgroup_root;            // internal (tests): where /proc and /sys are ("": the real ones)
  std::vector<std::string> lora;         // --lora FILE|DIR (repeatable): applied at scale 1
  std::vector<std::string> lora_scaled;  // --lora-scaled FILE SCALE (repeatable): pairs of words
  // llama.cpp options ebb has no use for: accepted, each noted once on stderr.
  std::string flash_attn;             // -fa/--flash-attn [on|off|auto] ("": not given)
  bool mlock = false;
  bool no_mmap = false;
  bool verbose = false;               // -v/--verbose: print the resolved configuration after the load
  // Not declared by add_model_options (a subcommand declares its own
  // --quiet): no load progress, no notes a script does not need.
  bool quiet = false;
  double progress_after = 1.0;        // seconds a load runs before its progress shows (hidden option)
};

// The model options a subcommand declares; those that do nothing there are
// left out, so its --help lists only what works. Every set declares
// -m, -t, --isa, the llama.cpp compatibility options and --memory-limit;
// the rest go to the "Engine, memory and cache" group of the help.
struct ModelOptionSet {
  bool context = true;       // -c/--ctx, -b/--batch, --kv-chunk, --kv-type, --f16-attention
  bool budget = true;        // --memory-budget, --budget-system, --budget-window
  bool kv_memory = true;     // --swap-dir, --kv-codec, --evict-order, --overlap, --profile
  bool prefix_cache = true;  // --prefix-cache, --cache-dir, --cache-namespace
  bool lora = true;          // --lora, --lora-scaled
};
// The help group of the engine, memory and cache options.
inline constexpr const char* kEngineGroup = "Engine, memory and cache options";
inline constexpr const char* kSamplingGroup = "Sampling options";

void add_model_options(CLI::App* app, ModelArgs& a, const ModelOptionSet& set = {});
void add_sampling_options(CLI::App* app, SamplerOptions& s);

// --chat-template NAME|FILE (llama.cpp's spelling) and --format NAME (ebb's):
// a marker format name (chatml, llama3, llama2, plain) or a Jinja template
// file; by default the model's own Jinja template.
struct ChatTemplateArgs {
  std::string spec;   // as given ("": the model's own template)
  std::string file;   // spec named a file: its path
  std::string text;   // and its text (read by resolve_chat_template)
  bool jinja = false; // --jinja: accepted (ebb always applies the template)
};
void add_chat_template_options(CLI::App* app, ChatTemplateArgs& t);
// --grammar FILE, --json-schema FILE, --json: at most one.
struct GrammarArgs {
  std::string grammar_file;  // GBNF
  std::string schema_file;   // JSON Schema
  bool json = false;         // any JSON object
  bool any() const;
};
void add_grammar_options(CLI::App* app, GrammarArgs& g);
// UsageError for two constraints at once or a file that is not there (before
// the model loads).
void check_grammar_args(const GrammarArgs& g);
// The grammar the generated text must follow, nullptr when none was asked
// for; compiled before the model loads, so a bad file fails at once. A
// grammar or schema that does not compile is an Error naming the option, the
// file and, for GBNF, the line and column ("--grammar 'g.gbnf': grammar line
// 3 column 7: undefined rule 'x'"); for a schema, its JSON error (line and
// column) or the schema path ("#/properties/age: ...").
std::shared_ptr<const grammar::Grammar> output_grammar(const GrammarArgs& g);
// Its constraint over the model's vocabulary (nullptr for none).
std::shared_ptr<grammar::GrammarConstraint> output_constraint(std::shared_ptr<const grammar::Grammar> g,
                                                              const Tokenizer& tok);

struct ResolvedChatTemplate {
  ChatRenderer renderer;
  std::string source;  // why this one: "--format", the file, "the model's tokenizer.chat_template", ...
};
// The renderer: --chat-template FILE (Jinja; a template that does not parse
// is a UsageError naming the file, line and column), --chat-template/--format
// NAME (markers), else the model's own template. A model without a usable
// template falls back to the marker format, said in one line on stderr
// (unless quiet). Reads a template file (at most 1 MiB); notes --jinja once.
ResolvedChatTemplate resolve_chat_template(ChatTemplateArgs& t, const Engine& e, bool quiet = false);

// Reads a prompt from a file (- for standard input), at most max_bytes
// bytes: a larger input is an Error that names the file and the limit
// (reading stops there, so /dev/zero cannot exhaust memory). `what` names
// the option in messages ("--file").
std::string read_bounded_text(const std::string& path, uint64_t max_bytes, const std::string& what);
// Bytes of prompt text a context of n_ctx tokens can use: no token is
// shorter than one byte in practice and text longer than kPromptBytesPerToken
// bytes a token is refused before it is tokenized.
inline constexpr uint64_t kPromptBytesPerToken = 64;
// The context the session will have: --ctx, else min(training context, 4096).
int64_t context_of(const ModelArgs& a, const Engine& e);

// "did you mean --temp?": the known name closest to `unknown` by edit
// distance (a prefix of it counts as close), or "" when none is close.
std::string closest_name(const std::string& unknown, const std::vector<std::string>& known);

// Builds the engine and a session from the options; errors are ebb::Error
// (UsageError for option values that cannot work), running out of memory
// included. A load longer than a.progress_after seconds shows its progress
// on stderr ("loading MODEL: 45% (540/1200 MB)", in place on a terminal,
// plain lines otherwise; nothing with a.quiet); *load_seconds gets the time
// it took. A --ctx past the model's training context is warned about.
std::unique_ptr<Engine> make_engine(const ModelArgs& a, double* load_seconds = nullptr);
// The engine's options from the command line (validated; UsageError for
// values that cannot work), for callers that build engines themselves.
// One line on stderr: which device holds what (weights, KV, scratch; the
// device's ledger), for --verbose.
void print_device(const Engine& e);
// "cpu", "vulkan" or "vulkan:N": --device, else vulkan when -ngl N > 0.
std::string resolve_device(const ModelArgs& a);
// -ngl's value: -1 auto (or not given), else the layers (throws UsageError).
int gpu_layers_of(const ModelArgs& a);
EngineOptions engine_options(const ModelArgs& a);
SessionOptions session_options(const ModelArgs& a);
// The adapter set --lora and --lora-scaled ask for (make_engine has loaded
// them, each named by its file's stem), for Session::set_adapters.
std::vector<AdapterBinding> adapter_bindings(const ModelArgs& a);

// Compute threads of a --threads value: 0 gives all hardware threads; a
// negative count is a UsageError; more than the hardware has is capped at
// the hardware's count with a one-line note (each extra thread would only
// wait, and slow every step down).
int resolve_threads(int threads);
// Generated tokens at most of an -n value: -1 is "until a stop or the
// context ends" (as in llama.cpp); below -1 is a UsageError.
int64_t max_tokens_of(int64_t n_predict);
// A random seed (--seed -1 or 0) is drawn here, so it can be printed and the
// run repeated with --seed N; greedy runs (temp 0) use no seed.
void resolve_seed(SamplerOptions& s);

// Memory the LLM holds by category, as the summary prints it. In budget
// mode the streamed weights' resident part is counted from the ledger (the
// model's units are not resident there).
struct MemoryView {
  uint64_t weights = 0;  // layer weights + globals in RAM
  uint64_t kv = 0;
  uint64_t scratch = 0;
  uint64_t adapters = 0;  // LoRA adapter tensors
  uint64_t total = 0;
};
MemoryView memory_view(const Engine& e);

// "1.5 MiB"
std::string format_bytes(uint64_t b);
// The one-line run summary (STYLE habit 13): tok/s, TTFT, footprint, output
// hash; the model's load time when load_seconds >= 0.
std::string summary_line(const Engine& e, const GenerateStats& st, double load_seconds = -1);

// Each registers its subcommand; the subcommand's exit status goes to *rc.
void add_run_command(CLI::App& app, int* rc);
void add_chat_command(CLI::App& app, int* rc);
void add_inspect_command(CLI::App& app, int* rc);
void add_synth_command(CLI::App& app, int* rc);
void add_bench_command(CLI::App& app, int* rc);
void add_profile_command(CLI::App& app, int* rc);
void add_adapter_command(CLI::App& app, int* rc);  // cmd_adapter.cpp: ebb adapter inspect/convert
void add_train_command(CLI::App& app, int* rc);    // cmd_train.cpp: ebb train
void add_serve_command(CLI::App& app, int* rc);    // cmd_serve.cpp: ebb serve (OpenAI-compatible HTTP)
// The device profile of a --profile option: that file ("": the saved one, or
// the built-in defaults when none was saved).
DeviceProfile load_profile_option(const std::string& path);

}  // namespace ebb::cli
