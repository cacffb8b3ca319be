#include "bench/batch_rep.h"

#include <algorithm>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "platform/timer.h"
#include "runtime/batch.h"
#include "runtime/session.h"

namespace ebb::cli {
namespace {

TokenId argmax(std::span<const float> x) {
  return static_cast<TokenId>(std::max_element(x.begin(), x.end()) - x.begin());
}

}  // namespace

BatchRep run_batch_rep(Engine& e, int64_t streams, int64_t prompt, int64_t gen, int64_t kv_chunk, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t nv = e.config().n_vocab;
  SessionOptions so;
  so.n_ctx = prompt + gen + 8;
  so.kv_chunk_size = kv_chunk;
  so.use_prefix_cache = false;
  std::vector<std::unique_ptr<Session>> ss;
  std::vector<Session*> ptrs;
  double prefill_s = 0;
  for (int64_t i = 0; i < streams; ++i) {
    std::vector<TokenId> p(static_cast<size_t>(prompt));
    for (TokenId& t : p) t = static_cast<TokenId>(1 + rng() % static_cast<uint32_t>(nv - 1));
    ss.push_back(std::make_unique<Session>(e, so));
    const Stopwatch sw;
    ss.back()->feed(p);
    prefill_s += sw.seconds();
    ptrs.push_back(ss.back().get());
  }
  const Stopwatch sw;
  for (int64_t g = 0; g < gen; ++g) {
    for (Session* x : ptrs) {
      const TokenId t = argmax(x->last_logits());
      x->append({&t, 1});
    }
    run_step(e, ptrs);
  }
  const double decode_s = sw.seconds();
  BatchRep r;
  r.prefill_tok_s = static_cast<double>(streams * prompt) / prefill_s;
  r.decode_tok_s = static_cast<double>(streams * gen) / decode_s;
  return r;
}

}  // namespace ebb::cli
