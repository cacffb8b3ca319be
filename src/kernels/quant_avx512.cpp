// AVX-512 (F/BW/VL/DQ + VNNI + BF16) kernels: wider float dots, batch tiles
// for F32, F16 and BF16 (16 lanes; BF16 with VDPBF16PS), and VNNI (VPDPBUSD
// on 256 bits) for the packed Q8_0 and Q4_0 groups. Rows and kernels without
// an AVX-512 version (the K-quants, the activation quantizers, including the
// F16 / BF16 rounding, the plain-row forms of the packed arithmetic) are the
// AVX2 ones, which this target can also run.
// GCC 12's avx512fintrin.h seeds _mm512_cvtph_ps and others with
// _mm512_undefined_ps() and then warns about it (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/quant_avx2_inl.h"
#include "kernels/quant_blocks.h"
#include "platform/error.h"

namespace ebb {
namespace {

using avx2::load_i32;
using avx2::prefetch_ahead;

inline __m512 load_f16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 load_bf16x16(const uint16_t* p) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

inline float bf16_scalar(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

void f16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_f16x16(s + i));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(s[i]);
}

void bf16_to_float(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16x16(s + i));
  for (; i < n; ++i) dst[i] = bf16_scalar(s[i]);
}

// F16 x F16: both widened (exactly), products fused into 4 independent
// 16-wide accumulators, then 16-wide and masked tails (zeros past the end).
void dot_f16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int k = 0; k < 4; ++k) acc[k] = _mm512_fmadd_ps(load_f16x16(x + i + 16 * k), load_f16x16(y + i + 16 * k), acc[k]);
  for (; i + 16 <= n; i += 16) acc[0] = _mm512_fmadd_ps(load_f16x16(x + i), load_f16x16(y + i), acc[0]);
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
    const __m512 yv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + i));
    acc[1] = _mm512_fmadd_ps(xv, yv, acc[1]);
  }
  *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// The sum of a 16-lane vector: the halves added, then as avx2::hsum (one
// fixed order, used by the batch dot and its tile alike).
inline float hsum16(__m512 v) {
  return avx2::hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// F16 weights x F16 activations held as floats (avx2's quantize_f16_wide),
// the batch arithmetic: one chain of 16 lanes from the row's start, hsum16,
// then the tail (n % 16) one product at a time.
void dot_f16_wide16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const float*>(a);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(load_f16x16(x + i), _mm512_loadu_ps(y + i), acc);
  float s = hsum16(acc);
  for (; i < n; ++i) s += _cvtsh_ss(x[i]) * y[i];
  *out = s;
}

// BF16 x BF16 with VDPBF16PS: float lane j += x[2j] * y[2j] + x[2j+1] * y[2j+1]
// over 32 bf16 pairs per instruction. The products of two bf16 are exact in
// float; unlike the scalar reference the instruction treats bf16 subnormals
// (|v| < 2^-126) as zero and flushes subnormal results, which changes a dot
// by less than 2^-126 per term. Masked loads zero the tail.
inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

void dot_bf16(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm512_dpbf16_ps(acc[k], as_bh(_mm512_loadu_si512(x + i + 32 * k)), as_bh(_mm512_loadu_si512(y + i + 32 * k)));
  for (; i + 32 <= n; i += 32)
    acc[0] = _mm512_dpbf16_ps(acc[0], as_bh(_mm512_loadu_si512(x + i)), as_bh(_mm512_loadu_si512(y + i)));
  if (i < n) {
    const __mmask32 m = static_cast<__mmask32>((1u << (n - i)) - 1);
    acc[1] = _mm512_dpbf16_ps(acc[1], as_bh(_mm512_maskz_loadu_epi16(m, x + i)), as_bh(_mm512_maskz_loadu_epi16(m, y + i)));
  }
  *out = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// BF16 x BF16, the batch arithmetic: one VDPBF16PS chain from the row's
// start, a zero-masked last step for the tail (n % 32), then hsum16.
void dot_bf16_chain(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    acc = _mm512_dpbf16_ps(acc, as_bh(_mm512_loadu_si512(x + i)), as_bh(_mm512_loadu_si512(y + i)));
  if (i < n) {
    const __mmask32 m = static_cast<__mmask32>((1u << (n - i)) - 1);
    acc = _mm512_dpbf16_ps(acc, as_bh(_mm512_maskz_loadu_epi16(m, x + i)), as_bh(_mm512_maskz_loadu_epi16(m, y + i)));
  }
  *out = hsum16(acc);
}

void dot_f32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * k), _mm512_loadu_ps(y + i + 16 * k), acc[k]);
  for (; i + 16 <= n; i += 16) acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc[0]);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += x[i] * y[i];
  *out = s;
}

// F32 x F32, the batch arithmetic: one 16-lane chain from the row's start,
// hsum16, then the tail (n % 16) one product at a time.
void dot_f32_chain(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc);
  float s = hsum16(acc);
  for (; i < n; ++i) s += x[i] * y[i];
  *out = s;
}

// ---- batch tiles of the float formats --------------------------------------
//
// R rows x T tokens; per step of K::kStep elements, R weight loads (widened by
// K::w), T activation loads (K::a) and R x T K::fma into one chain per (row,
// token), summed by hsum16 at the end: every (row, token) computes as K::dot
// (its batch dot above), bit for bit. R x T + R + 1 of the 32 registers.
template <int R, int T, class K>
void float_tile(int64_t n, const void* w, size_t ws, const void* a, size_t as, float* y, int64_t ys) {
  if (n % K::kStep != 0) {  // tails: the dot itself
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r)
        K::dot(n, static_cast<const uint8_t*>(w) + r * ws, static_cast<const uint8_t*>(a) + t * as, y + t * ys + r);
    return;
  }
  const typename K::W* x[R];
  const typename K::A* q[T];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const typename K::W*>(static_cast<const uint8_t*>(w) + r * ws);
  for (int t = 0; t < T; ++t) q[t] = reinterpret_cast<const typename K::A*>(static_cast<const uint8_t*>(a) + t * as);
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += K::kStep) {
    decltype(K::w(x[0])) wx[R];
    for (int r = 0; r < R; ++r) wx[r] = K::w(x[r] + i);
    for (int t = 0; t < T; ++t) {
      const auto ay = K::a(q[t] + i);
      for (int r = 0; r < R; ++r) acc[r][t] = K::fma(acc[r][t], wx[r], ay);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ys + r] = hsum16(acc[r][t]);
}

// F32 weights and activations.
struct F32Tile {
  using W = float;
  using A = float;
  static constexpr int kStep = 16;
  static __m512 w(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 a(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 fma(__m512 acc, __m512 x, __m512 y) { return _mm512_fmadd_ps(x, y, acc); }
  static constexpr auto dot = dot_f32_chain;
};

// F16 weights against the batch's F16-rounded float activations: F32's
// step, only the weights widened.
struct F16WideTile : F32Tile {
  using W = uint16_t;
  static __m512 w(const uint16_t* p) { return load_f16x16(p); }
  static constexpr auto dot = dot_f16_wide16;
};

// BF16 weights and activations, 32 products per VDPBF16PS.
struct Bf16Tile {
  using W = uint16_t;
  using A = uint16_t;
  static constexpr int kStep = 32;
  static __m512bh w(const uint16_t* p) { return as_bh(_mm512_loadu_si512(p)); }
  static __m512bh a(const uint16_t* p) { return as_bh(_mm512_loadu_si512(p)); }
  static __m512 fma(__m512 acc, __m512bh x, __m512bh y) { return _mm512_dpbf16_ps(acc, x, y); }
  static constexpr auto dot = dot_bf16_chain;
};

// ---- packed Q8_0 and Q4_0 with VNNI ---------------------------------------
//
// The arithmetic of the AVX2 packed kernels (quant_avx2.cpp: q8_0_x8_span
// and gemm_x8 for BlockQ4_0x8; the layouts are in quant_blocks.h), with the
// integer dot of each 4-byte piece in one VPDPBUSD instead of VPMADDUBSW,
// VPMADDWD and VPADDD. The int32 block sums are exact either way (AVX2's int16
// partial sums never saturate: Q8_0 pairs are at most 2 x 128 x 127, Q4_0's
// eight terms at most 2 x 15 x 127 each), and the float chain is the same, so
// the results are AVX2's bit for bit, and the plain-row kernels (x8_dot, the
// tiles) stay AVX2's. One token prefetches as AVX2 does (kPrefetchAhead).

// One group of eight Q8_0 rows against T tokens: per block, |w| times each
// token's broadcast piece carrying w's signs, summed into int32 per lane.
template <int T>
void gemm_q8_0_vnni(int64_t n, const BlockQ8_0x8* w, const uint8_t* a, size_t as, float* y, int64_t ys) {
  const BlockQ8_0* q[T];
  for (int t = 0; t < T; ++t) q[t] = reinterpret_cast<const BlockQ8_0*>(a + t * as);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const BlockQ8_0x8& b = w[i];
    if constexpr (T == 1) prefetch_ahead(&b);
    __m256i isum[T];
    for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * k));
      const __m256i av = _mm256_sign_epi8(v, v);
      for (int t = 0; t < T; ++t) {
        const __m256i yk = _mm256_set1_epi32(load_i32(q[t][i].qs + 4 * k));
        isum[t] = _mm256_dpbusd_epi32(isum[t], av, _mm256_sign_epi8(yk, v));
      }
    }
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.d)));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(_cvtsh_ss(q[t][i].d))), _mm256_cvtepi32_ps(isum[t]),
                               acc[t]);
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * ys, acc[t]);
}

// One group of eight Q4_0 rows against T tokens: the nibbles (0..15) times
// the activation bytes, minus 8 x the activation sum (sums[].m8).
template <int T>
void gemm_q4_0_vnni(int64_t n, const BlockQ4_0x8* w, const uint8_t* a, size_t as, const Q8_0Sums* sums, int64_t ss,
                    float* y, int64_t ys) {
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const BlockQ8_0* q[T];
  for (int t = 0; t < T; ++t) q[t] = reinterpret_cast<const BlockQ8_0*>(a + t * as);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    if constexpr (T == 1) prefetch_ahead(w + i);
    __m256i lo[4], hi[4];
    for (int k = 0; k < 4; ++k) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs + 32 * k));
      lo[k] = _mm256_and_si256(v, m4);
      hi[k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].d)));
    for (int t = 0; t < T; ++t) {
      const int8_t* yq = q[t][i].qs;
      const Q8_0Sums& s = sums[t * ss + i];
      __m256i isum = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        isum = _mm256_dpbusd_epi32(isum, lo[k], _mm256_set1_epi32(load_i32(yq + 4 * k)));
        isum = _mm256_dpbusd_epi32(isum, hi[k], _mm256_set1_epi32(load_i32(yq + 16 + 4 * k)));
      }
      isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(s.m8));
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(s.d)), _mm256_cvtepi32_ps(isum), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + t * ys, acc[t]);
}

template <class Block>
void x8_gemm_vnni(int64_t n, const void* w, const void* a, size_t as, const Q8_0Sums* sums, int64_t ss, int n_tok,
                  float* y, int64_t ys) {
  const auto* wb = static_cast<const Block*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  auto run = [&]<int T>() {
    if constexpr (std::is_same_v<Block, BlockQ8_0x8>)
      gemm_q8_0_vnni<T>(n, wb, ab, as, y, ys);
    else
      gemm_q4_0_vnni<T>(n, wb, ab, as, sums, ss, y, ys);
  };
  switch (n_tok) {
    case 1: return run.template operator()<1>();
    case 2: return run.template operator()<2>();
    case 3: return run.template operator()<3>();
    case 4: return run.template operator()<4>();
    default: EBB_CHECK_MSG(false, "x8_gemm: 1 to 4 tokens");
  }
}

// Two consecutive groups of eight Q4_0 rows (16 rows, a ZMM lane each: group
// g in the low half, g + 1 in the high half) against T <= 8 tokens:
// gemm_q4_0_vnni's arithmetic lane for lane (the same exact int32 block sums,
// the same float chain), so bit for bit the same outputs, with each
// activation piece broadcast once for both groups and twice the tokens per
// pass over the weights: a batch of decode rows (several conversations) or a
// prefill reads each weight block once per eight tokens.
template <int T>
void gemm16_q4_0_vnni(int64_t n, const BlockQ4_0x8* w0, const BlockQ4_0x8* w1, const uint8_t* a, size_t as,
                      const Q8_0Sums* sums, int64_t ss, float* y, int64_t ys) {
  const __m512i m4 = _mm512_set1_epi8(0xF);
  const BlockQ8_0* q[T];
  for (int t = 0; t < T; ++t) q[t] = reinterpret_cast<const BlockQ8_0*>(a + t * as);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  // A batch of decode rows reads each block once, from memory. The two groups
  // sit side by side, so the next call's pair follows this one's: while this
  // pair is computed, the next is asked for at the same pace, a whole pair
  // ahead (kPrefetchAhead past each block left every call's first 2 KiB of
  // each group cold: 4 streams 1.83x -> see docs/benchmarks.md). Past the
  // matrix's last pair the hints touch whatever follows; a prefetch never
  // faults.
  const int64_t nb = n / kQK8_0;
  const char* next = reinterpret_cast<const char*>(w1) + (reinterpret_cast<const char*>(w1) - reinterpret_cast<const char*>(w0));
  constexpr size_t kPairBlock = 2 * sizeof(BlockQ4_0x8);  // bytes of the pair per block
  for (int64_t i = 0; i < nb; ++i) {
    const char* p = next + static_cast<size_t>(i) * kPairBlock;
    for (size_t l = 0; l < kPairBlock; l += 64) _mm_prefetch(p + l, _MM_HINT_T0);
    __m512i lo[4], hi[4];
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0[i].qs + 32 * k))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1[i].qs + 32 * k)), 1);
      lo[k] = _mm512_and_si512(v, m4);
      hi[k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    const __m512 dx = _mm512_cvtph_ps(
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w0[i].d))),
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(w1[i].d)), 1));
    for (int t = 0; t < T; ++t) {
      const int8_t* yq = q[t][i].qs;
      const Q8_0Sums& s = sums[t * ss + i];
      __m512i isum = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        isum = _mm512_dpbusd_epi32(isum, lo[k], _mm512_set1_epi32(load_i32(yq + 4 * k)));
        isum = _mm512_dpbusd_epi32(isum, hi[k], _mm512_set1_epi32(load_i32(yq + 16 + 4 * k)));
      }
      isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(s.m8));
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_set1_ps(s.d)), _mm512_cvtepi32_ps(isum), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + t * ys, acc[t]);
}

void x16_gemm_q4_0_vnni(int64_t n, const void* w, size_t group_bytes, const void* a, size_t as, const Q8_0Sums* sums,
                        int64_t ss, int n_tok, float* y, int64_t ys) {
  const auto* w0 = static_cast<const BlockQ4_0x8*>(w);
  const auto* w1 = reinterpret_cast<const BlockQ4_0x8*>(static_cast<const uint8_t*>(w) + group_bytes);
  const auto* ab = static_cast<const uint8_t*>(a);
  auto run = [&]<int T>() { gemm16_q4_0_vnni<T>(n, w0, w1, ab, as, sums, ss, y, ys); };
  switch (n_tok) {
    case 1: return run.template operator()<1>();
    case 2: return run.template operator()<2>();
    case 3: return run.template operator()<3>();
    case 4: return run.template operator()<4>();
    case 5: return run.template operator()<5>();
    case 6: return run.template operator()<6>();
    case 7: return run.template operator()<7>();
    case 8: return run.template operator()<8>();
    default: EBB_CHECK_MSG(false, "x16_gemm: 1 to 8 tokens");
  }
}

}  // namespace

FormatTable avx512_format_table() {
  FormatTable t = avx2_format_table();
  auto row = [&](DType d) -> FormatKernels& { return t[kernel_format_index(d)]; };
  row(DType::kF32).vec_dot = dot_f32;
  // F16 / BF16 keep the AVX2 activation rounding (bit-exact with scalar).
  row(DType::kF16).to_float = f16_to_float;
  row(DType::kF16).vec_dot = dot_f16;
  row(DType::kBF16).to_float = bf16_to_float;
  row(DType::kBF16).vec_dot = dot_bf16;
  // The AVX2 tiles compute in the AVX2 vec_dot's order: drop them where
  // vec_dot was replaced; F32, F16 and BF16 get 16-lane tiles of their own.
  // Q8_0, Q4_0 and the K-quants keep the AVX2 kernels for plain rows, which
  // compute in the packed arithmetic (see avx2_format_table); the packed
  // Q8_0 and Q4_0 groups get VNNI, bit for bit the same.
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) row(d).vec_dot_tile = nullptr;
  // F16 batches: the AVX2 batch form (F16-rounded floats), 16 lanes per step;
  // 4 x 4 measured best of 2x8 to 8x2 (bench_matmul, 64 tokens).
  row(DType::kF16).vec_dot_tile = float_tile<4, 4, F16WideTile>;
  row(DType::kF16).tile_rows = 4;
  row(DType::kF16).tile_tokens = 4;
  row(DType::kF16).tile_dot = dot_f16_wide16;
  row(DType::kF32).vec_dot_tile = float_tile<4, 4, F32Tile>;
  row(DType::kF32).tile_rows = 4;
  row(DType::kF32).tile_tokens = 4;
  row(DType::kF32).tile_dot = dot_f32_chain;
  row(DType::kBF16).vec_dot_tile = float_tile<4, 4, Bf16Tile>;
  row(DType::kBF16).tile_rows = 4;
  row(DType::kBF16).tile_tokens = 4;
  row(DType::kBF16).tile_dot = dot_bf16_chain;
  row(DType::kQ8_0).x8_gemm = x8_gemm_vnni<BlockQ8_0x8>;
  row(DType::kQ4_0).x8_gemm = x8_gemm_vnni<BlockQ4_0x8>;
  row(DType::kQ4_0).x16_gemm = x16_gemm_q4_0_vnni;
  return t;
}

}  // namespace ebb
