// AVX2 + FMA + F16C kernels. Integer dots use _mm256_maddubs_epi16 (u8 x s8
// pairs) and _mm256_madd_epi16; per-block integer sums are exact, only the
// float accumulation order differs from the scalar reference.
#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstring>

#include "kernels/quant_avx2_inl.h"
#include "kernels/quant_blocks.h"
#include "platform/error.h"

namespace ebb {
namespace {

using namespace avx2;

// ---- conversions to float ----------------------------------------------------

void f16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(s[i]);
}

void bf16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(s + i));
  for (; i < n; ++i) {
    const uint32_t b = static_cast<uint32_t>(s[i]) << 16;
    std::memcpy(dst + i, &b, 4);
  }
}

void q8_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
    for (int j = 0; j < kQK8_0; j += 8) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + j));
      _mm256_storeu_ps(dst + i * kQK8_0 + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    }
  }
}

void q4_0_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
    const __m256i q = _mm256_sub_epi8(nibbles_32(b[i].qs), _mm256_set1_epi8(8));
    alignas(32) int8_t v[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(v), q);
    for (int j = 0; j < kQK8_0; j += 8) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + j));
      _mm256_storeu_ps(dst + i * kQK8_0 + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
    }
  }
}

// ---- activation quantizers -----------------------------------------------------

// The F16 / BF16 activation rounding is bit-exact with the scalar reference
// (platform/fp16.h, not included here: its inline functions must not be
// compiled with AVX flags). Tails go through a zero-padded block of the
// vector code, so there is one code path.

// Floats -> F16, round to nearest even (F16C; subnormals and overflow to Inf
// as the scalar fp32_to_fp16). NaN: the hardware keeps the top payload bits,
// the reference gives sign | 0x7e00; the payload bits are cleared to match.
inline __m128i f16_round_8(const float* p) {
  const __m256 v = _mm256_loadu_ps(p);
  const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
  return _mm_andnot_si128(_mm_and_si128(nan16, _mm_set1_epi16(0x01ff)), h);
}

void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), f16_round_8(src + i));
  if (i < n) {
    float in[8] = {};
    alignas(16) uint16_t res[8];
    std::memcpy(in, src + i, (n - i) * sizeof(float));
    _mm_store_si128(reinterpret_cast<__m128i*>(res), f16_round_8(in));
    std::memcpy(d + i, res, (n - i) * sizeof(uint16_t));
  }
}

// The batch form of F16 activations: rounded to F16 as above, kept as floats
// (the same values, exactly), so a tile widens only its weight rows.
void quantize_f16_wide(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<float*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(f16_round_8(src + i)));
  if (i < n) {
    float in[8] = {}, res[8];
    std::memcpy(in, src + i, (n - i) * sizeof(float));
    _mm256_storeu_ps(res, _mm256_cvtph_ps(f16_round_8(in)));
    std::memcpy(d + i, res, (n - i) * sizeof(float));
  }
}

// 8 floats (as bits) -> 8 bf16 in the low halves of the 32-bit lanes, exactly
// as fp32_to_bf16: x + 0x7fff + (bit 16 of x), top half; NaN -> top half | 0x40.
inline __m256i bf16_round_8(__m256i x) {
  const __m256i top = _mm256_srli_epi32(x, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(top, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(r, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), nan);
}

// 16 floats -> 16 bf16 in element order.
inline __m256i bf16_round_16(const float* p) {
  const __m256i lo = bf16_round_8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m256i hi = bf16_round_8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 8)));
  // packus works per 128-bit lane (the values are <= 0xffff: no saturation);
  // the permute restores element order.
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), bf16_round_16(src + i));
  if (i < n) {
    float in[16] = {};
    alignas(32) uint16_t res[16];
    std::memcpy(in, src + i, (n - i) * sizeof(float));
    _mm256_store_si256(reinterpret_cast<__m256i*>(res), bf16_round_16(in));
    std::memcpy(d + i, res, (n - i) * sizeof(uint16_t));
  }
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    float d;
    const __m256i q = quantize_32(src + i * kQK8_0, abs_max_32(src + i * kQK8_0), &d);
    b[i].d = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs), q);
  }
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  const __m256i ones = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    __m256 m = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int j = 0; j < kQK_K; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    const float amax = hmax(m);
    for (int j = 0; j < kQK_K; j += 32) {
      float d;
      const __m256i q = quantize_32(x + j, amax, &d);
      b[i].d = amax != 0.f ? 1.f / (127.f / amax) : 0.f;  // 1 / multiplier, as the scalar row
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs + j), q);
      // Sums of the two groups of 16: maddubs with ones pairs the bytes,
      // madd pairs again; then the lanes of each 128-bit half are added.
      const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, q), ones16);  // 4 lanes per group
      const __m256i s = _mm256_hadd_epi32(s32, s32);
      const __m256i s2 = _mm256_hadd_epi32(s, s);
      b[i].bsums[j / 16] = static_cast<int16_t>(_mm256_extract_epi32(s2, 0));
      b[i].bsums[j / 16 + 1] = static_cast<int16_t>(_mm256_extract_epi32(s2, 4));
    }
  }
}

// ---- dot products ----------------------------------------------------------------

void dot_f32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc[0]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += x[i] * y[i];
  *out = s;
}

// F16 x F16: both widened by F16C (exact), products fused into four float
// accumulators.
inline __m256 load_f16x8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

void dot_f16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(load_f16x8(x + i + 8 * k), load_f16x8(y + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_f16x8(x + i), load_f16x8(y + i), acc[0]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += _cvtsh_ss(x[i]) * _cvtsh_ss(y[i]);
  *out = s;
}

// F16 weights x F16 activations held as floats (quantize_f16_wide), the
// batch arithmetic: one chain of 8 lanes from the row's start (each row read
// once, in order, by the tile), then the lanes summed as hsum does and the
// tail (n % 8) added one product at a time.
void dot_f16_wide(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const float*>(a);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(load_f16x8(x + i), _mm256_loadu_ps(y + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s += _cvtsh_ss(x[i]) * y[i];
  *out = s;
}

// BF16 x BF16: 16 elements per load split into even and odd elements (a shift
// and a mask, see load_bf16x16_even_odd), each half fused into its own
// accumulator.
void dot_bf16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 xe, xo, ye, yo;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 2; ++k) {
      load_bf16x16_even_odd(x + i + 16 * k, &xe, &xo);
      load_bf16x16_even_odd(y + i + 16 * k, &ye, &yo);
      acc[2 * k] = _mm256_fmadd_ps(xe, ye, acc[2 * k]);
      acc[2 * k + 1] = _mm256_fmadd_ps(xo, yo, acc[2 * k + 1]);
    }
  for (; i + 16 <= n; i += 16) {
    load_bf16x16_even_odd(x + i, &xe, &xo);
    load_bf16x16_even_odd(y + i, &ye, &yo);
    acc[0] = _mm256_fmadd_ps(xe, ye, acc[0]);
    acc[1] = _mm256_fmadd_ps(xo, yo, acc[1]);
  }
  for (; i + 8 <= n; i += 8) acc[2] = _mm256_fmadd_ps(load_bf16x8(x + i), load_bf16x8(y + i), acc[2]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) {
    const uint32_t bx = static_cast<uint32_t>(x[i]) << 16, by = static_cast<uint32_t>(y[i]) << 16;
    float fx, fy;
    std::memcpy(&fx, &bx, 4);
    std::memcpy(&fy, &by, 4);
    s += fx * fy;
  }
  *out = s;
}

// ---- Q4_0: eight rows per vector ------------------------------------------------
//
// The batch (tile) arithmetic, per (row, token): acc = 0, then for each block
// b in order acc = fmaf(dx_b * dy_b, float(isum_b), acc), isum_b the exact
// integer dot of (q - 8) with the activation bytes. dot_q4_0_lanes runs it
// for one (row, token); the x8 tile runs eight rows in the eight lanes of a
// vector (lane r = row r) for several tokens, every lane doing the same
// operations in the same order, so they are bit-identical, and no horizontal
// sum is left per row. The weight blocks are transposed and their scales
// gathered once per tile and reused by every token: twice the throughput of
// the row-at-a-time form in prefill. Decode (one token) cannot amortise the
// transpose and keeps dot_q4_0.

// The 16 quant bytes of one block of rows 0..7 (rows ws bytes apart),
// transposed: lane r of v[k] holds bytes 4k..4k+3 of row r, so its low
// nibbles are elements 4k..4k+3 and its high ones 16+4k..16+4k+3.
inline void load_q4_0_x8(const uint8_t* qs, size_t ws, __m256i v[4]) {
  __m256i a[4];
  for (int i = 0; i < 4; ++i)
    a[i] = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + (i + 4) * ws)),
                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + i * ws)));
  // A 4x4 transpose of dwords in each 128-bit half ([row i | row i + 4]).
  const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
  v[0] = _mm256_unpacklo_epi64(t0, t2);
  v[1] = _mm256_unpackhi_epi64(t0, t2);
  v[2] = _mm256_unpacklo_epi64(t1, t3);
  v[3] = _mm256_unpackhi_epi64(t1, t3);
}

inline int load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The F16 scales of one block of rows 0..7, as floats in lanes 0..7.
inline __m256 load_d_x8(const uint8_t* d, size_t ws) {
  __m128i h = _mm_cvtsi32_si128(load_u16(d));
  h = _mm_insert_epi16(h, load_u16(d + ws), 1);
  h = _mm_insert_epi16(h, load_u16(d + 2 * ws), 2);
  h = _mm_insert_epi16(h, load_u16(d + 3 * ws), 3);
  h = _mm_insert_epi16(h, load_u16(d + 4 * ws), 4);
  h = _mm_insert_epi16(h, load_u16(d + 5 * ws), 5);
  h = _mm_insert_epi16(h, load_u16(d + 6 * ws), 6);
  h = _mm_insert_epi16(h, load_u16(d + 7 * ws), 7);
  return _mm256_cvtph_ps(h);
}

// 8 * sum of the 32 activation bytes of a block, in every lane.
inline __m256i sum8_x8(const int8_t* qs) {
  const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
  // |sum| <= 32 * 127: psadbw on the bytes offset to unsigned, minus 32 * 128.
  const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(y, _mm256_set1_epi8(static_cast<char>(0x80))),
                                      _mm256_setzero_si256());
  __m128i s = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
  s = _mm_add_epi64(s, _mm_unpackhi_epi64(s, s));
  return _mm256_set1_epi32(8 * (_mm_cvtsi128_si32(s) - 32 * 128));
}

// isum of one block for eight rows (v: load_q4_0_x8) against activation
// bytes y, given m8 = sum8_x8(y). Every 16-bit partial sum stays below 2^15:
// eight maddubs terms of at most 2 * 15 * 127.
inline __m256i isum_q4_0_x8(const __m256i v[4], const int8_t* y, __m256i m8) {
  const __m256i m4 = _mm256_set1_epi8(0xF);
  __m256i p = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    const __m256i lo = _mm256_and_si256(v[k], m4), hi = _mm256_and_si256(_mm256_srli_epi16(v[k], 4), m4);
    const __m256i ylo = _mm256_set1_epi32(load_i32(y + 4 * k));
    const __m256i yhi = _mm256_set1_epi32(load_i32(y + 16 + 4 * k));
    p = _mm256_add_epi16(p, _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi)));
  }
  return _mm256_sub_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), m8);
}

// The sum of the eight int32 lanes (exact).
inline int32_t hsum_i32(__m256i v) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 1));
  return _mm_cvtsi128_si32(h);
}

// The packed arithmetic for one plain row and token: acc = fmaf(dx * dy,
// isum_b, acc) block after block, isum_b = block_isum(x[b], y[b]) exact.
template <class Block, class BlockIsum>
void lanes_dot(int64_t n, const void* w, const void* a, float* out, BlockIsum block_isum) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float acc = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i)
    acc = std::fmaf(_cvtsh_ss(x[i].d) * _cvtsh_ss(y[i].d), static_cast<float>(block_isum(x[i], y[i])), acc);
  *out = acc;
}

void dot_q4_0_lanes(int64_t n, const void* w, const void* a, float* out) {
  lanes_dot<BlockQ4_0>(n, w, a, out, [](const BlockQ4_0& x, const BlockQ8_0& y) {
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(nibbles_32(x.qs), qy),
                                       _mm256_maddubs_epi16(_mm256_set1_epi8(8), qy));
    return hsum_i32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  });
}

// Rows 0..7 against T tokens: y[t * ys + r].
template <int T>
void q4_0_x8(int64_t n, const uint8_t* w, size_t ws, const uint8_t* a, size_t as, float* y, int64_t ys) {
  const int64_t nb = n / kQK8_0;
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* blk = w + i * sizeof(BlockQ4_0);
    __m256i v[4];
    load_q4_0_x8(blk + offsetof(BlockQ4_0, qs), ws, v);
    const __m256 dx = load_d_x8(blk, ws);
    for (int t = 0; t < T; ++t) {
      const auto* q = reinterpret_cast<const BlockQ8_0*>(a + t * as) + i;
      const __m256i isum = isum_q4_0_x8(v, q->qs, sum8_x8(q->qs));
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(_cvtsh_ss(q->d))), _mm256_cvtepi32_ps(isum), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    alignas(32) float o[8];
    _mm256_store_ps(o, acc[t]);
    for (int r = 0; r < 8; ++r) y[t * ys + r] = o[r];
  }
}

template <int T>
void tile_q4_0(int64_t n, const void* w, size_t ws, const void* a, size_t as, float* y, int64_t ys) {
  q4_0_x8<T>(n, static_cast<const uint8_t*>(w), ws, static_cast<const uint8_t*>(a), as, y, ys);
}

// ---- Q4_0 packed (Packing::kQ4_0x8): the x8 tile without the transpose ------
//
// The blocks are stored as load_q4_0_x8 would produce them, with the eight
// scales side by side, and each activation block's 8 x sum and scale come
// precomputed (Q8_0Sums): one token costs about a third of the instructions
// of the row-at-a-time dot, and the arithmetic is q4_0_x8's, lane for lane.

void x8_sums_q8_0(int64_t n, const void* a, Q8_0Sums* sums) {
  const auto* y = static_cast<const BlockQ8_0*>(a);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    sums[i].m8 = _mm256_cvtsi256_si32(sum8_x8(y[i].qs));
    sums[i].d = _cvtsh_ss(y[i].d);
  }
}

template <int T>
void gemm_x8(int64_t n, const BlockQ4_0x8* w, const uint8_t* a, size_t as, const Q8_0Sums* sums, int64_t ss,
                  float* y, int64_t ys) {
  const int64_t nb = n / kQK8_0;
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    if constexpr (T == 1) prefetch_ahead(w + i);
    __m256i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs + 32 * k));
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].d)));
    for (int t = 0; t < T; ++t) {
      const auto* q = reinterpret_cast<const BlockQ8_0*>(a + t * as) + i;
      const Q8_0Sums& s = sums[t * ss + i];
      const __m256i isum = isum_q4_0_x8(v, q->qs, _mm256_set1_epi32(s.m8));
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(s.d)), _mm256_cvtepi32_ps(isum), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * ys, acc[t]);
}

// ---- packed groups and tiles of plain rows, shared by Q8_0 and the K-quants --
//
// A span kernel computes blocks [i0, i1) of a group of eight rows (w[i - i0]
// for block i) against T tokens into acc, and the K-quants with mins (Q4_K,
// Q5_K) their min chain into accm; the others leave accm at zero.
template <class Block8>
using SpanFn = void (*)(const Block8* w, int64_t i0, int64_t i1, const uint8_t* a, size_t as, __m256* acc,
                        __m256* accm);

// One group's nb blocks against T tokens: y[t * ys + r] = acc - accm (acc
// - 0 is acc, bit for bit).
template <int T, class Block8, SpanFn<Block8> Span>
inline void group_store(int64_t nb, const Block8* w, const uint8_t* a, size_t as, float* y, int64_t ys) {
  __m256 acc[T], accm[T];
  for (int t = 0; t < T; ++t) acc[t] = accm[t] = _mm256_setzero_ps();
  Span(w, 0, nb, a, as, acc, accm);
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * ys, _mm256_sub_ps(acc[t], accm[t]));
}

// Lane r of a packed block from row r's plain block: its fields' 4-byte
// pieces 32 bytes apart (as pack_rows lays them out, kernels/packing.cpp).
inline void put_pieces(uint8_t* dst, const void* src, int n_pieces, int r) {
  for (int k = 0; k < n_pieces; ++k) std::memcpy(dst + 32 * k + 4 * r, static_cast<const uint8_t*>(src) + 4 * k, 4);
}
inline void pack_lane(BlockQ8_0x8& b, const BlockQ8_0& x, int r) {
  b.d[r] = x.d;
  put_pieces(reinterpret_cast<uint8_t*>(b.qs), x.qs, 8, r);
}
inline void pack_lane(BlockQ4_Kx8& b, const BlockQ4_K& x, int r) {
  b.d[r] = x.d;
  b.dmin[r] = x.dmin;
  put_pieces(b.scales, x.scales, 3, r);
  put_pieces(b.qs, x.qs, 32, r);
}
inline void pack_lane(BlockQ5_Kx8& b, const BlockQ5_K& x, int r) {
  b.d[r] = x.d;
  b.dmin[r] = x.dmin;
  put_pieces(b.scales, x.scales, 3, r);
  put_pieces(b.qh, x.qh, 8, r);
  put_pieces(b.qs, x.qs, 32, r);
}
inline void pack_lane(BlockQ6_Kx8& b, const BlockQ6_K& x, int r) {
  b.d[r] = x.d;
  put_pieces(reinterpret_cast<uint8_t*>(b.scales), x.scales, 4, r);
  put_pieces(b.ql, x.ql, 32, r);
  put_pieces(b.qh, x.qh, 16, r);
}

// The tile of eight plain rows (file views, which are not packed): their
// blocks packed kSpan at a time into a buffer on the stack (a few KB) and
// run through the packed kernel, so a plain matrix computes exactly as its
// packed form does.
template <int T, class Block, class Block8, int kElems, int kSpan, SpanFn<Block8> Span>
void tile_on_stack(int64_t n, const void* w, size_t ws, const void* a, size_t as, float* y, int64_t ys) {
  alignas(32) Block8 buf[kSpan];
  const auto* rows = static_cast<const uint8_t*>(w);
  const int64_t nb = n / kElems;
  __m256 acc[T], accm[T];
  for (int t = 0; t < T; ++t) acc[t] = accm[t] = _mm256_setzero_ps();
  for (int64_t i0 = 0; i0 < nb; i0 += kSpan) {
    const int64_t i1 = std::min(nb, i0 + kSpan);
    for (int r = 0; r < 8; ++r) {
      const auto* x = reinterpret_cast<const Block*>(rows + r * ws);
      for (int64_t i = i0; i < i1; ++i) pack_lane(buf[i - i0], x[i], r);
    }
    Span(buf, i0, i1, static_cast<const uint8_t*>(a), as, acc, accm);
  }
  alignas(32) float o[T][8];
  for (int t = 0; t < T; ++t) _mm256_store_ps(o[t], _mm256_sub_ps(acc[t], accm[t]));
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < 8; ++r) y[t * ys + r] = o[t][r];
}

// ---- Q4_K packed (Packing::kQ4_Kx8) ----------------------------------------
//
// Per (row, token), super-block after super-block, with isum = sum_j sc[j]
// dot_j and imin = sum_j m[j] (bsums[2j] + bsums[2j + 1]) exact integers:
//   acc  = fmaf(float(isum), dx * dy, acc)
//   accm = fmaf(float(imin), dmin_x * dy, accm)
// result acc - accm. The eight rows of a group sit in the eight lanes: each
// 32-byte piece of quants holds four bytes of every row, its low and high
// nibbles two sub-blocks' elements, multiplied by the broadcast activation
// bytes and summed in int16 over a sub-block (8 pieces: at most 8 x 2 x 15 x
// 127 < 2^15), then scaled to int32 by one madd with the row's scale.
// dot_q4_k_rows computes a plain row in the same arithmetic, bit for bit.

// The scales and mins of eight rows, as unpack_scales_mins per dword lane:
// sc_lo / sc_hi bytes 0-3 = the scales of sub-blocks 0-3 / 4-7, m_lo / m_hi
// the mins.
struct ScalesMinsX8 {
  __m256i sc_lo, sc_hi, m_lo, m_hi;
};

inline ScalesMinsX8 unpack_scales_mins_x8(const uint8_t* s) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
  const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f),
                hi2 = _mm256_set1_epi32(0x30303030);
  return {_mm256_and_si256(a, m6),
          _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_and_si256(_mm256_srli_epi32(a, 2), hi2)),
          _mm256_and_si256(b, m6),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(c, 4), m4), _mm256_and_si256(_mm256_srli_epi32(b, 2), hi2))};
}

// The vpshufb pattern that puts bytes j0 and j1 of every dword lane into the
// lane's two int16 halves (built once per call, outside the loops).
inline __m256i i16_pair_pattern(int j0, int j1) {
  const int lo = j0 | 0x8000, hi = j1 | 0x8000;  // 0x80: zero the high byte
  return _mm256_setr_epi32(lo | hi << 16, (lo + 4) | (hi + 4) << 16, (lo + 8) | (hi + 8) << 16,
                           (lo + 12) | (hi + 12) << 16, lo | hi << 16, (lo + 4) | (hi + 4) << 16,
                           (lo + 8) | (hi + 8) << 16, (lo + 12) | (hi + 12) << 16);
}

// imin += m[j] (bsums[2j] + bsums[2j + 1]) for sub-blocks 2kk and 2kk + 1 of
// the eight rows (Q4_K, Q5_K), both in one madd (pair: i16_pair_pattern(0,
// 1) and (2, 3)).
template <int T>
inline void add_mins(const ScalesMinsX8& s, int kk, const __m256i* pair, const BlockQ8_K* const* y, __m256i* imin) {
  const __m256i mins = _mm256_shuffle_epi8(kk < 2 ? s.m_lo : s.m_hi, pair[kk % 2]);
  for (int t = 0; t < T; ++t) {
    const int16_t* bs = y[t]->bsums + 4 * kk;
    const int32_t pr = static_cast<uint16_t>(bs[0] + bs[1]) | static_cast<int32_t>(bs[2] + bs[3]) << 16;
    imin[t] = _mm256_add_epi32(imin[t], _mm256_madd_epi16(mins, _mm256_set1_epi32(pr)));
  }
}

// The end of a Q4_K / Q5_K super-block of eight rows: acc = fmaf(float(isum),
// dx * dy, acc) and accm = fmaf(float(imin), dmin_x * dy, accm) per lane.
template <int T>
inline void min_chains(const uint16_t* d, const uint16_t* dmin, const BlockQ8_K* const* y, const __m256i* isum,
                       const __m256i* imin, __m256* acc, __m256* accm) {
  const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
  const __m256 dmx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dmin)));
  for (int t = 0; t < T; ++t) {
    const __m256 dy = _mm256_set1_ps(y[t]->d);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dx, dy), acc[t]);
    accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[t]), _mm256_mul_ps(dmx, dy), accm[t]);
  }
}

// Super-blocks [i0, i1) of a group of eight Q4_K or Q5_K rows (w[i - i0]
// for super-block i) against T tokens, accumulated into acc / accm (the scale
// and min chains, one lane per row). Per super-block, scale_part(b, s, y,
// same, isum) adds sum_j sc[j] dot_j to isum; the min part and both chains
// are the same for the two formats. `same[j]` picks scale j of sc_lo / sc_hi
// into both halves of every lane.
template <int T, class Block8, class ScalePart>
inline void min_format_span(const Block8* w, int64_t i0, int64_t i1, const uint8_t* a, size_t as, __m256* acc,
                            __m256* accm, ScalePart scale_part) {
  const __m256i same[4] = {i16_pair_pattern(0, 0), i16_pair_pattern(1, 1), i16_pair_pattern(2, 2),
                           i16_pair_pattern(3, 3)};
  const __m256i pair[2] = {i16_pair_pattern(0, 1), i16_pair_pattern(2, 3)};  // mins of sub-blocks (0, 1), (2, 3)
  for (int64_t i = i0; i < i1; ++i) {
    const Block8& b = w[i - i0];
    if constexpr (T == 1) prefetch_ahead(&b);
    const BlockQ8_K* y[T];
    for (int t = 0; t < T; ++t) y[t] = reinterpret_cast<const BlockQ8_K*>(a + t * as) + i;
    const ScalesMinsX8 s = unpack_scales_mins_x8(b.scales);
    __m256i isum[T], imin[T];
    for (int t = 0; t < T; ++t) isum[t] = imin[t] = _mm256_setzero_si256();
    scale_part(b, s, y, same, isum);
    for (int kk = 0; kk < 4; ++kk) add_mins<T>(s, kk, pair, y, imin);
    min_chains<T>(b.d, b.dmin, y, isum, imin, acc, accm);
  }
}

// The scale part of a Q4_K super-block of eight rows (see min_format_span).
template <int T>
inline void q4_k_x8_scale_part(const BlockQ4_Kx8& b, const ScalesMinsX8& s, const BlockQ8_K* const* y,
                               const __m256i* same, __m256i* isum) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int kk = 0; kk < 4; ++kk) {  // sub-blocks 2kk (low nibbles) and 2kk + 1 (high)
    const __m256i sc_src = kk < 2 ? s.sc_lo : s.sc_hi;
    const int j = 2 * (kk % 2);
    const __m256i sc0 = _mm256_shuffle_epi8(sc_src, same[j]), sc1 = _mm256_shuffle_epi8(sc_src, same[j + 1]);
    // One token or two: both halves of each piece at once. More: the low
    // nibbles' sub-block, then the high ones', T int16 sums live at a time
    // (with both halves at once GCC spills one for T = 4, and the spilled
    // sum's store-load chain bounds the loop). Neither loop is unrolled:
    // GCC would reassociate the int16 sums and keep every product on the
    // stack.
    __m256i lo16[T], hi16[T];
    for (int t = 0; t < T; ++t) lo16[t] = hi16[t] = _mm256_setzero_si256();
    const uint8_t* qs = b.qs + 32 * 8 * kk;
    if constexpr (T <= 2) {
#pragma GCC unroll 1
      for (int mm = 0; mm < 8; ++mm) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * mm));
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        for (int t = 0; t < T; ++t) {
          const int8_t* q = y[t]->qs + 64 * kk + 4 * mm;
          lo16[t] = _mm256_add_epi16(lo16[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(q))));
          hi16[t] = _mm256_add_epi16(hi16[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(q + 32))));
        }
      }
    } else {
#pragma GCC unroll 1
      for (int mm = 0; mm < 8; ++mm) {
        const __m256i lo = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * mm)), m4);
        for (int t = 0; t < T; ++t) {
          const int8_t* q = y[t]->qs + 64 * kk + 4 * mm;
          lo16[t] = _mm256_add_epi16(lo16[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(q))));
        }
      }
#pragma GCC unroll 1
      for (int mm = 0; mm < 8; ++mm) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * mm));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        for (int t = 0; t < T; ++t) {
          const int8_t* q = y[t]->qs + 64 * kk + 32 + 4 * mm;
          hi16[t] = _mm256_add_epi16(hi16[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(q))));
        }
      }
    }
    for (int t = 0; t < T; ++t)
      isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(lo16[t], sc0),
                                                           _mm256_madd_epi16(hi16[t], sc1)));
  }
}

template <int T>
inline void q4_k_x8_span(const BlockQ4_Kx8* w, int64_t i0, int64_t i1, const uint8_t* a, size_t as, __m256* acc,
                         __m256* accm) {
  min_format_span<T>(w, i0, i1, a, as, acc, accm, q4_k_x8_scale_part<T>);
}

template <int T>
void gemm_x8(int64_t n, const BlockQ4_Kx8* w, const uint8_t* a, size_t as, const Q8_0Sums*, int64_t, float* y,
             int64_t ys) {
  group_store<T, BlockQ4_Kx8, q4_k_x8_span<T>>(n / kQK_K, w, a, as, y, ys);
}

// The packed arithmetic for one plain Q4_K row (the rows past a matrix's last
// group of eight).
void dot_q4_k_rows(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0xF);
  float acc = 0.f, accm = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const __m128i scm = unpack_scales_mins(x[i].scales);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
    const int imin = mins_dot_bsums(_mm_cvtepu8_epi16(_mm_srli_si128(scm, 8)), y[i].bsums);
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * k));
      const __m256i q8l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 64 * k));
      const __m256i q8h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 64 * k + 32));
      const __m256i pl = _mm256_maddubs_epi16(_mm256_and_si256(q4, m4), q8l);
      const __m256i ph = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), q8h);
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pl, scale_of(sc16, 2 * k)));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(ph, scale_of(sc16, 2 * k + 1)));
    }
    acc = std::fmaf(static_cast<float>(hsum_i32(sumi)), _cvtsh_ss(x[i].d) * y[i].d, acc);
    accm = std::fmaf(static_cast<float>(imin), _cvtsh_ss(x[i].dmin) * y[i].d, accm);
  }
  *out = acc - accm;
}

// Q8_K activations carry their sums (bsums): nothing to precompute.
void x8_sums_none(int64_t, const void*, Q8_0Sums*) {}

// ---- Q5_K packed (Packing::kQ5_Kx8) ----------------------------------------
//
// Q4_K's arithmetic (see q4_k_x8_span) with a fifth bit from qh: isum =
// sum_j sc[j] dot_j and imin = sum_j m[j] (bsums[2j] + bsums[2j + 1]), exact,
// then the two fmaf chains per super-block. A 5-bit value times an activation
// byte is at most 31 x 127, so int16 sums run over four pieces (at most 4 x 2
// x 31 x 127 < 2^15) before each madd with the rows' scale. dot_q5_k_rows
// computes a plain row the same way, bit for bit.

// Elements 64kk + 32(BIT % 2) + 0..31 (sub-block BIT = 2kk or 2kk + 1) of a
// super-block of eight rows against T tokens: isum += sc * dot.
template <int T, int BIT>
inline void q5_k_x8_sub(const BlockQ5_Kx8& b, const BlockQ8_K* const* y, __m256i sc, __m256i* isum) {
  constexpr int kk = BIT / 2, half = BIT % 2;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
  for (int quarter = 0; quarter < 2; ++quarter) {
    __m256i s16[T];
    for (int t = 0; t < T; ++t) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int mm = 4 * quarter; mm < 4 * quarter + 4; ++mm) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * (8 * kk + mm)));
      if constexpr (half) v = _mm256_srli_epi16(v, 4);
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * mm));
      // Bit BIT of each qh byte to bit 4 (16-bit shifts; the mask drops what
      // crosses from the neighbouring byte).
      __m256i hb;
      if constexpr (BIT <= 4) hb = _mm256_slli_epi16(h, 4 - BIT);
      else hb = _mm256_srli_epi16(h, BIT - 4);
      v = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(hb, m10));
      for (int t = 0; t < T; ++t) {
        const __m256i yb = _mm256_set1_epi32(load_i32(y[t]->qs + 64 * kk + 32 * half + 4 * mm));
        s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(v, yb));
      }
    }
    for (int t = 0; t < T; ++t) isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], sc));
  }
}

// One or two tokens: sub-blocks 2KK and 2KK + 1 at once, each piece of qs
// and qh loaded once for both (the same sums as q5_k_x8_sub on each).
template <int T, int KK>
inline void q5_k_x8_pair(const BlockQ5_Kx8& b, const BlockQ8_K* const* y, __m256i sc_lo, __m256i sc_hi,
                         __m256i* isum) {
  static_assert(T <= 2);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
  for (int quarter = 0; quarter < 2; ++quarter) {
    __m256i lo16[T], hi16[T];
    for (int t = 0; t < T; ++t) lo16[t] = hi16[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int mm = 4 * quarter; mm < 4 * quarter + 4; ++mm) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * (8 * KK + mm)));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * mm));
      __m256i hl, hh;  // bits 2KK and 2KK + 1 of each qh byte at bit 4
      if constexpr (2 * KK <= 4) hl = _mm256_slli_epi16(h, 4 - 2 * KK);
      else hl = _mm256_srli_epi16(h, 2 * KK - 4);
      if constexpr (2 * KK + 1 <= 4) hh = _mm256_slli_epi16(h, 3 - 2 * KK);
      else hh = _mm256_srli_epi16(h, 2 * KK - 3);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(hl, m10));
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_and_si256(hh, m10));
      for (int t = 0; t < T; ++t) {
        const int8_t* q = y[t]->qs + 64 * KK + 4 * mm;
        lo16[t] = _mm256_add_epi16(lo16[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(q))));
        hi16[t] = _mm256_add_epi16(hi16[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(q + 32))));
      }
    }
    for (int t = 0; t < T; ++t)
      isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(lo16[t], sc_lo),
                                                           _mm256_madd_epi16(hi16[t], sc_hi)));
  }
}

// The scale part of a Q5_K super-block of eight rows (see min_format_span).
template <int T>
inline void q5_k_x8_scale_part(const BlockQ5_Kx8& b, const ScalesMinsX8& s, const BlockQ8_K* const* y,
                               const __m256i* same, __m256i* isum) {
  // Scale of sub-block j: byte j % 4 of sc_lo (j < 4) or sc_hi.
  const auto sc = [&](int j) { return _mm256_shuffle_epi8(j < 4 ? s.sc_lo : s.sc_hi, same[j % 4]); };
  if constexpr (T <= 2) {
    q5_k_x8_pair<T, 0>(b, y, sc(0), sc(1), isum);
    q5_k_x8_pair<T, 1>(b, y, sc(2), sc(3), isum);
    q5_k_x8_pair<T, 2>(b, y, sc(4), sc(5), isum);
    q5_k_x8_pair<T, 3>(b, y, sc(6), sc(7), isum);
  } else {  // one sub-block at a time: T int16 sums live, not 2T
    q5_k_x8_sub<T, 0>(b, y, sc(0), isum);
    q5_k_x8_sub<T, 1>(b, y, sc(1), isum);
    q5_k_x8_sub<T, 2>(b, y, sc(2), isum);
    q5_k_x8_sub<T, 3>(b, y, sc(3), isum);
    q5_k_x8_sub<T, 4>(b, y, sc(4), isum);
    q5_k_x8_sub<T, 5>(b, y, sc(5), isum);
    q5_k_x8_sub<T, 6>(b, y, sc(6), isum);
    q5_k_x8_sub<T, 7>(b, y, sc(7), isum);
  }
}

template <int T>
inline void q5_k_x8_span(const BlockQ5_Kx8* w, int64_t i0, int64_t i1, const uint8_t* a, size_t as, __m256* acc,
                         __m256* accm) {
  min_format_span<T>(w, i0, i1, a, as, acc, accm, q5_k_x8_scale_part<T>);
}

template <int T>
void gemm_x8(int64_t n, const BlockQ5_Kx8* w, const uint8_t* a, size_t as, const Q8_0Sums*, int64_t, float* y,
             int64_t ys) {
  group_store<T, BlockQ5_Kx8, q5_k_x8_span<T>>(n / kQK_K, w, a, as, y, ys);
}

// ---- Q8_0 packed (Packing::kQ8_0x8) ----------------------------------------
//
// Eight rows in the eight dword lanes: for each 4-byte piece k of the block,
// |w| times the broadcast activation piece with w's signs, summed exactly to
// int32 per lane. Same arithmetic per (row, token) as dot_q8_0_lanes.

void dot_q8_0_lanes(int64_t n, const void* w, const void* a, float* out) {
  lanes_dot<BlockQ8_0>(n, w, a, out, [](const BlockQ8_0& x, const BlockQ8_0& y) {
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
    return hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx)),
                                      _mm256_set1_epi16(1)));
  });
}

// Blocks [i0, i1) of a group of eight Q8_0 rows (w[i - i0] for block i)
// against T tokens, accumulated into acc (one lane per row).
template <int T>
inline void q8_0_x8_span(const BlockQ8_0x8* w, int64_t i0, int64_t i1, const uint8_t* a, size_t as, __m256* acc,
                         __m256* /*accm: no min part*/) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = i0; i < i1; ++i) {
    const BlockQ8_0x8& b = w[i - i0];
    if constexpr (T == 1) prefetch_ahead(&b);
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * k));
      const __m256i av = _mm256_sign_epi8(v, v);
      for (int t = 0; t < T; ++t) {
        const auto* q = reinterpret_cast<const BlockQ8_0*>(a + t * as) + i;
        const __m256i yk = _mm256_set1_epi32(load_i32(q->qs + 4 * k));
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(yk, v)), ones));
      }
    }
    for (int t = 0; t < T; ++t) {
      const float dy = _cvtsh_ss(reinterpret_cast<const BlockQ8_0*>(a + t * as)[i].d);
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(dy)), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
  }
}

template <int T>
void gemm_x8(int64_t n, const BlockQ8_0x8* w, const uint8_t* a, size_t as, const Q8_0Sums*, int64_t, float* y,
             int64_t ys) {
  group_store<T, BlockQ8_0x8, q8_0_x8_span<T>>(n / kQK8_0, w, a, as, y, ys);
}

// The packed arithmetic (see q5_k_x8_span) for one plain Q5_K row: the rows
// past a matrix's last group, and the one-token product of a plain matrix.
void dot_q5_k_rows(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const __m256i m1 = _mm256_set1_epi8(1);
  float acc = 0.f, accm = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const __m128i scm = unpack_scales_mins(x[i].scales);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
    const int imin = mins_dot_bsums(_mm_cvtepu8_epi16(_mm_srli_si128(scm, 8)), y[i].bsums);
    __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qh));
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * k));
      const __m256i hl = _mm256_slli_epi16(_mm256_and_si256(hb, m1), 4);
      const __m256i hh = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), m1), 4);
      hb = _mm256_srli_epi16(hb, 2);
      const __m256i q5l = _mm256_or_si256(_mm256_and_si256(q4, m4), hl);
      const __m256i q5h = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), hh);
      const __m256i q8l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 64 * k));
      const __m256i q8h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 64 * k + 32));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q5l, q8l), scale_of(sc16, 2 * k)));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q5h, q8h), scale_of(sc16, 2 * k + 1)));
    }
    acc = std::fmaf(static_cast<float>(hsum_i32(sumi)), _cvtsh_ss(x[i].d) * y[i].d, acc);
    accm = std::fmaf(static_cast<float>(imin), _cvtsh_ss(x[i].dmin) * y[i].d, accm);
  }
  *out = acc - accm;
}

// The packed arithmetic (see q6_k_x8_span) for one plain Q6_K row: the rows
// past a matrix's last group, and the one-token product of a plain matrix.
void dot_q6_k_rows(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const __m256i m3 = _mm256_set1_epi8(3);
  float acc = 0.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    // The -32 offset: 32 * sum_g scales[g] * bsums[g].
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums));
    __m256i sumi = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5);
    sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x[i].ql + 64 * h;
      const __m256i q4a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i q4b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qh + 32 * h));
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(q4a, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(q4b, m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4a, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4b, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
      for (int p = 0; p < 4; ++p) {
        const int g = 8 * h + 2 * p;  // scale index of the first 16 of these 32
        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 128 * h + 32 * p));
        const __m256i prod = _mm256_maddubs_epi16(q[p], q8);
        const __m256i s = _mm256_set_m128i(_mm_set1_epi16(x[i].scales[g + 1]), _mm_set1_epi16(x[i].scales[g]));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(prod, s));
      }
    }
    acc = std::fmaf(static_cast<float>(hsum_i32(sumi)), _cvtsh_ss(x[i].d) * y[i].d, acc);
  }
  *out = acc;
}

// ---- Q6_K packed (Packing::kQ6_Kx8) ----------------------------------------
//
// Per (row, token), super-block after super-block, with isum = sum_g sc[g]
// (dot_g - 32 bsums[g]) an exact integer (dot_g: the 16 products of sub-block
// g with the unsigned 6-bit values):
//   acc = fmaf(float(isum), dx * dy, acc)
// The eight rows of a group sit in the eight lanes. A 6-bit value times an
// activation byte is at most 63 x 127, so one maddubs pair sum is below 2^14
// and two chunks' pair sums still fit int16; each such int16 sum is scaled to
// int32 by one madd with the sub-block's scale. dot_q6_k_rows computes a
// plain row in the same arithmetic, bit for bit.

// The vpshufb pattern that puts bytes j0 and j1 of every dword lane into the
// high bytes of the lane's two int16 halves (the low bytes zeroed): an
// arithmetic shift right by 8 then sign-extends them.
inline __m256i i8_pair_pattern(int j0, int j1) {
  const int lo = (j0 << 8) | 0x80, hi = (j1 << 8) | 0x80;  // 0x80: zero the low byte
  const auto lane = [&](int base) { return (lo + (base << 8)) | (hi + (base << 8)) << 16; };
  return _mm256_setr_epi32(lane(0), lane(4), lane(8), lane(12), lane(0), lane(4), lane(8), lane(12));
}

// The 6-bit values of elements 128h + 32S + 4c + 0..3 of the eight rows,
// from ql piece 16h + 8(S & 1) + c (L) and qh piece 8h + c (H).
template <int S>
inline __m256i q6_values(__m256i L, __m256i H) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  const __m256i lo = S < 2 ? _mm256_and_si256(L, m4) : _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
  __m256i hi;
  if constexpr (S == 0) hi = _mm256_slli_epi16(H, 4);
  if constexpr (S == 1) hi = _mm256_slli_epi16(H, 2);
  if constexpr (S == 2) hi = H;
  if constexpr (S == 3) hi = _mm256_srli_epi16(H, 2);
  return _mm256_or_si256(lo, _mm256_and_si256(hi, m30));
}

// Elements 128h + 32S + 0..31 of one super-block (sub-blocks 8h + 2S and
// 8h + 2S + 1) of the eight rows against T tokens, into isum.
template <int T, int S>
inline void q6_k_x8_quarter(const BlockQ6_Kx8& b, int h, __m256i sc_a, __m256i sc_b, const BlockQ8_K* const* y,
                            __m256i* isum) {
  const uint8_t* ql = b.ql + 32 * (16 * h + 8 * (S & 1));
  const uint8_t* qh = b.qh + 32 * 8 * h;
#pragma GCC unroll 1
  for (int cp = 0; cp < 4; ++cp) {  // chunks 2cp and 2cp + 1: 8 elements of sub-block 8h + 2S + cp / 2
    const int c = 2 * cp;
    const __m256i qa = q6_values<S>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * c)),
                                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * c)));
    const __m256i qb = q6_values<S>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * c + 32)),
                                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * c + 32)));
    const __m256i sc = cp < 2 ? sc_a : sc_b;
    for (int t = 0; t < T; ++t) {
      const int8_t* q = y[t]->qs + 128 * h + 32 * S + 4 * c;
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(qa, _mm256_set1_epi32(load_i32(q))),
                                         _mm256_maddubs_epi16(qb, _mm256_set1_epi32(load_i32(q + 4))));
      isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, sc));
    }
  }
}

// Super-blocks [i0, i1) of a group of eight rows (w[i - i0] for super-block
// i) against T tokens, accumulated into acc (one lane per row).
template <int T>
inline void q6_k_x8_span(const BlockQ6_Kx8* w, int64_t i0, int64_t i1, const uint8_t* a, size_t as, __m256* acc,
                         __m256* /*accm: no min part*/) {
  // Scale j of a dword lane in both int16 halves, and scales (0, 1), (2, 3).
  const __m256i same[4] = {i8_pair_pattern(0, 0), i8_pair_pattern(1, 1), i8_pair_pattern(2, 2),
                           i8_pair_pattern(3, 3)};
  const __m256i pair[2] = {i8_pair_pattern(0, 1), i8_pair_pattern(2, 3)};
  for (int64_t i = i0; i < i1; ++i) {
    const BlockQ6_Kx8& b = w[i - i0];
    if constexpr (T == 1) prefetch_ahead(&b);
    const BlockQ8_K* y[T];
    for (int t = 0; t < T; ++t) y[t] = reinterpret_cast<const BlockQ8_K*>(a + t * as) + i;
    __m256i piece[4];  // scales 4p..4p + 3 of every row
    for (int p = 0; p < 4; ++p) piece[p] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.scales + 32 * p));
    // The offset first: isum = -32 sum_g sc[g] bsums[g], two sub-blocks per madd.
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    for (int g = 0; g < 16; g += 2) {
      const __m256i scp = _mm256_srai_epi16(_mm256_shuffle_epi8(piece[g / 4], pair[(g % 4) / 2]), 8);
      for (int t = 0; t < T; ++t) {
        int32_t bs;
        std::memcpy(&bs, y[t]->bsums + g, 4);
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(scp, _mm256_set1_epi32(bs)));
      }
    }
    for (int t = 0; t < T; ++t) isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(isum[t], 5));
    const auto scale = [&](int g) { return _mm256_srai_epi16(_mm256_shuffle_epi8(piece[g / 4], same[g % 4]), 8); };
    for (int h = 0; h < 2; ++h) {
      const int g = 8 * h;
      q6_k_x8_quarter<T, 0>(b, h, scale(g), scale(g + 1), y, isum);
      q6_k_x8_quarter<T, 1>(b, h, scale(g + 2), scale(g + 3), y, isum);
      q6_k_x8_quarter<T, 2>(b, h, scale(g + 4), scale(g + 5), y, isum);
      q6_k_x8_quarter<T, 3>(b, h, scale(g + 6), scale(g + 7), y, isum);
    }
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dx, _mm256_set1_ps(y[t]->d)), acc[t]);
  }
}

template <int T>
void gemm_x8(int64_t n, const BlockQ6_Kx8* w, const uint8_t* a, size_t as, const Q8_0Sums*, int64_t, float* y,
             int64_t ys) {
  group_store<T, BlockQ6_Kx8, q6_k_x8_span<T>>(n / kQK_K, w, a, as, y, ys);
}

// FormatKernels::x8_gemm for a packed block type: gemm_x8<T> (overloaded on
// the block type) with the token count as its template argument.
template <class Block>
void x8_gemm(int64_t n, const void* w, const void* a, size_t as, const Q8_0Sums* sums, int64_t ss, int n_tok, float* y,
             int64_t ys) {
  const auto* wb = static_cast<const Block*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  switch (n_tok) {
    case 1: return gemm_x8<1>(n, wb, ab, as, sums, ss, y, ys);
    case 2: return gemm_x8<2>(n, wb, ab, as, sums, ss, y, ys);
    case 3: return gemm_x8<3>(n, wb, ab, as, sums, ss, y, ys);
    case 4: return gemm_x8<4>(n, wb, ab, as, sums, ss, y, ys);
    default: EBB_CHECK_MSG(false, "x8_gemm: 1 to 4 tokens");
  }
}

// ---- register-blocked tiles (several tokens at once) ---------------------------
//
// Each (row, token) dot below performs exactly the operations of the matching
// dot_* above (the batch's tile_dot) in the same order, so results are
// bit-identical.

// F16 weights against the batch's float activations (quantize_f16_wide): per
// step R weight widenings, T loads and R x T fused products, every row and
// token read once in order; per (row, token) the arithmetic of dot_f16_wide.
template <int R, int T>
void tile_f16_wide(int64_t n, const void* w, size_t ws, const void* a, size_t as, float* y, int64_t ys) {
  if (n % 8 != 0) {  // tails: the dot itself
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r)
        dot_f16_wide(n, static_cast<const uint8_t*>(w) + r * ws, static_cast<const uint8_t*>(a) + t * as,
                     y + t * ys + r);
    return;
  }
  const uint16_t* x[R];
  const float* q[T];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(w) + r * ws);
  for (int t = 0; t < T; ++t) q[t] = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a) + t * as);
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    __m256 wx[R];
    for (int r = 0; r < R; ++r) wx[r] = load_f16x8(x[r] + i);
    for (int t = 0; t < T; ++t) {
      const __m256 ay = _mm256_loadu_ps(q[t] + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wx[r], ay, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ys + r] = hsum(acc[r][t]);
}

}  // namespace

FormatTable avx2_format_table() {
  FormatTable t = scalar_format_table();
  auto row = [&](DType d) -> FormatKernels& { return t[kernel_format_index(d)]; };
  row(DType::kF32).vec_dot = dot_f32;
  row(DType::kF16) = {DType::kF16, DType::kF16, f16_to_float, quantize_f16, dot_f16};
  row(DType::kBF16) = {DType::kBF16, DType::kBF16, bf16_to_float, quantize_bf16, dot_bf16};
  // Q8_0, Q4_0 and the K-quants (below) compute plain rows in their packed
  // arithmetic, one token or many, so a matrix gives the same bits viewed
  // from the file (budget mode, the mmap baseline) as packed in its unit.
  row(DType::kQ8_0) = {DType::kQ8_0, DType::kQ8_0, q8_0_to_float, quantize_q8_0, dot_q8_0_lanes};
  row(DType::kQ4_0) = {DType::kQ4_0, DType::kQ8_0, q4_0_to_float, quantize_q8_0, dot_q4_0_lanes};
  // Tiles (rows x tokens), sized by measurement with bench_matmul: 2 x 4 for
  // the row-at-a-time forms (2 x 2 ran at about 0.75x on Q4_K and Q6_K).
  auto tile = [&](DType d, decltype(FormatKernels::vec_dot_tile) fn, int rows, int tokens) {
    row(d).vec_dot_tile = fn;
    row(d).tile_rows = rows;
    row(d).tile_tokens = tokens;
  };
  // F16 batches: activations as F16-rounded floats, so a step widens only
  // the weights (3 x 4: 12 accumulators, 3 weights and 1 activation in 16
  // registers).
  tile(DType::kF16, tile_f16_wide<3, 4>, 3, 4);
  row(DType::kF16).batch_act = DType::kF32;
  row(DType::kF16).quantize_batch_act = quantize_f16_wide;
  row(DType::kF16).tile_dot = dot_f16_wide;
  tile(DType::kQ4_0, tile_q4_0<4>, 8, 4);
  // Q8_0 and the K-quants: the packed arithmetic for plain rows too (8 x 4,
  // see tile_on_stack; its span sizes keep the stack buffer at 5-9 KB).
  tile(DType::kQ8_0, tile_on_stack<4, BlockQ8_0, BlockQ8_0x8, kQK8_0, 32, q8_0_x8_span<4>>, 8, 4);
  tile(DType::kQ4_K, tile_on_stack<4, BlockQ4_K, BlockQ4_Kx8, kQK_K, 8, q4_k_x8_span<4>>, 8, 4);
  tile(DType::kQ5_K, tile_on_stack<4, BlockQ5_K, BlockQ5_Kx8, kQK_K, 4, q5_k_x8_span<4>>, 8, 4);
  tile(DType::kQ6_K, tile_on_stack<4, BlockQ6_K, BlockQ6_Kx8, kQK_K, 4, q6_k_x8_span<4>>, 8, 4);
  row(DType::kQ4_0).tile_dot = dot_q4_0_lanes;
  row(DType::kQ4_0).x8_sums = x8_sums_q8_0;
  row(DType::kQ4_0).x8_gemm = x8_gemm<BlockQ4_0x8>;
  row(DType::kQ4_0).x8_dot = dot_q4_0_lanes;
  row(DType::kQ8_0).tile_dot = dot_q8_0_lanes;
  row(DType::kQ8_0).x8_sums = x8_sums_none;  // its packed kernel needs no sums
  row(DType::kQ8_0).x8_gemm = x8_gemm<BlockQ8_0x8>;
  row(DType::kQ8_0).x8_dot = dot_q8_0_lanes;
  row(DType::kQ4_K).x8_sums = x8_sums_none;
  row(DType::kQ4_K).x8_gemm = x8_gemm<BlockQ4_Kx8>;
  row(DType::kQ4_K).x8_dot = dot_q4_k_rows;
  row(DType::kQ4_K).quantize_act = quantize_q8_k;
  row(DType::kQ4_K).vec_dot = dot_q4_k_rows;
  row(DType::kQ4_K).tile_dot = dot_q4_k_rows;
  row(DType::kQ5_K).quantize_act = quantize_q8_k;
  row(DType::kQ5_K).vec_dot = dot_q5_k_rows;
  row(DType::kQ5_K).tile_dot = dot_q5_k_rows;
  row(DType::kQ5_K).x8_sums = x8_sums_none;
  row(DType::kQ5_K).x8_gemm = x8_gemm<BlockQ5_Kx8>;
  row(DType::kQ5_K).x8_dot = dot_q5_k_rows;
  row(DType::kQ6_K).quantize_act = quantize_q8_k;
  row(DType::kQ6_K).vec_dot = dot_q6_k_rows;
  row(DType::kQ6_K).tile_dot = dot_q6_k_rows;
  row(DType::kQ6_K).x8_sums = x8_sums_none;
  row(DType::kQ6_K).x8_gemm = x8_gemm<BlockQ6_Kx8>;
  row(DType::kQ6_K).x8_dot = dot_q6_k_rows;
  row(DType::kQ8_K).quantize_act = quantize_q8_k;
  avx2_lowbit_rows(t);  // Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS (quant_lowbit_avx2.cpp)
  return t;
}

}  // namespace ebb
