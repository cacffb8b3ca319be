// Causal attention that streams a layer's KV chunk table in one pass with
// online softmax; chunks are never copied into a contiguous buffer.
#pragma once

#include <cstddef>
#include <cstdint>

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
  float scale = 1.0f;           // applied to q.k, usually 1 / sqrt(head_dim)
  float* scratch = nullptr;     // attention_scratch_floats(pool.size(), ...) floats, any alignment
};

// Floats of scratch attention() needs with a pool of n_threads threads: one
// disjoint slice per thread (query rows, accumulators and a score block of a
// work item). It does not grow with n_q or the context.
size_t attention_scratch_floats(int64_t n_threads, int64_t head_dim, int64_t chunk_size);

// out[i][h] = softmax_j(scale * q[i][h] . k[j][h / group]) . v[j][h / group],
// j <= pos0 + i, group = n_heads / n_kv_heads. Work is split over the pool's
// threads by (KV head, query tile), and over the context too when that gives
// fewer items than threads (decode with few KV heads); nothing is allocated.
// Targets: kAvx2 and kAvx512 run the AVX2 block kernels when head_dim is a
// multiple of 8, everything else the scalar ones (there are no NEON or
// AVX-512-specific attention kernels yet).
void attention(Isa isa, const AttentionArgs& args, ThreadPool& pool);

}  // namespace ebb
