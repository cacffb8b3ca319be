// AVX-512 block kernels of attention; F16 K/V rows are widened with
// vcvtph2ps as they are loaded, and the tails of blocks use k-masks.
// head_dim must be a multiple of 16 (otherwise attention() runs the AVX2
// kernels). F16 KV: the half-precision kernels (seq_weights, pv_seq), whose
// accumulator is rounded to F16 with vcvtps2ph after every update.
//
// Scores are summed in one order whichever path computes them (4, 2 or 1
// rows; a group of positions or one alone), so a score does not depend on
// the block split: element 64 i + 16 j + l of the dot into lane l of
// accumulator j, then (acc0 + acc2) + (acc1 + acc3) halved down to one lane.
// That is the order the reference engine's AVX-512 build sums an F16 dot in
// (attention_ref_engine.cpp): with head_dim a multiple of 64 the scores are
// its scores, bit for bit. seq_weights and pv_seq are AVX2's lane for lane
// (the same exp polynomial, the same fma and roundings), so given the same
// scores they give AVX2's results bit for bit.
//
// GCC 12's avx512fintrin.h seeds several intrinsics with _mm512_undefined_ps()
// and then warns about it (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <math.h>

#include "kernels/attention_internal.h"
#include "kernels/ops_avx512.h"

namespace ebb::detail {
namespace {

static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// {sum a, sum b, sum c, sum d}, each vector summed as _mm512_reduce_add_ps
// sums one: its upper half added to its lower, 16 -> 8 -> 4 -> 2 -> 1 lanes.
static inline __m128 hsum4_ps(__m512 a, __m512 b, __m512 c, __m512 d) {
  // 16 -> 8: [a | b] and [c | d], 8 lanes each.
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // 8 -> 4: [a | b | c | d], 4 lanes each.
  const __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  // 4 -> 2 -> 1 inside each 128-bit lane; the sums end in lanes 0, 4, 8, 12.
  const __m512 y = _mm512_add_ps(x, _mm512_shuffle_ps(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 z = _mm512_add_ps(y, _mm512_shuffle_ps(y, y, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, z));
}

// a[r][J] += q[r][0..16) * kv for NR rows of q, hd floats apart.
template <int NR, int J>
static inline void fma_col(__m512 (&a)[NR][4], const float* q, int64_t hd, __m512 kv) {
  for (int r = 0; r < NR; ++r) a[r][J] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * hd), kv, a[r][J]);
}

// The dots of NR query rows with one K row, each still a vector to be summed
// across: t[r] = (acc0 + acc2) + (acc1 + acc3), element 64 i + 16 j + l of
// the row fused into lane l of acc j (the last 16, 32 or 48 elements of a
// head_dim not a multiple of 64 into acc 0, 1, 2).
template <int NR, int HD, class T>
static inline void qk_dot_vecs(const float* q, int64_t hd_, const T* k, __m512 (&t)[NR]) {
  const int64_t hd = HD ? HD : hd_;
  __m512 a[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) a[r][j] = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 64 <= hd; d += 64) {
    fma_col<NR, 0>(a, q + d, hd, load16(k + d));
    fma_col<NR, 1>(a, q + d + 16, hd, load16(k + d + 16));
    fma_col<NR, 2>(a, q + d + 32, hd, load16(k + d + 32));
    fma_col<NR, 3>(a, q + d + 48, hd, load16(k + d + 48));
  }
  if (d + 16 <= hd) fma_col<NR, 0>(a, q + d, hd, load16(k + d));
  if (d + 32 <= hd) fma_col<NR, 1>(a, q + d + 16, hd, load16(k + d + 16));
  if (d + 48 <= hd) fma_col<NR, 2>(a, q + d + 32, hd, load16(k + d + 32));
  for (int r = 0; r < NR; ++r)
    t[r] = _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][2]), _mm512_add_ps(a[r][1], a[r][3]));
}

// Scores of NR query rows against NP consecutive positions, their dot
// vectors summed across 4 at a time (NR * NP a multiple of 4, or below 4).
// HD: head_dim when known at compile time (no loop or tail tests left), else 0.
template <int NR, int NP, int HD, class T>
static inline void qk_group(const float* q, int64_t hd, const T* k, int64_t ks, float* s, int64_t ss) {
  constexpr int N = NR * NP < 4 ? 4 : NR * NP;
  static_assert(N % 4 == 0);
  __m512 t[N];  // slot j * NR + r: row r, position j; unused slots repeat slot 0
#pragma GCC unroll 8  // else GCC keeps t on the stack, indexed by j
  for (int j = 0; j < NP; ++j) {
    __m512 tj[NR];
    qk_dot_vecs<NR, HD>(q, hd, k + j * ks, tj);
    for (int r = 0; r < NR; ++r) t[j * NR + r] = tj[r];
  }
  for (int i = NR * NP; i < N; ++i) t[i] = t[0];
  float out[N];
  for (int i = 0; i < N; i += 4) _mm_storeu_ps(out + i, hsum4_ps(t[i], t[i + 1], t[i + 2], t[i + 3]));
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NP; ++j) s[r * ss + j] = out[j * NR + r];
}

// Scores of NR query rows against np positions: groups of 8 / NR positions
// (two sums across per group: more independent work between them), then one
// at a time.
template <int NR, int HD, class T>
static inline void qk_rows(const float* q, int64_t hd, const T* k, int64_t ks, int np, float* s, int64_t ss) {
  constexpr int NP = 8 / NR;
  int j = 0;
  for (; j + NP <= np; j += NP) qk_group<NR, NP, HD>(q, hd, k + j * ks, ks, s + j, ss);
  for (; j < np; ++j) qk_group<NR, 1, HD>(q, hd, k + j * ks, ks, s + j, ss);
}

template <int HD, class T>
static inline void qk_all_rows(const float* q, int nr, const T* k, int64_t ks, int np, int64_t hd, float* s,
                               int64_t ss) {
  int r = 0;
  // Four rows share each K load (16 accumulators of the 32 zmm registers),
  // then two, then one.
  for (; r + 4 <= nr; r += 4) qk_rows<4, HD>(q + r * hd, hd, k, ks, np, s + r * ss, ss);
  if (r + 2 <= nr) {
    qk_rows<2, HD>(q + r * hd, hd, k, ks, np, s + r * ss, ss);
    r += 2;
  }
  if (r < nr) qk_rows<1, HD>(q + r * hd, hd, k, ks, np, s + r * ss, ss);
}

template <class T>
void qk_avx512(const float* q, int nr, const void* k, int64_t kv_stride, int np, int64_t hd, float* s,
               int64_t s_stride) {
  const T* kb = static_cast<const T*>(k);
  // The common head sizes unrolled whole (no loop or tail tests): about a
  // sixth faster at head_dim 128 on Zen 5.
  if (hd == 128)
    qk_all_rows<128>(q, nr, kb, kv_stride, np, hd, s, s_stride);
  else if (hd == 64)
    qk_all_rows<64>(q, nr, kb, kv_stride, np, hd, s, s_stride);
  else
    qk_all_rows<0>(q, nr, kb, kv_stride, np, hd, s, s_stride);
}

float softmax_step_avx512(float* s, int n_valid, int np, float* m, float* l) {
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  const int nb = n_valid & ~15;  // whole vectors of visible scores
  const __mmask16 mt = avx512::tail_mask(n_valid - nb);
  __m512 mx = ninf;
  for (int j = 0; j < nb; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
  if (nb < n_valid) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, mt, s + nb));
  const float m_new = fmaxf(*m, _mm512_reduce_max_ps(mx));
  const float corr = expf(*m - m_new);
  const __m512 mv = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  int j = 0;
  for (; j < nb; j += 16) {
    const __m512 e = avx512::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  auto in_row = [np](int j) { return avx512::tail_mask(np - j < 16 ? np - j : 16); };  // lanes j.. below np
  if (nb < n_valid) {
    // Lanes past n_valid load -inf and become 0, inside np or not.
    const __m512 e = avx512::exp_ps(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, mt, s + j), mv));
    sum = _mm512_add_ps(sum, e);
    _mm512_mask_storeu_ps(s + j, in_row(j), e);
    j += 16;
  }
  for (; j < np; j += 16) _mm512_mask_storeu_ps(s + j, in_row(j), _mm512_setzero_ps());
  *l = *l * corr + _mm512_reduce_add_ps(sum);
  *m = m_new;
  return corr;
}

// acc[NR rows][ND vectors from column d] = acc * corr + sum_j p[r][j] v[j][d..].
template <int NR, int ND, class T>
static inline void pv_tile(const float* p, int64_t ps, const float* corr, const T* v, int64_t vs, int np, int64_t hd,
                           float* acc, int64_t d) {
  __m512 a[NR][ND];
  for (int r = 0; r < NR; ++r) {
    const __m512 c = _mm512_set1_ps(corr[r]);
    for (int i = 0; i < ND; ++i) a[r][i] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * hd + d + 16 * i), c);
  }
  for (int j = 0; j < np; ++j) {
    const T* vr = v + j * vs + d;
    for (int i = 0; i < ND; ++i) {
      const __m512 x = load16(vr + 16 * i);
      for (int r = 0; r < NR; ++r) a[r][i] = _mm512_fmadd_ps(_mm512_set1_ps(p[r * ps + j]), x, a[r][i]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < ND; ++i) _mm512_storeu_ps(acc + r * hd + d + 16 * i, a[r][i]);
}

// Columns [d, hd) of NR rows: tiles of ND vectors, then of ND / 2, ... 1
// (head_dim 96: one tile of 4 vectors and one of 2).
template <int NR, int ND, class T>
static inline void pv_cols(const float* p, int64_t ps, const float* corr, const T* v, int64_t vs, int np, int64_t hd,
                           float* acc, int64_t d) {
  for (; d + 16 * ND <= hd; d += 16 * ND) pv_tile<NR, ND>(p, ps, corr, v, vs, np, hd, acc, d);
  if constexpr (ND > 1) pv_cols<NR, ND / 2>(p, ps, corr, v, vs, np, hd, acc, d);
}

template <class T>
void pv_avx512(const float* p, int64_t p_stride, const float* corr, int nr, const void* v, int64_t kv_stride, int np,
               int64_t hd, float* acc) {
  const T* vb = static_cast<const T*>(v);
  int r = 0;
  // Four rows share each V load in tiles of 4 vectors (16 accumulators),
  // two rows in tiles of 8 (head_dim 128 in one tile), then one.
  for (; r + 4 <= nr; r += 4)
    pv_cols<4, 4>(p + r * p_stride, p_stride, corr + r, vb, kv_stride, np, hd, acc + r * hd, 0);
  if (r + 2 <= nr) {
    pv_cols<2, 8>(p + r * p_stride, p_stride, corr + r, vb, kv_stride, np, hd, acc + r * hd, 0);
    r += 2;
  }
  if (r < nr) pv_cols<1, 8>(p + r * p_stride, p_stride, corr + r, vb, kv_stride, np, hd, acc + r * hd, 0);
}

// ---- F16 KV: half-precision semantics (see attention_internal.h)

// x rounded to the nearest F16 value (RNE), back in floats.
static inline __m512 round_f16(__m512 x) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Positions j of 16 (lanes in k) with x = s[j] and the running max before
// them mp = ms[j]: factor e^-|x - mp|, which rescales the accumulator
// (ms[j]) when x > mp and weights V (s[j]) otherwise; the other is 1.
static inline void seq_weights16(float* s, float* ms, __mmask16 k) {
  const __m512 x = _mm512_maskz_loadu_ps(k, s), mp = _mm512_maskz_loadu_ps(k, ms);
  // -|x - mp|; x - (-inf) = inf gives e = 0: the first position's ms.
  const __m512 e = avx512::exp_ps(_mm512_or_ps(_mm512_sub_ps(x, mp), _mm512_set1_ps(-0.0f)));
  const __mmask16 gt = _mm512_cmp_ps_mask(x, mp, _CMP_GT_OQ);
  const __m512 one = _mm512_set1_ps(1.0f);
  _mm512_mask_storeu_ps(ms, k, _mm512_mask_blend_ps(gt, one, e));
  _mm512_mask_storeu_ps(s, k, _mm512_mask_blend_ps(gt, e, one));
}

// As seq_weights_avx2: the running max before each position is a prefix max
// (scalar), then every position's factor is vectorised over the block; the
// running sum is sequential. Only the first n_valid entries are written.
void seq_weights_avx512(float* s, float* ms, int n_valid, float scale, float* m, float* l) {
  const int nb = n_valid & ~15;
  const __mmask16 mt = avx512::tail_mask(n_valid - nb);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int j = 0; j < nb; j += 16) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), sc));
  if (nb < n_valid) _mm512_mask_storeu_ps(s + nb, mt, _mm512_mul_ps(_mm512_maskz_loadu_ps(mt, s + nb), sc));
  const float mx = seq_prefix_max(s, ms, n_valid, *m);
  for (int j = 0; j < nb; j += 16) seq_weights16(s + j, ms + j, 0xffff);
  if (nb < n_valid) seq_weights16(s + nb, ms + nb, mt);
  *m = mx;
  *l = seq_running_sum(s, ms, n_valid, *l);
}

// Positions [j0, j1) into NR rows' accumulators, ND vectors at column d.
// Every element is its own dependency chain (fma, two conversions), so the
// NR * ND chains of a tile run interleaved.
template <int NR, int ND>
static inline void pv_seq_tile(const float* vs, const float* ms, int64_t ps, const uint16_t* v, int64_t vstride,
                               int j0, int j1, int64_t hd, float* acc, int64_t d) {
  __m512 a[NR][ND];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < ND; ++i) a[r][i] = _mm512_loadu_ps(acc + r * hd + d + 16 * i);
  for (int j = j0; j < j1; ++j) {
    __m512 w[NR];
    for (int r = 0; r < NR; ++r) {
      const float c = ms[r * ps + j];
      if (c != 1.0f) {  // a new running max: rescale (rare after the first positions)
        const __m512 cv = _mm512_set1_ps(c);
        for (int i = 0; i < ND; ++i) a[r][i] = round_f16(_mm512_mul_ps(a[r][i], cv));
      }
      w[r] = _mm512_set1_ps(vs[r * ps + j]);
    }
    const uint16_t* vr = v + j * vstride + d;
    for (int i = 0; i < ND; ++i) {
      const __m512 x = load16(vr + 16 * i);
      for (int r = 0; r < NR; ++r) a[r][i] = round_f16(_mm512_fmadd_ps(x, w[r], a[r][i]));
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < ND; ++i) _mm512_storeu_ps(acc + r * hd + d + 16 * i, a[r][i]);
}

// Columns [d, hd): tiles of ND vectors, then of ND / 2, ... 1.
template <int NR, int ND>
static inline void pv_seq_cols(const float* vs, const float* ms, int64_t ps, const uint16_t* v, int64_t vstride,
                               int j0, int j1, int64_t hd, float* acc, int64_t d) {
  for (; d + 16 * ND <= hd; d += 16 * ND) pv_seq_tile<NR, ND>(vs, ms, ps, v, vstride, j0, j1, hd, acc, d);
  if constexpr (ND > 1) pv_seq_cols<NR, ND / 2>(vs, ms, ps, v, vstride, j0, j1, hd, acc, d);
}

// One row's 8 chains, or two rows' 16, per tile: head_dim 128 is one tile.
template <int NR>
static inline void pv_seq_rows(const float* vs, const float* ms, int64_t ps, const uint16_t* v, int64_t vstride,
                               int j0, int j1, int64_t hd, float* acc) {
  pv_seq_cols<NR, 8>(vs, ms, ps, v, vstride, j0, j1, hd, acc, 0);
}

void pv_seq_avx512(const float* vs, const float* ms, int64_t stride, const int* nv, int nr, const void* v,
                   int64_t kv_stride, int64_t hd, float* acc) {
  pv_seq_paired(pv_seq_rows<2>, pv_seq_rows<1>, vs, ms, stride, nv, nr, v, kv_stride, hd, acc);
}

}  // namespace

const AttnKernels* attn_kernels_avx512(DType kv, int64_t head_dim) {
  static const AttnKernels f16{qk_avx512<uint16_t>, softmax_step_avx512, pv_avx512<uint16_t>, seq_weights_avx512,
                               pv_seq_avx512};
  static const AttnKernels f32{qk_avx512<float>, softmax_step_avx512, pv_avx512<float>};
  if (head_dim % 16 != 0) return nullptr;
  return kv == DType::kF16 ? &f16 : &f32;
}

}  // namespace ebb::detail
