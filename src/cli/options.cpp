#include "cli/options.h"

#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <new>
#include <random>
#include <system_error>
#include <thread>

#include "model/gguf.h"
#include "platform/cgroup.h"
#include "platform/error.h"
#include "platform/timer.h"

namespace ebb::cli {

void add_model_options(CLI::App* app, ModelArgs& a, const ModelOptionSet& set) {
  app->add_option("-m,--model", a.model, "GGUF model file")->required();
  app->add_option("-t,--threads", a.threads, "Compute threads (0: all hardware threads; more are capped at that)")
      ->capture_default_str();
  if (set.context) {
    app->add_option("-c,--ctx,--ctx-size", a.ctx, "Context size in tokens (0: min(training context, 4096))")
        ->capture_default_str();
  }
  if (set.lora) {
    app->add_option("--lora", a.lora,
                    "LoRA adapter to apply at scale 1 (repeatable): a GGUF adapter file (llama.cpp's format) or a "
                    "PEFT directory (adapter_config.json + adapter_model.safetensors)");
    app->add_option("--lora-scaled", a.lora_scaled,
                    "LoRA adapter and its scale, as in llama.cpp (repeatable): --lora-scaled FILE SCALE")
        ->expected(2)
        ->allow_extra_args(false);
  }
  app->add_flag("-v,--verbose", a.verbose, "Print the resolved configuration (threads, kernels, context, memory)");
  const char* g = kEngineGroup;
  app->add_option("--isa", a.isa, "Force a kernel target: scalar, avx2, avx512, neon, or ref-engine (scalar, rounding in the order of the engine the golden logits come from; slow, for validation) (default: best available)")
      ->group(g);
  app->add_option("--device", a.device,
                  "Where the model runs: cpu, vulkan (the first Vulkan device) or vulkan:N (the Nth, in the Vulkan loader's order); "
                  "on a device its weights and KV live there (default: cpu, or vulkan with -ngl N > 0 or auto)")
      ->group(g);
  app->add_option("--n-gpu-layers", a.n_gpu_layers,
                  "Layers on the device (llama.cpp's -ngl): 0 runs on the CPU; N puts the last N there and the first "
                  "ones on the CPU; N >= the model's layers (99) puts all there; auto (the default with --device "
                  "vulkan) the most that fit --device-memory")
      ->group(g);
  app->add_option("--device-memory", a.device_memory,
                  "Device memory -ngl auto may fill: 4G, 900MiB, 123456 (default: what the device reports); the layers "
                  "that do not fit (weights and KV at the context) run on the CPU")
      ->group(g);
  app->add_option("--flash-attn", a.flash_attn,
                  "Accepted for llama.cpp's -fa and ignored: ebb's attention always streams the KV in one fused pass")
      ->group(g);
  app->add_flag("--mlock", a.mlock, "Accepted for llama.cpp and ignored: elastic memory decides what stays in RAM")
      ->group(g);
  app->add_flag("--no-mmap", a.no_mmap, "Accepted for llama.cpp and ignored: ebb reads the weights into its own memory")
      ->group(g);
  if (set.context) {
    app->add_option("--kv-chunk", a.kv_chunk,
                    "Tokens per KV chunk, the prefix cache's granularity (0: 256, or for a small context the "
                    "largest power of two <= ctx/4, at least 16)")
        ->capture_default_str()
        ->group(g);
    app->add_option("--kv-type", a.kv_type, "KV cache element type: f16 or f32")->capture_default_str()->group(g);
    app->add_flag("--f16-attention", a.f16_attention,
                  "F16 KV: accumulate attention in F16 position by position, as llama.cpp does (to compare logits "
                  "with it; slower), instead of in F32")
        ->group(g);
    app->add_option("-b,--batch,--batch-size", a.batch, "Prefill micro-batch in tokens")->capture_default_str()->group(g);
  }
  if (set.budget) {
    app->add_option("--memory-budget", a.memory_budget,
                    "Keep all LLM memory within this size, streaming weights that do not fit (600MiB, 1.5GiB, 40%)")
        ->group(g);
    app->add_option("--budget-system", a.budget_system,
                    "With --memory-budget: ebb, sync, prefetch, unbalanced, attn-first, ffn-first, mmap (default: ebb)")
        ->group(g);
    app->add_option("--budget-window", a.budget_window, "With --memory-budget: prefetch window in layers")
        ->capture_default_str()
        ->group(g);
  }
  if (set.kv_memory) {
    app->add_option("--swap-dir", a.swap_dir, "Elastic memory: directory of swap files (default: ~/.cache/ebb/swap)")
        ->group(g);
  }
  if (set.prefix_cache) {
    app->add_flag("--prefix-cache", a.prefix_cache,
                  "Reuse the KV of cached prompt prefixes (same namespace and tokens) instead of recomputing it")
        ->group(g);
    app->add_option("--cache-dir", a.cache_dir,
                    "Keep the prefix cache's KV in this directory across runs (implies --prefix-cache)")
        ->group(g);
    app->add_option("--cache-namespace", a.cache_namespace, "Prefix-cache namespace of this run's conversation")->group(g);
  }
  if (set.kv_memory) {
    app->add_option("--kv-codec", a.kv_codec, "Elastic memory: codec of compressed KV: int8, int4, or none (lossless: evicted KV goes raw to storage, answers are exactly those without eviction)")
        ->capture_default_str()
        ->group(g);
    app->add_option("--evict-order", a.evict_order, "Elastic memory: backward, forward, random")
        ->capture_default_str()
        ->group(g);
    app->add_option("--overlap", a.overlap, "Elastic memory restore overlap: none, alloc-reload, reload-prefill, full")
        ->capture_default_str()
        ->group(g);
    app->add_option("--profile", a.profile, "Device profile from `ebb profile` (default: the saved one)")->group(g);
  }
  app->add_option("--memory-limit", a.memory_limit,
                  "Elastic memory: keep weights and KV in RAM within this size (300MiB, 40% of the weights, or off); "
                  "what does not fit is streamed or evicted (default: the limit of the process's cgroup, less room "
                  "for the rest of the process); with --device, device and host memory together (no cgroup default)")
      ->group(g);
  app->add_option("--cgroup-root", a.cgroup_root, "where /proc and /sys are read (tests)")->group("");
  app->add_option("--progress-after", a.progress_after, "seconds before a load shows its progress (tests)")->group("");
}

void add_sampling_options(CLI::App* app, SamplerOptions& s) {
  const char* g = kSamplingGroup;
  app->add_option("--temp", s.temperature, "Sampling temperature (0: greedy)")->capture_default_str()->group(g);
  app->add_option("--top-k", s.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str()->group(g);
  app->add_option("--top-p", s.top_p, "Keep the smallest set with this cumulative probability (1: off)")
      ->capture_default_str()
      ->group(g);
  app->add_option("--min-p", s.min_p, "Drop tokens below min-p x the top probability (0: off)")
      ->capture_default_str()
      ->group(g);
  app->add_option("--repeat-penalty", s.repeat_penalty, "Repetition penalty (1: off)")->capture_default_str()->group(g);
  app->add_option("--frequency-penalty", s.frequency_penalty, "Frequency penalty (0: off)")
      ->capture_default_str()
      ->group(g);
  app->add_option("--presence-penalty", s.presence_penalty, "Presence penalty (0: off)")->capture_default_str()->group(g);
  app->add_option("--penalty-last-n,--repeat-last-n", s.penalty_last_n, "Tokens of history the penalties look at")
      ->capture_default_str()
      ->group(g);
  app->add_option_function<int64_t>(
         "--seed",
         [&s](const int64_t& v) {
           if (v < -1) throw CLI::ValidationError("--seed", "must be >= 0, or -1 for a random seed");
           s.seed = v == -1 ? 0 : static_cast<uint64_t>(v);
         },
         "Random seed (-1 or 0: a random one, printed so the run can be repeated)")
      ->default_str("-1")
      ->group(g);
}

void add_chat_template_options(CLI::App* app, ChatTemplateArgs& t) {
  app->add_option("--chat-template,--format", t.spec,
                  "Chat template: a format name (chatml, llama3, llama2, plain) or a Jinja template file "
                  "(default: the model's own)");
  app->add_flag("--jinja", t.jinja, "Accepted for llama.cpp: ebb always applies the chat template");
}

ResolvedChatTemplate resolve_chat_template(ChatTemplateArgs& t, const Engine& e, bool quiet) {
  if (t.jinja && !quiet) std::fprintf(stderr, "note: --jinja is implied: ebb always applies the chat template\n");
  const std::string& arch = e.config().arch_name;
  if (t.spec.empty()) {
    std::string note;
    ChatRenderer r = ChatRenderer::for_model(e.model().chat_template(), arch, e.tokenizer(), &note);
    if (!note.empty() && !quiet) std::fprintf(stderr, "note: %s\n", note.c_str());
    std::string source = r.is_jinja()                       ? "the model's tokenizer.chat_template"
                         : e.model().chat_template().empty() ? "the model has no chat template; chosen by its architecture"
                                                             : "the model's template does not parse; recognised in it";
    return {std::move(r), std::move(source)};
  }
  if (auto f = parse_chat_format(t.spec)) return {ChatRenderer(*f, arch), "--format"};
  std::error_code ec;
  if (!std::filesystem::is_regular_file(t.spec, ec)) {
    throw UsageError("--chat-template '" + t.spec +
                     "' is neither a format (chatml, llama3, llama2, plain) nor a template file");
  }
  t.file = t.spec;
  t.text = read_bounded_text(t.file, 1u << 20, "--chat-template");
  try {
    return {ChatRenderer::from_source(t.text, arch, e.tokenizer()), t.file};
  } catch (const Error& err) {
    throw UsageError("--chat-template '" + t.file + "': " + err.what());
  }
}

std::string read_bounded_text(const std::string& path, uint64_t max_bytes, const std::string& what) {
  const bool std_in = path == "-";
  FILE* f = std_in ? stdin : std::fopen(path.c_str(), "rb");
  if (!f) throw Error(what + " '" + path + "': cannot open (" + std::strerror(errno) + ")");
  struct stat sb {};
  if (::fstat(::fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
    std::fclose(f);
    throw Error(what + " '" + path + "' is a directory; give a text file, or - for standard input");
  }
  std::string text;
  char buf[65536];
  size_t n;
  bool over = false;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    if (text.size() + n > max_bytes) {
      over = true;
      break;
    }
    text.append(buf, n);
  }
  const bool failed = !over && std::ferror(f);
  if (!std_in) std::fclose(f);
  if (over && what != "--file") {
    throw Error(what + " '" + path + "' is larger than " + format_bytes(max_bytes) + ", the most it may have");
  }
  if (over) {
    throw Error(what + " '" + path + "': the prompt file is larger than the context can hold (more than " +
                format_bytes(max_bytes) + "; the context holds " + std::to_string(max_bytes / kPromptBytesPerToken) +
                " tokens: raise --ctx, or give a shorter file)");
  }
  if (failed) throw Error(what + " '" + path + "': read error");
  return text;
}

int64_t context_of(const ModelArgs& a, const Engine& e) {
  if (a.ctx > 0) return a.ctx;
  const int64_t train = e.config().n_ctx_train;
  return train > 0 ? std::min<int64_t>(train, 4096) : 4096;
}

std::string closest_name(const std::string& unknown, const std::vector<std::string>& known) {
  auto strip = [](const std::string& s) { return s.substr(std::min(s.find_first_not_of('-'), s.size())); };
  const std::string u = strip(unknown);
  if (u.empty()) return "";
  // A short flag the command does not have (-r in bench): the one long
  // option that starts with its letter (--reps), if only one does.
  if (unknown.size() == 2 && unknown[0] == '-') {
    std::string only;
    int n = 0;
    for (const std::string& name : known)
      if (name.size() > 3 && name.compare(0, 2, "--") == 0 && name[2] == unknown[1]) only = name, ++n;
    if (n == 1) return only;
  }
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& name : known) {
    const std::string k = strip(name);
    if (k.empty()) continue;
    // Levenshtein distance, one row at a time.
    std::vector<size_t> row(k.size() + 1);
    for (size_t j = 0; j <= k.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= u.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= k.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (u[i - 1] == k[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    size_t d = row[k.size()];
    // --temperature for --temp, --thread for --threads: one is a prefix of the other.
    const bool prefix = k.size() >= 3 && u.size() >= 3 &&
                        (u.compare(0, k.size(), k) == 0 || k.compare(0, u.size(), u) == 0);
    if (prefix) d = std::min<size_t>(d, 1);
    const size_t close = std::max<size_t>(2, std::min(u.size(), k.size()) / 3);
    if (d <= close && d < best_d) {
      best_d = d;
      best = name;
    }
  }
  return best;
}

int resolve_threads(int threads) {
  if (threads < 0) throw UsageError("--threads " + std::to_string(threads) + ": must be >= 0 (0: all hardware threads)");
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads == 0) return hw;
  if (threads > hw) {
    std::fprintf(stderr,
                 "note: --threads %d is more than the %d hardware threads; using %d (more would only wait and slow "
                 "every step down)\n",
                 threads, hw, hw);
    return hw;
  }
  return threads;
}

int64_t max_tokens_of(int64_t n_predict) {
  if (n_predict < -1)
    throw UsageError("-n " + std::to_string(n_predict) + ": must be >= 0, or -1 for \"until a stop or the context ends\"");
  return n_predict == -1 ? std::numeric_limits<int64_t>::max() : n_predict;
}

void resolve_seed(SamplerOptions& s) {
  if (s.seed != 0 || s.temperature == 0.0f) return;
  std::random_device rd;
  do {
    s.seed = ((uint64_t{rd()} << 32) | rd()) & ((uint64_t{1} << 63) - 1);  // fits --seed's int64
  } while (s.seed == 0);
  std::fprintf(stderr, "seed %llu (random; --seed %llu repeats this run)\n", static_cast<unsigned long long>(s.seed),
               static_cast<unsigned long long>(s.seed));
}

int gpu_layers_of(const ModelArgs& a) {
  const std::string& v = a.n_gpu_layers;
  if (v.empty() || v == "auto") return -1;
  size_t used = 0;
  long n = -1;
  try {
    n = std::stol(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || n < 0)
    throw UsageError("--n-gpu-layers " + v + ": must be >= 0 (a number of layers) or auto");
  return static_cast<int>(std::min<long>(n, 1 << 20));
}

std::string resolve_device(const ModelArgs& a) {
  if (!a.device.empty()) return a.device;
  // llama.cpp's -ngl N alone (N > 0, or auto): the first GPU.
  return !a.n_gpu_layers.empty() && gpu_layers_of(a) != 0 ? "vulkan" : "cpu";
}

namespace {

void validate(const ModelArgs& a) {
  if (a.ctx < 0) throw UsageError("--ctx " + std::to_string(a.ctx) + ": must be >= 0 (0: min(training context, 4096))");
  if (a.batch <= 0) throw UsageError("--batch " + std::to_string(a.batch) + ": must be >= 1");
  if (a.kv_chunk < 0)
    throw UsageError("--kv-chunk " + std::to_string(a.kv_chunk) + ": must be >= 1 (or 0: sized from the context)");
  if (a.memory_budget.empty() && !a.budget_system.empty())
    throw UsageError("--budget-system only applies with --memory-budget SIZE");
  if (a.budget_window <= 0) throw UsageError("--budget-window " + std::to_string(a.budget_window) + ": must be >= 1");
  const int ngl = gpu_layers_of(a);
  if (!a.device.empty() && a.device != "cpu" && a.device != "vulkan" && a.device.rfind("vulkan:", 0) != 0)
    throw UsageError("--device '" + a.device + "' is not one of cpu, vulkan, vulkan:N");
  if (a.device == "cpu" && !a.n_gpu_layers.empty() && ngl != 0)
    throw UsageError("-ngl " + a.n_gpu_layers + " puts layers on a GPU, but --device cpu asks for none");
  if (!a.device.empty() && a.device != "cpu" && ngl == 0)
    throw UsageError("-ngl 0 puts no layer on the device, but --device " + a.device + " asks for it");
  if (!a.device_memory.empty() && resolve_device(a) == "cpu")
    throw UsageError("--device-memory " + a.device_memory + " applies to a device (--device vulkan, -ngl auto)");
  if (!a.device_memory.empty() && ngl > 0)
    throw UsageError("--device-memory " + a.device_memory + " sizes -ngl auto, but -ngl " + a.n_gpu_layers +
                     " fixes the layers");
  if (a.quiet) return;
  if (!a.flash_attn.empty() && a.flash_attn != "off")
    std::fprintf(stderr, "note: -fa/--flash-attn is ignored: ebb's attention always streams the KV in one fused pass\n");
  if (a.mlock) std::fprintf(stderr, "note: --mlock is ignored: elastic memory decides what stays in RAM (--memory-limit)\n");
  if (a.no_mmap) std::fprintf(stderr, "note: --no-mmap is ignored: ebb reads the weights into its own memory\n");
}

// "loading MODEL: 45% (540/1200 MB)" while the weights are read, once the
// load has run for `after` seconds: in place on a terminal (at most ten
// updates a second), plain lines every 10% otherwise; the terminal line is
// cleared when the load ends.
class LoadProgress {
 public:
  LoadProgress(const std::string& path, double after) : name_(path), after_(after), tty_(::isatty(STDERR_FILENO)) {}
  LoadProgress(const LoadProgress&) = delete;
  LoadProgress& operator=(const LoadProgress&) = delete;
  ~LoadProgress() {
    if (shown_ && tty_) std::fprintf(stderr, "\r\033[K");
  }

  void operator()(uint64_t done, uint64_t total) {
    const double now = clock_.seconds();
    if (total == 0 || now < after_) return;
    const int pct = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
    if (tty_ ? (now - last_ < 0.1 && done < total) : (shown_ && pct / 10 == last_pct_ / 10 && done < total)) return;
    last_ = now;
    last_pct_ = pct;
    const int digits = total < 100'000'000 ? 1 : 0;  // "0.3/1.1 MB", "540/1200 MB"
    std::fprintf(stderr, "%sloading %s: %d%% (%.*f/%.*f MB)%s", tty_ ? "\r\033[K" : "", name_.c_str(), pct, digits,
                 static_cast<double>(done) / 1e6, digits, static_cast<double>(total) / 1e6, tty_ ? "" : "\n");
    std::fflush(stderr);
    shown_ = true;
  }

 private:
  std::string name_;
  double after_;
  bool tty_;
  Stopwatch clock_;
  bool shown_ = false;
  double last_ = -1;
  int last_pct_ = -1;
};

// Memory the process needs beside what the engine's limit caps (the binary,
// libraries, tokenizer, thread stacks, allocator slack).
constexpr uint64_t kProcessAllowance = 8ull << 20;

// --memory-limit, or by default the cgroup's limit less what the process
// needs beside weights and KV, so a chat in a small cgroup evicts and streams
// instead of being killed.
void apply_memory_limit(Engine& e, const ModelArgs& a, uint64_t weights) {
  if (a.memory_limit == "off") return;
  if (e.device()) {  // the device's limit caps device and host memory together (DeviceForward::set_memory_limit)
    if (a.memory_limit.empty()) return;  // no cgroup default: a device's memory is not the cgroup's
    const Footprint f = e.footprint();
    const uint64_t of = f.weights() + f.kv() + f.device->weights() + f.device->kv;  // a percentage: of weights and KV
    try {
      e.set_memory_limit(parse_size(a.memory_limit, of));
    } catch (const UsageError&) {
      throw;
    } catch (const Error& x) {
      throw UsageError(std::string("--memory-limit: ") + x.what());
    }
    return;
  }
  if (!a.memory_limit.empty()) {
    if (!e.elastic()) throw UsageError("--memory-limit needs elastic memory, which budget mode turns off; use --memory-budget alone");
    const uint64_t bytes = parse_size(a.memory_limit, weights);
    e.set_memory_limit(bytes);
    return;
  }
  const std::optional<CgroupMemoryLimit> cg = cgroup_memory_limit(a.cgroup_root);
  if (!cg) return;
  if (!e.elastic()) {
    if (e.options().budget.budget > cg->bytes) {
      std::fprintf(stderr, "ebb: warning: --memory-budget %s is over this process's cgroup limit %s (%s)\n",
                   format_bytes(e.options().budget.budget).c_str(), format_bytes(cg->bytes).c_str(), cg->file.c_str());
    }
    return;
  }
  const Footprint f = e.footprint();
  const uint64_t beside = f.globals + f.scratch + kProcessAllowance;
  if (cg->bytes <= beside) {
    std::fprintf(stderr,
                 "ebb: warning: the cgroup memory limit %s (%s) is below what the process needs beside weights and "
                 "KV (%s); it may be killed\n",
                 format_bytes(cg->bytes).c_str(), cg->file.c_str(), format_bytes(beside).c_str());
    return;
  }
  const uint64_t limit = cg->bytes - beside;
  e.set_memory_limit(limit);
  if (a.quiet) return;
  std::fprintf(stderr,
               "note: cgroup v%d memory limit %s (%s): weights and KV in RAM are kept within %s; what does not fit "
               "is streamed or evicted (--memory-limit SIZE|off overrides)\n",
               cg->version, format_bytes(cg->bytes).c_str(), cg->file.c_str(), format_bytes(limit).c_str());
}

uint64_t weight_bytes(const std::string& path) {
  uint64_t weights = 0;
  // The file stays open through the loop (a temporary's tensors() would dangle).
  const std::unique_ptr<GgufFile> gguf = GgufFile::open(path);
  for (const GgufTensorInfo& t : gguf->tensors()) weights += t.n_bytes;
  return weights;
}

}  // namespace

void print_device(const Engine& e) {
  const Footprint f = e.footprint();
  if (!f.device) return;
  const DeviceFootprint& d = *f.device;
  std::fprintf(stderr,
               "device: %s (%s) holds weights %s, output head %s, KV %s, adapters %s, scratch %s (ledger: %s in %llu "
               "buffers, %llu slabs of %s) | RAM holds the embedding %s, scratch %s%s\n",
               d.id.c_str(), d.name.c_str(), format_bytes(d.weights()).c_str(), format_bytes(d.globals).c_str(),
               format_bytes(d.kv).c_str(), format_bytes(d.adapters).c_str(), format_bytes(d.scratch).c_str(), format_bytes(d.ledger.buffer_bytes).c_str(),
               static_cast<unsigned long long>(d.ledger.n_buffers), static_cast<unsigned long long>(d.ledger.n_slabs),
               format_bytes(d.ledger.slab_bytes).c_str(), format_bytes(f.globals).c_str(),
               format_bytes(f.scratch).c_str(),
               f.weights() + f.kv() > 0  // a split: the CPU's layers
                   ? (", the CPU's layers " + format_bytes(f.weights()) + " and their KV " + format_bytes(f.kv())).c_str()
                   : "");
}

EngineOptions engine_options(const ModelArgs& a) {
  validate(a);
  EngineOptions o;
  o.model_path = a.model;
  o.n_threads = resolve_threads(a.threads);
  if (!a.isa.empty()) {
    auto isa = parse_isa(a.isa);
    if (!isa) throw UsageError("--isa '" + a.isa + "' is not one of scalar, avx2, avx512, neon, ref-engine");
    o.isa = *isa;
  }
  o.device = resolve_device(a);
  o.n_gpu_layers = gpu_layers_of(a);
  if (!a.device_memory.empty()) {
    if (a.device_memory.back() == '%')
      throw UsageError("--device-memory " + a.device_memory + ": give bytes (4G, 900MiB), not a percentage");
    o.device_memory = parse_size(a.device_memory, 0);
    if (o.device_memory == 0) throw UsageError("--device-memory " + a.device_memory + ": must be more than 0 bytes");
  }
  o.device_context = a.ctx;
  o.prefill_batch = a.batch;
  o.kv_chunk_size = a.kv_chunk;
  if (!a.memory_budget.empty()) {
    const uint64_t weights = weight_bytes(a.model);
    o.budget.budget = parse_size(a.memory_budget, weights);
    const std::string system = a.budget_system.empty() ? "ebb" : a.budget_system;
    auto sys = parse_budget_system(system);
    if (!sys) throw UsageError("--budget-system '" + system + "' is not one of ebb, sync, prefetch, unbalanced, attn-first, ffn-first, mmap");
    o.budget.system = *sys;
    o.budget.window = a.budget_window;
    o.budget.n_ctx = a.ctx;
    o.budget.kv_elem_bytes = a.kv_type == "f32" ? 4 : 2;
  }
  o.elastic_opts.swap_dir = a.swap_dir;
  o.prefix_cache = a.prefix_cache || !a.cache_dir.empty();
  o.cache_dir = a.cache_dir;
  if (a.kv_codec == "none") {
    o.elastic_opts.lossless_kv = true;
  } else {
    o.elastic_opts.codec = parse_kv_codec(a.kv_codec);
  }
  o.elastic_opts.order = parse_evict_order(a.evict_order);
  o.elastic_opts.overlap = parse_overlap_mode(a.overlap);
  o.elastic_opts.profile = load_profile_option(a.profile);
  return o;
}

std::unique_ptr<Engine> make_engine(const ModelArgs& a, double* load_seconds) {
  const EngineOptions o = engine_options(a);
  const uint64_t weights = weight_bytes(a.model);
  const Stopwatch clock;
  std::unique_ptr<Engine> e;
  try {
    LoadProgress progress(std::filesystem::path(a.model).filename().string(), a.progress_after);
    EngineOptions with_progress = o;
    if (!a.quiet) with_progress.load_progress = [&progress](uint64_t done, uint64_t total) { progress(done, total); };
    e = std::make_unique<Engine>(with_progress);
  } catch (const std::bad_alloc&) {
    throw Error("out of memory while loading " + a.model + " (" + format_bytes(weights) +
                " of weights): free memory, or keep the model within a budget with --memory-budget SIZE");
  } catch (const std::system_error& err) {
    throw Error("the system refused memory or threads while loading " + a.model + " (" + err.what() +
                "): lower --threads, free memory, or use --memory-budget SIZE");
  }
  if (const DeviceForward* d = e->device(); d && !a.quiet && !d->converted().empty()) {
    std::string formats;
    for (const std::string& f : d->converted()) formats += (formats.empty() ? "" : ", ") + f;
    std::fprintf(stderr, "note: %s has no matrix kernels for %s: those weights were dequantised to F16 at load\n",
                 d->device().id.c_str(), formats.c_str());
  }
  if (const DevicePlan* p = e->device_plan(); p && !a.quiet)
    std::fprintf(stderr, "%s\n", p->summary(e->device_id()).c_str());
  for (const std::string& f : a.lora) e->adapters().load(f);
  for (size_t i = 0; i + 1 < a.lora_scaled.size(); i += 2) e->adapters().load(a.lora_scaled[i]);
  if (load_seconds) *load_seconds = clock.seconds();
  apply_memory_limit(*e, a, weights);
  const int64_t train_ctx = e->config().n_ctx_train;
  if (a.ctx > 0 && train_ctx > 0 && a.ctx > train_ctx) {
    std::fprintf(stderr,
                 "ebb: warning: --ctx %lld is beyond the %lld tokens %s was trained on; past them the model's "
                 "answers degrade\n",
                 static_cast<long long>(a.ctx), static_cast<long long>(train_ctx), e->config().name.c_str());
  }
  if (a.verbose && e->device()) print_device(*e);
  if (a.verbose) {
    std::fprintf(stderr,
                 "config: %s (%s, %lld layers, trained on %lld tokens) | %s x%d threads | context %lld | kv %s, chunks "
                 "of %lld | prefill batch %lld | elastic memory %s | prefix cache %s%s%s | loaded in %.2f s\n",
                 a.model.c_str(), e->config().arch_name.c_str(), static_cast<long long>(e->config().n_layer),
                 static_cast<long long>(train_ctx), std::string(isa_name(e->isa())).c_str(), e->pool().size(),
                 static_cast<long long>(context_of(a, *e)), a.kv_type.c_str(),
                 static_cast<long long>(a.kv_chunk > 0 ? a.kv_chunk : e->session_chunk_size(context_of(a, *e))),
                 static_cast<long long>(a.batch), e->elastic() ? "on" : e->device() ? "on the device (evict, restore, limit)" : "off (budget mode)",
                 o.prefix_cache ? "on" : "off", o.cache_dir.empty() ? "" : " in ", o.cache_dir.c_str(), clock.seconds());
  }
  return e;
}

DeviceProfile load_profile_option(const std::string& path) {
  return path.empty() ? load_profile_or_defaults(default_profile_path()) : DeviceProfile::load(path);
}

std::vector<AdapterBinding> adapter_bindings(const ModelArgs& a) {
  std::vector<AdapterBinding> b;
  for (const std::string& f : a.lora) b.push_back({adapter_name_of(f), 1.0f});
  if (a.lora_scaled.size() % 2 != 0) throw UsageError("--lora-scaled takes two values: FILE SCALE");
  for (size_t i = 0; i + 1 < a.lora_scaled.size(); i += 2) {
    const std::string& v = a.lora_scaled[i + 1];
    char* end = nullptr;
    const float scale = std::strtof(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(scale)) {
      throw UsageError("--lora-scaled " + a.lora_scaled[i] + " " + v + ": the scale must be a number");
    }
    b.push_back({adapter_name_of(a.lora_scaled[i]), scale});
  }
  // One file named twice: the last scale counts.
  for (size_t i = 0; i < b.size(); ++i)
    for (size_t j = i + 1; j < b.size(); ++j)
      if (b[i].name == b[j].name) {
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(i));
        --i;
        break;
      }
  return b;
}

SessionOptions session_options(const ModelArgs& a) {
  SessionOptions s;
  s.n_ctx = a.ctx;
  s.kv_chunk_size = a.kv_chunk;
  if (a.kv_type == "f16") {
    s.kv_type = DType::kF16;
  } else if (a.kv_type == "f32") {
    s.kv_type = DType::kF32;
  } else {
    throw Error("--kv-type '" + a.kv_type + "' is not one of f16, f32");
  }
  s.f16_attention = a.f16_attention;
  s.cache_namespace = a.cache_namespace;
  return s;
}

std::string format_bytes(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(uint64_t{1} << 30));
  } else if (b >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(uint64_t{1} << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}

MemoryView memory_view(const Engine& e) {
  const Footprint f = e.footprint();
  MemoryView m;
  m.weights = f.weights() + f.globals;
  m.kv = f.kv();
  m.scratch = f.scratch;
  m.adapters = f.adapters;
  m.total = f.total();
  if (e.budget_source()) {
    // Budget mode keeps its resident layers and globals in buffers of its
    // own, which the ledger counts but the model's units do not.
    const uint64_t held = static_cast<uint64_t>(e.ledger().bytes(MemCategory::kWeights) +
                                                e.ledger().bytes(MemCategory::kGlobals));
    if (held > m.weights) {
      m.total += held - m.weights;
      m.weights = held;
    }
  }
  return m;
}

std::string summary_line(const Engine& e, const GenerateStats& st, double load_seconds) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (TokenId t : st.tokens) h = (h ^ static_cast<uint32_t>(t)) * 0x100000001b3ull;
  const MemoryView m = memory_view(e);
  char load[64] = "";
  if (load_seconds >= 0) std::snprintf(load, sizeof load, "load %.2f s | ", load_seconds);
  char adapters[64] = "";
  if (m.adapters > 0) std::snprintf(adapters, sizeof adapters, ", adapters %s", format_bytes(m.adapters).c_str());
  // Where it ran: the CPU target and threads, or the device and what it holds.
  char where[256];
  if (const DeviceForward* d = e.device()) {
    const DeviceFootprint f = d->footprint();
    std::snprintf(where, sizeof where, "%s holds %s (weights %s, kv %s%s%s)", f.id.c_str(),
                  format_bytes(f.total()).c_str(), format_bytes(f.weights() + f.globals).c_str(),
                  format_bytes(f.kv).c_str(), f.adapters > 0 ? ", adapters " : "",
                  f.adapters > 0 ? format_bytes(f.adapters).c_str() : "");
  } else {
    std::snprintf(where, sizeof where, "%s x%d", std::string(isa_name(e.isa())).c_str(),
                  const_cast<Engine&>(e).pool().size());
  }
  char buf[960];
  std::snprintf(buf, sizeof buf,
                "%sprompt %lld tok %.1f tok/s | gen %lld tok %.1f tok/s | ttft %.1f ms | mem %s (weights %s, kv %s, "
                "scratch %s%s) | %s | stop %s | hash %016llx",
                load, static_cast<long long>(st.prompt_tokens), st.prefill_tok_s(),
                static_cast<long long>(st.generated_tokens), st.decode_tok_s(), st.ttft_seconds * 1e3,
                format_bytes(m.total).c_str(), format_bytes(m.weights).c_str(), format_bytes(m.kv).c_str(),
                format_bytes(m.scratch).c_str(), adapters, where, std::string(stop_reason_name(st.stop)).c_str(),
                static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace ebb::cli
