#include "cli/options.h"

#include <cstdio>

#include "model/gguf.h"
#include "platform/error.h"

namespace ebb::cli {

void add_model_options(CLI::App* app, ModelArgs& a) {
  app->add_option("-m,--model", a.model, "GGUF model file")->required();
  app->add_option("-t,--threads", a.threads, "Compute threads (0: all hardware threads)")->capture_default_str();
  app->add_option("--isa", a.isa, "Force a kernel target: scalar, avx2, avx512, neon, or ref-engine (scalar, rounding in the order of the engine the golden logits come from; slow, for validation) (default: best available)");
  app->add_option("-c,--ctx", a.ctx, "Context size in tokens (0: min(training context, 4096))")->capture_default_str();
  app->add_option("--kv-chunk", a.kv_chunk, "Tokens per KV chunk")->capture_default_str();
  app->add_option("--kv-type", a.kv_type, "KV cache element type: f16 or f32")->capture_default_str();
  app->add_flag("--f16-attention", a.f16_attention,
                "F16 KV: accumulate attention in F16 position by position, as llama.cpp does (to compare logits "
                "with it; slower), instead of in F32");
  app->add_option("--batch", a.batch, "Prefill micro-batch in tokens")->capture_default_str();
  app->add_option("--memory-budget", a.memory_budget,
                  "Keep all LLM memory within this size, streaming weights that do not fit (600MiB, 1.5GiB, 40%)");
  app->add_option("--budget-system", a.budget_system,
                  "Budget mode system: ebb, sync, prefetch, unbalanced, attn-first, ffn-first, mmap")
      ->capture_default_str();
  app->add_option("--budget-window", a.budget_window, "Budget mode prefetch window in layers")->capture_default_str();
  app->add_option("--swap-dir", a.swap_dir, "Elastic memory: directory of swap files (default: ~/.cache/ebb/swap)");
  app->add_option("--kv-codec", a.kv_codec, "Elastic memory: codec of compressed KV: int8, int4")->capture_default_str();
  app->add_option("--evict-order", a.evict_order, "Elastic memory: backward, forward, random")->capture_default_str();
  app->add_option("--overlap", a.overlap, "Elastic memory restore overlap: none, alloc-reload, reload-prefill, full")
      ->capture_default_str();
  app->add_option("--profile", a.profile, "Device profile from `ebb profile` (default: the saved one)");
}

void add_sampling_options(CLI::App* app, SamplerOptions& s) {
  app->add_option("--temp", s.temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  app->add_option("--top-k", s.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  app->add_option("--top-p", s.top_p, "Keep the smallest set with this cumulative probability (1: off)")
      ->capture_default_str();
  app->add_option("--min-p", s.min_p, "Drop tokens below min-p x the top probability (0: off)")
      ->capture_default_str();
  app->add_option("--repeat-penalty", s.repeat_penalty, "Repetition penalty (1: off)")->capture_default_str();
  app->add_option("--frequency-penalty", s.frequency_penalty, "Frequency penalty (0: off)")->capture_default_str();
  app->add_option("--presence-penalty", s.presence_penalty, "Presence penalty (0: off)")->capture_default_str();
  app->add_option("--penalty-last-n", s.penalty_last_n, "Tokens of history the penalties look at")
      ->capture_default_str();
  app->add_option("--seed", s.seed, "Random seed (0: random)")->capture_default_str();
}

std::unique_ptr<Engine> make_engine(const ModelArgs& a) { return std::make_unique<Engine>(engine_options(a)); }

EngineOptions engine_options(const ModelArgs& a) {
  EngineOptions o;
  o.model_path = a.model;
  o.n_threads = a.threads;
  if (!a.isa.empty()) {
    auto isa = parse_isa(a.isa);
    if (!isa) throw Error("--isa '" + a.isa + "' is not one of scalar, avx2, avx512, neon, ref-engine");
    o.isa = *isa;
  }
  o.prefill_batch = a.batch;
  o.kv_chunk_size = a.kv_chunk;
  if (!a.memory_budget.empty()) {
    uint64_t weights = 0;
    for (const GgufTensorInfo& t : GgufFile::open(a.model)->tensors()) weights += t.n_bytes;
    o.budget.budget = parse_size(a.memory_budget, weights);
    auto sys = parse_budget_system(a.budget_system);
    if (!sys) throw Error("--budget-system '" + a.budget_system + "' is not one of ebb, sync, prefetch, unbalanced, attn-first, ffn-first, mmap");
    o.budget.system = *sys;
    o.budget.window = a.budget_window;
    o.budget.n_ctx = a.ctx;
    o.budget.kv_elem_bytes = a.kv_type == "f32" ? 4 : 2;
  }
  o.elastic_opts.swap_dir = a.swap_dir;
  o.elastic_opts.codec = parse_kv_codec(a.kv_codec);
  o.elastic_opts.order = parse_evict_order(a.evict_order);
  o.elastic_opts.overlap = parse_overlap_mode(a.overlap);
  o.elastic_opts.profile = load_profile_option(a.profile);
  return o;
}

DeviceProfile load_profile_option(const std::string& path) {
  return path.empty() ? load_profile_or_defaults(default_profile_path()) : DeviceProfile::load(path);
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

std::string summary_line(const Engine& e, const GenerateStats& st) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (TokenId t : st.tokens) h = (h ^ static_cast<uint32_t>(t)) * 0x100000001b3ull;
  const Footprint f = e.footprint();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "prompt %lld tok %.1f tok/s | gen %lld tok %.1f tok/s | ttft %.1f ms | mem %s (weights %s, kv %s, "
                "scratch %s) | %s x%d | stop %s | hash %016llx",
                static_cast<long long>(st.prompt_tokens), st.prefill_tok_s(),
                static_cast<long long>(st.generated_tokens), st.decode_tok_s(), st.ttft_seconds * 1e3,
                format_bytes(f.total()).c_str(), format_bytes(f.weights() + f.globals).c_str(),
                format_bytes(f.kv()).c_str(), format_bytes(f.scratch).c_str(), std::string(isa_name(e.isa())).c_str(),
                const_cast<Engine&>(e).pool().size(), std::string(stop_reason_name(st.stop)).c_str(),
                static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace ebb::cli
