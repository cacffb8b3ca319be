// Causal attention that streams a layer's KV chunk table in one pass with
// online softmax; chunks are never copied into a contiguous buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cpu.h"
#include "kernels/tensor.h"

namespace ebb {

class ThreadPool;

// One KV chunk of one layer. Both arrays hold chunk_size token slots:
//   k: [chunk_size, n_kv_heads, head_dim] in kv_type
//   v: [chunk_size, n_kv_heads, head_dim] in kv_type
struct KvChunkRef {
  const void* k = nullptr;
  const void* v = nullptr;
};

struct AttentionArgs {
  const float* q = nullptr;  // [n_q, n_heads, head_dim]
  float* out = nullptr;      // [n_q, n_heads, head_dim]; may be the same buffer as q
  int64_t n_q = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // n_heads % n_kv_heads == 0 (grouped-query attention)
  int64_t head_dim = 0;
  // Absolute position of query row 0. Query row i attends to KV positions
  // [0, pos0 + i]; the KV of all those positions is already in the chunks.
  int64_t pos0 = 0;
  const KvChunkRef* chunks = nullptr;  // ceil((pos0 + n_q) / chunk_size) entries
  int64_t chunk_size = 256;
  DType kv_type = DType::kF16;  // kF16 or kF32
  // F16 KV only: the reference engine's half-precision arithmetic (see
  // attention()) instead of F32.
  bool f16_accumulator = false;
  float scale = 1.0f;           // applied to q.k, usually 1 / sqrt(head_dim)
  float* scratch = nullptr;     // attention_scratch_floats(pool.size(), ...) floats, any alignment
};

// Floats of scratch attention() needs with a pool of n_threads threads: one
// disjoint slice per thread (query rows, accumulators and a score block of a
// work item). It does not grow with n_q or the context.
size_t attention_scratch_floats(int64_t n_threads, int64_t head_dim, int64_t chunk_size);

// out[i][h] = softmax_j(scale * q[i][h] . k[j][h / group]) . v[j][h / group],
// j <= pos0 + i, group = n_heads / n_kv_heads. Nothing is allocated.
//
// The arithmetic:
//
// F32 (kF32 KV, or kF16 KV widened as it is read): full precision. F32
//   scores, an F32 online softmax over blocks of positions and an F32
//   accumulator. Work is split over the pool's threads by (KV head, query
//   tile), and over the context too when that gives fewer items than threads
//   (decode with few KV heads; partials merged in F32). The default.
//
// kF16 KV with f16_accumulator: half-precision attention, computing like the
//   reference engine we validate logits against (its CPU attention with an
//   F16 KV cache works in half precision; our F32 result differs from it by
//   more than the acceptance tolerance, emulating it brings us within). It
//   is sequential per position and slower. For each query row and head:
//     qh = f16(q)                      (every element rounded, RNE)
//     m = -inf, l = 0, acc[head_dim] = 0
//     for each position j = 0 .. pos0 + i, in order:
//       s = (qh . k[j]) * scale        (F16 values multiplied as floats, F32 sum)
//       if s > m: ms = e^(m - s), m = s, acc = f16(acc * ms), vs = 1
//       else:     ms = 1,         vs = e^(s - m)
//       acc = f16(fma(vs, v[j], acc))   (elementwise, one rounding to float)
//       l = l * ms + vs                (F32)
//     out = acc * (1 / l)              (F32)
//   f16(x) is x rounded to the nearest F16 value (RNE; an accumulator past the
//   F16 range becomes inf, as the reference's would). So the accumulator has
//   half precision (11 significant bits) and, the definition being sequential,
//   the result does not depend on chunk size, blocking or thread count. The
//   context of one (query, head) is never split across threads; with fewer
//   (KV head, query tile) items than threads, items take fewer query heads.
//   Targets agree to a few F16 ulps (exp approximation, FMA rounding).
//
// Targets: kAvx512 runs AVX-512 block kernels when head_dim is a multiple of
// 16; kAvx2, and kAvx512 for the other multiples of 8, the AVX2 ones;
// everything else the scalar ones (there are no NEON attention kernels yet).
// The scalar kernels implement the definitions above in plain code and are
// the reference.
void attention(Isa isa, const AttentionArgs& args, ThreadPool& pool);

// Several independent calls (the sequences of one step, each over its own
// chunks) in as few pool dispatches as their work allows. One call: exactly
// attention(). Two or more: each decode call (n_q == 1, F32 arithmetic,
// n_heads <= 64) sweeps its whole context on one thread (attention()'s
// sweep over a single range), and every other call computes as in
// attention() (whole items; a sweep or split-K there runs as its own call).
// So a decode call's output does not depend on the other calls or on the
// thread count, and differs from the same call alone by rounding only
// (another cut of the online softmax); any other call's is attention()'s. Up to 64 calls share
// a dispatch; args of one head_dim may share one scratch (one slice per thread).
void attention_batch(Isa isa, std::span<const AttentionArgs> args, ThreadPool& pool);

}  // namespace ebb
