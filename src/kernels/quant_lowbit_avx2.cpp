// AVX2 kernels of Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS, and the
// Q8_1 activation quantizer. The AVX-512 target takes them as they are (its
// table starts from this one).
//
// Arithmetic: 8 float lanes per row, lane l taking the exact integer
// products of the elements e with (e mod 32) / 4 == l (maddubs + madd), one
// fused multiply-add per lane per block, then the 8-lane sum: the order of
// the reference engine's x86 kernels, so every kernel here is bit-identical
// to the ref-engine target's (quant_lowbit_ref_engine.cpp; tested), and
// within float rounding of the scalar reference.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/quant_avx2_inl.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_lowbit.h"

namespace ebb {
namespace {

using namespace avx2;

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// The sum of the eight int32 lanes (exact).
inline int32_t hsum_i32_8(__m256i v) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 1));
  return _mm_cvtsi128_si32(h);
}

// 32 bits -> 32 bytes, 0xFF where bit i of the little-endian word is set.
inline __m256i bits_to_bytes(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  // Byte i takes byte i / 8 of v, then keeps its bit i % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(v)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

inline __m256 lanes(__m256i p16) { return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1))); }

// Unsigned bytes u (< 128) times signed bytes y, pairs summed: 16 int16.
inline __m256i mul_u8(__m256i u, __m256i y) { return _mm256_maddubs_epi16(u, y); }
// Signed bytes x (> -128) times signed bytes y, pairs summed.
inline __m256i mul_i8(__m256i x, __m256i y) { return _mm256_maddubs_epi16(_mm256_abs_epi8(x), _mm256_sign_epi8(y, x)); }

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The IQ4_NL codebook in both 128-bit halves.
inline __m256i iq4_book() {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  return _mm256_set_m128i(v, v);
}

// 16 bytes of IQ4 indices -> the 32 codebook values in element order.
inline __m256i iq4_values(const uint8_t* qs, __m256i book) { return _mm256_shuffle_epi8(book, nibbles_32(qs)); }

// ---- Q8_1 activations

void quantize_q8_1_avx2(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    float d;
    const __m256i q = quantize_32(src + i * kQK8_0, abs_max_32(src + i * kQK8_0), &d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b[i].qs), q);
    const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    b[i].d = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    const float s = d * static_cast<float>(hsum_i32_8(s32));
    b[i].s = static_cast<uint16_t>(_cvtss_sh(s, _MM_FROUND_TO_NEAREST_INT));
  }
}

// ---- 32-blocks

// Q5_0's 32 values plus 16 (0..31), in element order.
inline __m256i q5_u(const uint8_t* qs, const uint8_t* qh) {
  return _mm256_or_si256(nibbles_32(qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
}

void dot_q5_0(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ5_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const __m256i qy = load32(y[i].qs);
    // (u - 16) * y = u * y - 16 * y; each 16-bit pair sum stays in range.
    const __m256i p = _mm256_sub_epi16(mul_u8(q5_u(x[i].qs, x[i].qh), qy), mul_u8(_mm256_set1_epi8(16), qy));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), lanes(p), acc);
  }
  *out = hsum(acc);
}

// Q4_1 (Q5 = false) and Q5_1 against Q8_1: lanes plus the offset chain.
template <bool Q5, class Block>
void dot_offset32(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_1*>(a);
  __m256 acc = _mm256_setzero_ps();
  float summs = 0.f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    summs = std::fmaf(h2f(x[i].m), h2f(y[i].s), summs);
    __m256i u;
    if constexpr (Q5) {
      u = q5_u(x[i].qs, x[i].qh);
    } else {
      u = nibbles_32(x[i].qs);
    }
    const __m256i p = mul_u8(u, load32(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), lanes(p), acc);
  }
  *out = hsum(acc) + summs;
}

inline __m256 iq4_nl_block(const BlockIQ4_NL& x, const BlockQ8_0& y, __m256i book, __m256 acc) {
  const __m256i p = mul_i8(iq4_values(x.qs, book), load32(y.qs));
  return _mm256_fmadd_ps(_mm256_set1_ps(h2f(y.d) * h2f(x.d)), lanes(p), acc);
}

// IQ4_NL, one token: even and odd blocks in two accumulators, a last odd
// block added in scalar.
void dot_iq4_nl(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockIQ4_NL*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const __m256i book = iq4_book();
  const int64_t nb = n / kQK8_0;
  __m256 acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) {
    acc1 = iq4_nl_block(x[i], y[i], book, acc1);
    acc2 = iq4_nl_block(x[i + 1], y[i + 1], book, acc2);
  }
  float sum = hsum(_mm256_add_ps(acc1, acc2));
  if (i < nb) {
    const __m256i p = mul_i8(iq4_values(x[i].qs, book), load32(y[i].qs));
    sum = std::fmaf(h2f(y[i].d) * h2f(x[i].d), static_cast<float>(hsum_i32_8(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))),
                    sum);
  }
  *out = sum;
}

// IQ4_NL in a batch: one accumulator.
void dot_iq4_nl_one_chain(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockIQ4_NL*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  const __m256i book = iq4_book();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK8_0; ++i) acc = iq4_nl_block(x[i], y[i], book, acc);
  *out = hsum(acc);
}

// ---- super-blocks

// Two 16-bit scales: lo in the low 128-bit half (elements 0..15 of a
// 32-piece), hi in the high one.
inline __m256i scale_pair(int lo, int hi) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(hi)), _mm_set1_epi16(static_cast<short>(lo)));
}

void dot_q2_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = y[i].d * h2f(x[i].d);
    const float dmin = -y[i].d * h2f(x[i].dmin);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales));
    // Min part: lane l = m[2l] bsums[2l] + m[2l + 1] bsums[2l + 1].
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0xF)));
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bs)), acc);
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * h));
      for (int s = 0; s < 4; ++s) {
        const int p = 4 * h + s;
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * s), m3);
        const __m256i p16 = mul_u8(q, load32(y[i].qs + 32 * p));
        const __m256i sc = scale_pair(x[i].scales[2 * p] & 15, x[i].scales[2 * p + 1] & 15);
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, sc));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
  }
  *out = hsum(acc);
}

void dot_q3_k(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int sc[16];
    for (int g = 0; g < 16; ++g) sc[g] = q3_k_scale(x[i].scales, g) - 32;
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].hmask));
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * h));
      for (int s = 0; s < 4; ++s) {
        const int p = 4 * h + s;
        // u = low bits | high bit << 2, in [0, 7]; the value is u - 4.
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * s), m3);
        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, p), one), 2);
        const __m256i qy = load32(y[i].qs + 32 * p);
        const __m256i p16 = _mm256_sub_epi16(mul_u8(_mm256_or_si256(lo, hi), qy), mul_u8(four, qy));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, scale_pair(sc[2 * p], sc[2 * p + 1])));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  *out = hsum(acc);
}

void dot_iq4_xs(int64_t n, const void* w, const void* a, float* out) {
  const auto* x = static_cast<const BlockIQ4_XS*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  const __m256i book = iq4_book();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i p16 = mul_i8(iq4_values(x[i].qs + 16 * j, book), load32(y[i].qs + 32 * j));
      const short ls = static_cast<short>(iq4_xs_scale(x[i], j) - 32);
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, _mm256_set1_epi16(ls)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(isum), acc);
  }
  *out = hsum(acc);
}

}  // namespace

void avx2_lowbit_rows(FormatTable& t) {
  using D = DType;
  auto row = [&](DType d) -> FormatKernels& { return t[kernel_format_index(d)]; };
  const auto q8_0_act = row(D::kQ8_0).quantize_act;
  const auto q8_k_act = row(D::kQ8_K).quantize_act;
  for (D d : {D::kQ4_1, D::kQ5_1, D::kQ8_1}) row(d).quantize_act = quantize_q8_1_avx2;
  for (D d : {D::kQ5_0, D::kIQ4_NL}) row(d).quantize_act = q8_0_act;
  for (D d : {D::kQ2_K, D::kQ3_K, D::kIQ4_XS}) row(d).quantize_act = q8_k_act;
  row(D::kQ5_0).vec_dot = row(D::kQ5_0).tile_dot = dot_q5_0;
  row(D::kQ4_1).vec_dot = row(D::kQ4_1).tile_dot = dot_offset32<false, BlockQ4_1>;
  row(D::kQ5_1).vec_dot = row(D::kQ5_1).tile_dot = dot_offset32<true, BlockQ5_1>;
  row(D::kIQ4_NL).vec_dot = dot_iq4_nl;
  row(D::kIQ4_NL).tile_dot = dot_iq4_nl_one_chain;
  row(D::kQ2_K).vec_dot = row(D::kQ2_K).tile_dot = dot_q2_k;
  row(D::kQ3_K).vec_dot = row(D::kQ3_K).tile_dot = dot_q3_k;
  row(D::kIQ4_XS).vec_dot = row(D::kIQ4_XS).tile_dot = dot_iq4_xs;
}

}  // namespace ebb
