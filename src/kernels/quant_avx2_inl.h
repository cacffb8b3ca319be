// AVX2 helpers shared by quant_avx2.cpp and quant_avx512.cpp. Include only
// from files compiled with AVX2 + FMA + F16C (*_avx2.cpp, *_avx512.cpp). The
// helpers are `static` so each file keeps its own copy, built with its own
// flags: with plain `inline` the linker keeps one out-of-line copy (in any
// build that does not inline them), which could be the AVX-512 file's.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/quant_blocks.h"

namespace ebb::avx2 {

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 bf16 -> 8 floats (a bf16 is the top half of a float).
static inline __m256 load_bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

// 16 bf16 -> their float values as two vectors: the even elements (0, 2, ..,
// 14) and the odd ones (1, 3, .., 15). One shift or one mask each, no lane
// crossing; a dot product pairs evens with evens and odds with odds.
static inline void load_bf16x16_even_odd(const uint16_t* p, __m256* even, __m256* odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// 16 bytes of nibbles -> 32 bytes: low nibbles first (elements 0..15), then
// the high nibbles (elements 16..31), as Q4_0 orders them.
static inline __m256i nibbles_32(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(v, _mm256_set1_epi8(0xF));
}

static inline float abs_max_32(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8)));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 16)));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 24)));
  return hmax(m);
}

// Quantizes 32 floats with scale amax / 127, rounding to nearest even (as
// the scalar reference does); returns the bytes in element order. The
// multiplier is 127 / amax (not 1 / d), as the reference engine computes it,
// so the same activations give the same bytes.
static inline __m256i quantize_32(const float* x, float amax, float* d_out) {
  const float d = amax / 127.f;
  const float id = amax != 0.f ? 127.f / amax : 0.f;
  *d_out = d;
  const __m256 mul = _mm256_set1_ps(id);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), mul), kRound));
  __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8), mul), kRound));
  __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 16), mul), kRound));
  __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 24), mul), kRound));
  // Packing works per 128-bit lane; the final permute restores element order.
  i0 = _mm256_packs_epi32(i0, i1);
  i2 = _mm256_packs_epi32(i2, i3);
  i0 = _mm256_packs_epi16(i0, i2);
  i0 = _mm256_max_epi8(i0, _mm256_set1_epi8(-127));
  return _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The 12 packed scale bytes of a Q4_K / Q5_K block -> bytes 0..7: the eight
// 6-bit scales, bytes 8..15: the eight mins (unpack_scale_min_k4, done on
// 32-bit words: four sub-blocks per operation, no branches).
static inline __m128i unpack_scales_mins(const uint8_t* q) {
  uint32_t a, b, c;
  std::memcpy(&a, q, 4);
  std::memcpy(&b, q + 4, 4);
  std::memcpy(&c, q + 8, 4);
  const uint32_t sc_lo = a & 0x3f3f3f3fu, m_lo = b & 0x3f3f3f3fu;
  const uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
  const uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
  return _mm_set_epi32(static_cast<int>(m_hi), static_cast<int>(m_lo), static_cast<int>(sc_hi), static_cast<int>(sc_lo));
}

// The 16-bit scale of sub-block j in every lane; sc16x2 holds the eight
// 16-bit scales in both 128-bit halves.
static inline __m256i scale_of(__m256i sc16x2, int j) {
  return _mm256_shuffle_epi8(sc16x2, _mm256_set1_epi16(static_cast<short>(((2 * j + 1) << 8) | (2 * j))));
}

static inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The one-token packed kernels ask for the bytes kPrefetchAhead past the
// block they start on (each block's size of them): the hardware prefetcher
// alone left decode short of the read bandwidth. 2 KiB ahead, by
// measurement (ebb bench speed, 2 threads): Q4_0 decode 56-59 -> 61-69 tok/s
// (512 B: 58; 4-8 KiB: the same as 2); Q6_K, 151936 x 1024, 16-18 -> 19-24
// GB/s. Several tokens read block rows that sit in L2 and do without.
inline constexpr size_t kPrefetchAhead = 2048;

template <class Block>
static inline void prefetch_ahead(const Block* b) {
  const char* p = reinterpret_cast<const char*>(b) + kPrefetchAhead;
  for (size_t l = 0; l < sizeof(Block); l += 64) _mm_prefetch(p + l, _MM_HINT_T0);
}

// sum_j mn[j] * (bsums[2j] + bsums[2j + 1]); m16: the eight mins as int16.
static inline int mins_dot_bsums(__m128i m16, const int16_t* bsums) {
  const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums));
  const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
  __m128i p = _mm_madd_epi16(pairs, m16);
  p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0x4E));
  p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0xB1));
  return _mm_cvtsi128_si32(p);
}

}  // namespace ebb::avx2
