// The block kernels attention() is built from, one table per target and KV
// element type. Internal to src/kernels.
//
// The driver (attention.cpp) owns tiling, threads, causal masking and the
// online-softmax state; these kernels only see dense blocks:
//   q rows:  nr rows of head_dim floats, contiguous, already multiplied by scale
//   k, v:    np positions of head_dim elements, `kv_stride` elements apart
//            (one KV head inside a [chunk_size, n_kv_heads, head_dim] chunk)
//   s:       nr rows of scores / probabilities, `s_stride` floats apart
//   acc:     nr rows of head_dim floats, contiguous
//
// F32 KV uses qk, softmax_step and pv (full F32 online softmax, a block at a
// time). F16 KV uses qk, seq_weights and pv_seq: the position-sequential
// half-precision semantics of attention.h, where the q rows are rounded to
// F16 and not scaled (seq_weights applies the scale).
#pragma once

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/tensor.h"

namespace ebb::detail {

struct AttnKernels {
  // s[r][j] = dot(q[r], k[j]) for r < nr, j < np.
  void (*qk)(const float* q, int nr, const void* k, int64_t kv_stride, int np, int64_t head_dim, float* s,
             int64_t s_stride) = nullptr;
  // One online-softmax step on one row of np scores of which the first
  // n_valid are visible (0 < n_valid <= np): with m' = max(m, max s[0..n_valid)),
  // s[j] = exp(s[j] - m') for j < n_valid and 0 after, l = l e^(m - m') + sum s,
  // m = m'. Returns the factor e^(m - m') the row's accumulator must take.
  float (*softmax_step)(float* s, int n_valid, int np, float* m, float* l) = nullptr;
  // acc[r] = acc[r] * corr[r] + sum_j p[r][j] * v[j] for r < nr.
  void (*pv)(const float* p, int64_t p_stride, const float* corr, int nr, const void* v, int64_t kv_stride, int np,
             int64_t head_dim, float* acc) = nullptr;

  // F16 KV only. One row of n_valid (> 0) raw dots s (not yet scaled), in
  // position order: x = s[j] * scale; if x > m { ms = e^(m - x), m = x, vs = 1 }
  // else { ms = 1, vs = e^(x - m) }; l = l * ms + vs. Leaves vs in s[j] and ms
  // in ms[j]. Both rows must hold n_valid rounded up to 8 floats; entries from
  // n_valid on are unspecified afterwards.
  void (*seq_weights)(float* s, float* ms, int n_valid, float scale, float* m, float* l) = nullptr;
  // F16 KV only. For r < nr, for j < nv[r] in order:
  //   if ms[r][j] != 1: acc[r] = f16(acc[r] * ms[r][j]);
  //   acc[r] = f16(acc[r] + vs[r][j] * v[j]),
  // f16() rounding every element to the nearest F16 value (RNE, F16 overflow
  // giving inf). vs, ms rows are `stride` floats apart.
  void (*pv_seq)(const float* vs, const float* ms, int64_t stride, const int* nv, int nr, const void* v,
                 int64_t kv_stride, int64_t head_dim, float* acc) = nullptr;
};

// The sequential halves of seq_weights, shared by the SIMD targets. They are
// `static` so that each target's file gets its own copy, compiled with its own
// flags: with plain `inline` the linker keeps one out-of-line copy (every
// build that does not inline them, Debug for one), and the AVX2 kernels could
// end up calling code compiled for AVX-512. ms[j] = the running max before
// position j, from m, for j < n; returns the max over all n.
static inline float seq_prefix_max(const float* s, float* ms, int n, float m) {
  for (int j = 0; j < n; ++j) {
    ms[j] = m;
    if (s[j] > m) m = s[j];
  }
  return m;
}
// l = l * ms[j] + vs[j] for j < n, in position order.
static inline float seq_running_sum(const float* vs, const float* ms, int n, float l) {
  for (int j = 0; j < n; ++j) l = l * ms[j] + vs[j];
  return l;
}

// pv_seq's row pairing, shared by the SIMD targets (static, as above).
// rows2 / rows1 run two or one rows (vs, ms `ps` floats apart; acc rows hd
// apart) over positions [j0, j1). Two rows share each V load over the positions both see; the rest
// of the row that sees more (a later query) goes alone.
using PvSeqRows = void (*)(const float* vs, const float* ms, int64_t ps, const uint16_t* v, int64_t vstride, int j0,
                           int j1, int64_t hd, float* acc);
static inline void pv_seq_paired(PvSeqRows rows2, PvSeqRows rows1, const float* vs, const float* ms, int64_t stride,
                                 const int* nv, int nr, const void* v, int64_t kv_stride, int64_t hd, float* acc) {
  const uint16_t* vb = static_cast<const uint16_t*>(v);
  int r = 0;
  for (; r + 2 <= nr; r += 2) {
    const int both = nv[r] < nv[r + 1] ? nv[r] : nv[r + 1];
    rows2(vs + r * stride, ms + r * stride, stride, vb, kv_stride, 0, both, hd, acc + r * hd);
    const int rl = nv[r] > nv[r + 1] ? r : r + 1;
    if (nv[rl] > both)
      rows1(vs + rl * stride, ms + rl * stride, stride, vb, kv_stride, both, nv[rl], hd, acc + rl * hd);
  }
  if (r < nr) rows1(vs + r * stride, ms + r * stride, stride, vb, kv_stride, 0, nv[r], hd, acc + r * hd);
}

// kv: kF16 or kF32.
const AttnKernels& attn_kernels_scalar(DType kv);
// The scalar kernels with the F16 scores summed in the reference engine's
// order (attention_ref_engine.cpp).
const AttnKernels& attn_kernels_ref_engine(DType kv);
#if defined(EBB_ARCH_X86)
// nullptr when head_dim is not a multiple of 8 (the scalar kernels serve then).
const AttnKernels* attn_kernels_avx2(DType kv, int64_t head_dim);  // attention_avx2.cpp
// nullptr when head_dim is not a multiple of 16 (the AVX2 kernels serve then,
// or the scalar ones).
const AttnKernels* attn_kernels_avx512(DType kv, int64_t head_dim);  // attention_avx512.cpp
// The AVX-512 kernels with AVX2's score kernel (qk): the AVX-512 target's F32
// arithmetic where avx512_in_halves(). nullptr where attn_kernels_avx512 is.
const AttnKernels* attn_kernels_avx512_avx2_scores(DType kv, int64_t head_dim);
#endif

// attention() with these kernels (for tests of a table the CPU would not pick).
void attention_with(const AttnKernels& kk, const AttentionArgs& a, ThreadPool& pool);

}  // namespace ebb::detail
