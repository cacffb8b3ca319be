#include "bench/bench_speed.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "platform/error.h"
#include "platform/membw.h"
#include "platform/timer.h"
#include "runtime/session.h"
#include "runtime/stats.h"

namespace ebb {
namespace {

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// P token ids drawn uniformly from the vocabulary's ordinary (non-control,
// non-end-of-generation) tokens, the same for every rep.
std::vector<TokenId> make_prompt(const Tokenizer& tok, int64_t n, uint64_t seed) {
  std::vector<TokenId> ordinary;
  for (TokenId t = 0; t < tok.n_vocab(); ++t) {
    if (!tok.is_control(t) && !tok.is_eog(t)) ordinary.push_back(t);
  }
  if (ordinary.empty()) throw Error("bench speed: the vocabulary has no ordinary (non-control) tokens");
  std::vector<TokenId> ids(static_cast<size_t>(n));
  uint64_t state = seed;
  for (TokenId& t : ids) t = ordinary[splitmix64(&state) % ordinary.size()];
  return ids;
}

TokenId argmax(std::span<const float> logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

uint64_t slot_elements(const TensorSlot& s) {
  uint64_t n = 1;
  for (int64_t d : s.dims) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

void count_streamed_bytes(const Model& model, SpeedResult* r) {
  std::map<DType, uint64_t> by_type;
  uint64_t flops = 0;
  r->layer_bytes = 0;
  for (int l = 0; l < model.n_layers(); ++l) {
    const WeightUnit& u = model.layer_unit(l);
    r->layer_bytes += u.bytes();
    for (const TensorSlot& s : u.slots()) {
      by_type[s.type] += s.unit_bytes;
      if (s.dims.size() >= 2) flops += 2 * slot_elements(s);
    }
  }
  const WeightView head = model.globals().output;
  r->output_head_bytes = static_cast<uint64_t>(head.rows) * head.row_stride;
  by_type[head.type] += r->output_head_bytes;
  flops += 2 * static_cast<uint64_t>(head.rows) * static_cast<uint64_t>(head.cols);
  r->model_bytes = r->layer_bytes + r->output_head_bytes;
  r->matmul_flops_per_token = flops;
  r->bytes_by_type.assign(by_type.begin(), by_type.end());
  std::stable_sort(r->bytes_by_type.begin(), r->bytes_by_type.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
}

SpeedResult bench_speed(Engine& engine, const SpeedOptions& opts) {
  if (opts.prompt_tokens < 1) throw Error("bench speed: prompt tokens must be >= 1, got " + std::to_string(opts.prompt_tokens));
  if (opts.gen_tokens < 1) throw Error("bench speed: generated tokens must be >= 1, got " + std::to_string(opts.gen_tokens));
  if (opts.reps < 1) throw Error("bench speed: reps must be >= 1, got " + std::to_string(opts.reps));
  const int64_t need = opts.prompt_tokens + opts.gen_tokens + 1;
  if (opts.n_ctx != 0 && opts.n_ctx < need) {
    throw Error("bench speed: a context of " + std::to_string(opts.n_ctx) + " tokens cannot hold " +
                std::to_string(opts.prompt_tokens) + " prompt + " + std::to_string(opts.gen_tokens) +
                " generated tokens + 1 (needs " + std::to_string(need) + ")");
  }

  SpeedResult r;
  count_streamed_bytes(engine.model(), &r);
  r.threads = engine.pool().size();
  r.isa = engine.isa();
  r.prompt_tokens = opts.prompt_tokens;
  r.gen_tokens = opts.gen_tokens;
  r.reps = opts.reps;
  r.n_ctx = opts.n_ctx != 0 ? opts.n_ctx : need;
  r.prefill_batch = std::min(engine.forward().max_batch(), opts.prompt_tokens);
  r.llc_bytes = last_level_cache_bytes();

  // The machine's bound, on the same threads the engine computes with.
  if (opts.membw_bytes > 0) {
    const ReadBandwidth bw = measure_read_bandwidth(engine.pool(), opts.membw_bytes, opts.membw_reps);
    r.mem_bw_gbps = bw.median_gbps;
    r.mem_bw_gbps_reps = bw.reps_gbps;
    r.mem_bw_bytes = bw.bytes;
  }

  const std::vector<TokenId> prompt = make_prompt(engine.tokenizer(), opts.prompt_tokens, opts.seed);
  SessionOptions so;
  so.n_ctx = r.n_ctx;
  so.kv_chunk_size = opts.kv_chunk_size;
  so.kv_type = opts.kv_type;

  for (int64_t rep = 0; rep <= opts.reps; ++rep) {  // rep 0: warm-up, not counted
    if (opts.progress) opts.progress(rep, opts.reps);
    Session session(engine, so);
    session.set_adapters(opts.adapters);

    const double t0 = now_seconds();
    std::span<const float> logits = session.feed(prompt);
    const double prefill_s = now_seconds() - t0;

    TokenId next = argmax(logits);
    const double t1 = now_seconds();
    for (int64_t i = 0; i < opts.gen_tokens; ++i) {
      logits = session.feed(std::span<const TokenId>(&next, 1));
      next = argmax(logits);
    }
    const double decode_s = now_seconds() - t1;

    if (rep == 0) continue;
    r.prefill_seconds_reps.push_back(prefill_s);
    r.decode_seconds_reps.push_back(decode_s);
    r.prefill_tok_s_reps.push_back(prefill_s > 0 ? opts.prompt_tokens / prefill_s : 0);
    r.decode_tok_s_reps.push_back(decode_s > 0 ? opts.gen_tokens / decode_s : 0);
  }
  r.prefill_tok_s = median(r.prefill_tok_s_reps);
  r.decode_tok_s = median(r.decode_tok_s_reps);

  r.achieved_gbps = static_cast<double>(r.model_bytes) * r.decode_tok_s / 1e9;
  r.prefill_gflops = static_cast<double>(r.matmul_flops_per_token) * r.prefill_tok_s / 1e9;
  if (r.mem_bw_gbps > 0 && r.model_bytes > 0) {
    r.achieved_fraction = r.achieved_gbps / r.mem_bw_gbps;
    r.decode_roofline_tok_s = r.mem_bw_gbps * 1e9 / static_cast<double>(r.model_bytes);
    const int64_t passes = (opts.prompt_tokens + r.prefill_batch - 1) / r.prefill_batch;
    r.prefill_roofline_tok_s = r.decode_roofline_tok_s * static_cast<double>(opts.prompt_tokens) / passes;
  }
  return r;
}

}  // namespace ebb
