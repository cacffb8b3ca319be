// AVX2 + FMA block kernels of attention; F16 K/V rows are widened with F16C
// as they are loaded. head_dim must be a multiple of 8. F16 KV: the
// half-precision kernels (seq_weights, pv_seq), whose accumulator is rounded
// to F16 with F16C after every update.
#include <math.h>

#include "kernels/attention_internal.h"
#include "kernels/ops_avx2.h"

namespace ebb::detail {
namespace {

static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Scores of NR query rows against 4 consecutive positions.
template <int NR, class T>
static inline void qk_rows_x4(const float* q, int64_t hd, const T* k, int64_t ks, float* s, int64_t ss) {
  __m256 acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; d += 8) {
    const __m256 k0 = load8(k + d), k1 = load8(k + ks + d), k2 = load8(k + 2 * ks + d), k3 = load8(k + 3 * ks + d);
    for (int r = 0; r < NR; ++r) {
      const __m256 qv = _mm256_loadu_ps(q + r * hd + d);
      acc[r][0] = _mm256_fmadd_ps(qv, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(qv, k1, acc[r][1]);
      acc[r][2] = _mm256_fmadd_ps(qv, k2, acc[r][2]);
      acc[r][3] = _mm256_fmadd_ps(qv, k3, acc[r][3]);
    }
  }
  for (int r = 0; r < NR; ++r) _mm_storeu_ps(s + r * ss, avx2::hsum4_ps(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
}

// Scores of NR query rows against one position.
template <int NR, class T>
static inline void qk_rows_x1(const float* q, int64_t hd, const T* k, float* s, int64_t ss) {
  __m256 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t d = 0; d < hd; d += 8) {
    const __m256 kv = load8(k + d);
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * hd + d), kv, acc[r]);
  }
  for (int r = 0; r < NR; ++r) {
    if constexpr (sizeof(T) == 2)  // F16 KV: qk_rows_x4's summation order, so a score does not depend on the block split
      s[r * ss] = _mm_cvtss_f32(avx2::hsum4_ps(acc[r], acc[r], acc[r], acc[r]));
    else
      s[r * ss] = avx2::hsum_ps(acc[r]);
  }
}

template <int NR, class T>
static inline void qk_rows(const float* q, int64_t hd, const T* k, int64_t ks, int np, float* s, int64_t ss) {
  int j = 0;
  for (; j + 4 <= np; j += 4) qk_rows_x4<NR>(q, hd, k + j * ks, ks, s + j, ss);
  for (; j < np; ++j) qk_rows_x1<NR>(q, hd, k + j * ks, s + j, ss);
}

template <class T>
void qk_avx2(const float* q, int nr, const void* k, int64_t kv_stride, int np, int64_t hd, float* s,
             int64_t s_stride) {
  const T* kb = static_cast<const T*>(k);
  int r = 0;
  // Two rows share each K load; more would run out of the 16 ymm registers.
  for (; r + 2 <= nr; r += 2) qk_rows<2>(q + r * hd, hd, kb, kv_stride, np, s + r * s_stride, s_stride);
  if (r < nr) qk_rows<1>(q + r * hd, hd, kb, kv_stride, np, s + r * s_stride, s_stride);
}

float softmax_step_avx2(float* s, int n_valid, int np, float* m, float* l) {
  const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
  __m256 mx = ninf;
  int j = 0;
  for (; j + 8 <= n_valid; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
  if (j < n_valid) {
    const __m256i mt = avx2::tail_mask(n_valid - j);
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j, mt), _mm256_castsi256_ps(mt)));
  }
  const float m_new = fmaxf(*m, avx2::hmax_ps(mx));
  const float corr = expf(*m - m_new);
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n_valid; j += 8) {
    const __m256 e = avx2::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (j < n_valid) {
    // Lanes past n_valid (still inside np or not) become 0.
    const __m256i mt = avx2::tail_mask(n_valid - j);
    const __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j, mt), _mm256_castsi256_ps(mt));
    const __m256 e = avx2::exp_ps(_mm256_sub_ps(v, mv));
    sum = _mm256_add_ps(sum, e);
    const __m256i mw = avx2::tail_mask(np - j < 8 ? np - j : 8);
    _mm256_maskstore_ps(s + j, mw, e);
    j += 8;
  }
  for (; j < np; ++j) s[j] = 0.0f;
  *l = *l * corr + avx2::hsum_ps(sum);
  *m = m_new;
  return corr;
}

// acc[NR rows][ND vectors at d] = acc * corr + sum_j p[r][j] v[j][d..].
template <int NR, int ND, class T>
static inline void pv_tile(const float* p, int64_t ps, const float* corr, const T* v, int64_t vs, int np, int64_t hd,
                           float* acc, int64_t d) {
  __m256 a[NR][ND];
  for (int r = 0; r < NR; ++r) {
    const __m256 c = _mm256_set1_ps(corr[r]);
    for (int i = 0; i < ND; ++i) a[r][i] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * hd + d + 8 * i), c);
  }
  for (int j = 0; j < np; ++j) {
    __m256 vv[ND];
    for (int i = 0; i < ND; ++i) vv[i] = load8(v + j * vs + d + 8 * i);
    for (int r = 0; r < NR; ++r) {
      const __m256 w = _mm256_broadcast_ss(p + r * ps + j);
      for (int i = 0; i < ND; ++i) a[r][i] = _mm256_fmadd_ps(w, vv[i], a[r][i]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < ND; ++i) _mm256_storeu_ps(acc + r * hd + d + 8 * i, a[r][i]);
}

// pv_tile<NR, 4> with its accumulators in named variables: GCC keeps an
// array of them in registers but also stores every one to the stack on
// every position, which halves the tile's speed.
template <int NR, class T>
static inline void pv_tile4(const float* p, int64_t ps, const float* corr, const T* v, int64_t vs, int np, int64_t hd,
                            float* acc, int64_t d) {
  static_assert(NR == 1 || NR == 2);
  float* a0p = acc + d;
  float* a1p = acc + (NR - 1) * hd + d;  // row 1 (row 0 again when NR == 1, unused)
  const __m256 c0 = _mm256_set1_ps(corr[0]), c1 = _mm256_set1_ps(corr[NR - 1]);
  __m256 a00 = _mm256_mul_ps(_mm256_loadu_ps(a0p), c0), a01 = _mm256_mul_ps(_mm256_loadu_ps(a0p + 8), c0);
  __m256 a02 = _mm256_mul_ps(_mm256_loadu_ps(a0p + 16), c0), a03 = _mm256_mul_ps(_mm256_loadu_ps(a0p + 24), c0);
  __m256 a10 = _mm256_mul_ps(_mm256_loadu_ps(a1p), c1), a11 = _mm256_mul_ps(_mm256_loadu_ps(a1p + 8), c1);
  __m256 a12 = _mm256_mul_ps(_mm256_loadu_ps(a1p + 16), c1), a13 = _mm256_mul_ps(_mm256_loadu_ps(a1p + 24), c1);
  const float* p1 = p + (NR - 1) * ps;
  for (int j = 0; j < np; ++j) {
    const T* vr = v + j * vs + d;
    const __m256 v0 = load8(vr), v1 = load8(vr + 8), v2 = load8(vr + 16), v3 = load8(vr + 24);
    const __m256 w0 = _mm256_broadcast_ss(p + j);
    a00 = _mm256_fmadd_ps(w0, v0, a00);
    a01 = _mm256_fmadd_ps(w0, v1, a01);
    a02 = _mm256_fmadd_ps(w0, v2, a02);
    a03 = _mm256_fmadd_ps(w0, v3, a03);
    if constexpr (NR == 2) {
      const __m256 w1 = _mm256_broadcast_ss(p1 + j);
      a10 = _mm256_fmadd_ps(w1, v0, a10);
      a11 = _mm256_fmadd_ps(w1, v1, a11);
      a12 = _mm256_fmadd_ps(w1, v2, a12);
      a13 = _mm256_fmadd_ps(w1, v3, a13);
    }
  }
  _mm256_storeu_ps(a0p, a00);
  _mm256_storeu_ps(a0p + 8, a01);
  _mm256_storeu_ps(a0p + 16, a02);
  _mm256_storeu_ps(a0p + 24, a03);
  if constexpr (NR == 2) {
    _mm256_storeu_ps(a1p, a10);
    _mm256_storeu_ps(a1p + 8, a11);
    _mm256_storeu_ps(a1p + 16, a12);
    _mm256_storeu_ps(a1p + 24, a13);
  }
}

template <int NR, class T>
static inline void pv_rows(const float* p, int64_t ps, const float* corr, const T* v, int64_t vs, int np, int64_t hd,
                           float* acc) {
  int64_t d = 0;
  for (; d + 32 <= hd; d += 32) pv_tile4<NR>(p, ps, corr, v, vs, np, hd, acc, d);
  for (; d < hd; d += 8) pv_tile<NR, 1>(p, ps, corr, v, vs, np, hd, acc, d);
}

template <class T>
void pv_avx2(const float* p, int64_t p_stride, const float* corr, int nr, const void* v, int64_t kv_stride, int np,
             int64_t hd, float* acc) {
  const T* vb = static_cast<const T*>(v);
  int r = 0;
  for (; r + 2 <= nr; r += 2)
    pv_rows<2>(p + r * p_stride, p_stride, corr + r, vb, kv_stride, np, hd, acc + r * hd);
  if (r < nr) pv_rows<1>(p + r * p_stride, p_stride, corr + r, vb, kv_stride, np, hd, acc + r * hd);
}

// ---- F16 KV: half-precision semantics (see attention_internal.h)

// x rounded to the nearest F16 value (RNE), back in floats.
static inline __m256 round_f16(__m256 x) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

// The running max before each position is a prefix max (scalar), after
// which every position's factor is e^-|x - m_prev| and whether it rescales
// the accumulator (x > m_prev) or weights V: both vectorised over the block.
void seq_weights_avx2(float* s, float* ms, int n_valid, float scale, float* m, float* l) {
  const int n8 = (n_valid + 7) & ~7;
  for (int j = n_valid; j < n8; ++j) s[j] = 0.0f;  // padding lanes: defined, unused
  const __m256 sc = _mm256_set1_ps(scale);
  for (int j = 0; j < n8; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), sc));
  const float mx = seq_prefix_max(s, ms, n_valid, *m);
  for (int j = n_valid; j < n8; ++j) ms[j] = mx;
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (int j = 0; j < n8; j += 8) {
    const __m256 x = _mm256_loadu_ps(s + j), mp = _mm256_loadu_ps(ms + j);
    // -|x - mp|; x - (-inf) = inf gives e = 0: the first position's ms.
    const __m256 e = avx2::exp_ps(_mm256_or_ps(_mm256_sub_ps(x, mp), sign));
    const __m256 gt = _mm256_cmp_ps(x, mp, _CMP_GT_OQ);
    _mm256_storeu_ps(ms + j, _mm256_blendv_ps(one, e, gt));
    _mm256_storeu_ps(s + j, _mm256_blendv_ps(e, one, gt));
  }
  *m = mx;
  *l = seq_running_sum(s, ms, n_valid, *l);
}

// Positions [j0, j1) into NR rows' accumulators, ND vectors at column d.
// Every element is its own dependency chain (fma, two conversions), so the
// NR * ND chains of a tile run interleaved.
template <int NR, int ND>
static inline void pv_seq_tile(const float* vs, const float* ms, int64_t ps, const uint16_t* v, int64_t vstride,
                               int j0, int j1, int64_t hd, float* acc, int64_t d) {
  __m256 a[NR][ND];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < ND; ++i) a[r][i] = _mm256_loadu_ps(acc + r * hd + d + 8 * i);
  for (int j = j0; j < j1; ++j) {
    __m256 w[NR];
    for (int r = 0; r < NR; ++r) {
      const float c = ms[r * ps + j];
      if (c != 1.0f) {  // a new running max: rescale (rare after the first positions)
        const __m256 cv = _mm256_set1_ps(c);
        for (int i = 0; i < ND; ++i) a[r][i] = round_f16(_mm256_mul_ps(a[r][i], cv));
      }
      w[r] = _mm256_broadcast_ss(vs + r * ps + j);
    }
    const uint16_t* vr = v + j * vstride + d;
    for (int i = 0; i < ND; ++i) {
      const __m256 x = load8(vr + 8 * i);
      for (int r = 0; r < NR; ++r) a[r][i] = round_f16(_mm256_fmadd_ps(x, w[r], a[r][i]));
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < ND; ++i) _mm256_storeu_ps(acc + r * hd + d + 8 * i, a[r][i]);
}

template <int NR>
static inline void pv_seq_rows(const float* vs, const float* ms, int64_t ps, const uint16_t* v, int64_t vstride,
                               int j0, int j1, int64_t hd, float* acc) {
  constexpr int ND = NR == 1 ? 8 : 4;  // 8 chains per tile either way
  int64_t d = 0;
  for (; d + 8 * ND <= hd; d += 8 * ND) pv_seq_tile<NR, ND>(vs, ms, ps, v, vstride, j0, j1, hd, acc, d);
  for (; d < hd; d += 8) pv_seq_tile<NR, 1>(vs, ms, ps, v, vstride, j0, j1, hd, acc, d);
}

void pv_seq_avx2(const float* vs, const float* ms, int64_t stride, const int* nv, int nr, const void* v,
                 int64_t kv_stride, int64_t hd, float* acc) {
  pv_seq_paired(pv_seq_rows<2>, pv_seq_rows<1>, vs, ms, stride, nv, nr, v, kv_stride, hd, acc);
}

}  // namespace

const AttnKernels* attn_kernels_avx2(DType kv, int64_t head_dim) {
  static const AttnKernels f16{qk_avx2<uint16_t>, softmax_step_avx2, pv_avx2<uint16_t>, seq_weights_avx2, pv_seq_avx2};
  static const AttnKernels f32{qk_avx2<float>, softmax_step_avx2, pv_avx2<float>};
  if (head_dim % 8 != 0) return nullptr;
  return kv == DType::kF16 ? &f16 : &f32;
}

}  // namespace ebb::detail
