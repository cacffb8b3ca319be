// AVX2 + F16C loops of the KV codecs: the scalar operations (kv_codec_scalar.cpp)
// eight lanes at a time, in the same order, so the bytes and values are the
// same; tails go to the scalar loops.
#include <immintrin.h>

#include <cstring>

#include "kernels/kv_codec.h"

namespace ebb::detail {
namespace {

const KvCodecKernels& ref() { return kv_codec_kernels_scalar(); }

inline void store8(void* y, bool f16, int64_t i, __m256 v) {
  if (f16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(y) + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else {
    _mm256_storeu_ps(static_cast<float*>(y) + i, v);
  }
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ps(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
inline float hmin(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ps(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

void to_f32(const void* x, bool f16, int64_t n, float* y) {
  if (!f16) {
    std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(x);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  if (i < n) ref().to_f32(h + i, true, n - i, y + i);
}

float absmax(const float* x, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), acc);
  float m = hmax(acc);
  if (i < n) {
    const float t = ref().absmax(x + i, n - i);
    m = t > m ? t : m;
  }
  return m;
}

void minmax(const float* x, int64_t n, float* lo, float* hi) {
  if (n < 8) {
    ref().minmax(x, n, lo, hi);
    return;
  }
  __m256 a = _mm256_loadu_ps(x), b = a;
  int64_t i = 8;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    a = _mm256_min_ps(v, a);
    b = _mm256_max_ps(v, b);
  }
  float l = hmin(a), h = hmax(b);
  for (; i < n; ++i) {
    l = x[i] < l ? x[i] : l;
    h = x[i] > h ? x[i] : h;
  }
  *lo = l;
  *hi = h;
}

void col_minmax(const float* x, int64_t rows, int64_t cols, float* lo, float* hi) {
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 a = _mm256_loadu_ps(x + c), b = a;
    for (int64_t r = 1; r < rows; ++r) {
      const __m256 v = _mm256_loadu_ps(x + r * cols + c);
      a = _mm256_min_ps(v, a);
      b = _mm256_max_ps(v, b);
    }
    _mm256_storeu_ps(lo + c, a);
    _mm256_storeu_ps(hi + c, b);
  }
  for (; c < cols; ++c) {
    float a = x[c], b = x[c];
    for (int64_t r = 1; r < rows; ++r) {
      const float v = x[r * cols + c];
      a = v < a ? v : a;
      b = v > b ? v : b;
    }
    lo[c] = a;
    hi[c] = b;
  }
}

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

void quant_i8(const float* x, int64_t n, float id, int8_t* q) {
  const __m256 vid = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vid), kRound);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    const __m256i w = _mm256_cvtps_epi32(v);
    const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(p16, p16));
  }
  if (i < n) ref().quant_i8(x + i, n - i, id, q + i);
}

inline __m256 load_i8(const int8_t* q) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

void dequant_i8(const int8_t* q, int64_t n, float d, bool f16, void* y) {
  const __m256 vd = _mm256_set1_ps(d);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_mul_ps(vd, load_i8(q + i));
    const __m256 b = _mm256_mul_ps(vd, load_i8(q + i + 8));
    store8(y, f16, i, a);
    store8(y, f16, i + 8, b);
  }
  for (; i + 8 <= n; i += 8) store8(y, f16, i, _mm256_mul_ps(vd, load_i8(q + i)));
  if (i < n) ref().dequant_i8(q + i, n - i, d, f16, static_cast<uint8_t*>(y) + i * (f16 ? 2 : 4));
}

// Eight codes (0..15 in int32 lanes) -> one little-endian word, lane i at bits 4i.
inline uint32_t pack_nibbles(__m256i q) {
  const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i w = _mm256_sllv_epi32(q, sh);
  __m128i s = _mm_or_si128(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
  s = _mm_or_si128(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_or_si128(s, _mm_shuffle_epi32(s, 0xb1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(s));
}

inline __m256i code_u4(__m256 x, __m256 m, __m256 id) {
  __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(x, m), id), kRound);
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(15.f));
  return _mm256_cvtps_epi32(v);
}

void quant_u4(const float* x, int64_t n, float m, float id, uint8_t* q) {
  const __m256 vm = _mm256_set1_ps(m), vid = _mm256_set1_ps(id);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t w = pack_nibbles(code_u4(_mm256_loadu_ps(x + i), vm, vid));
    std::memcpy(q + i / 2, &w, 4);
  }
  if (i < n) ref().quant_u4(x + i, n - i, m, id, q + i / 2);
}

void quant_u4_cols(const float* x, int64_t n, const float* m, const float* id, uint8_t* q) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint32_t w = pack_nibbles(code_u4(_mm256_loadu_ps(x + i), _mm256_loadu_ps(m + i), _mm256_loadu_ps(id + i)));
    std::memcpy(q + i / 2, &w, 4);
  }
  if (i < n) ref().quant_u4_cols(x + i, n - i, m + i, id + i, q + i / 2);
}

// Codes of bytes q[0..3] as floats, lane i = nibble i.
inline __m256 load_u4(const uint8_t* q) {
  uint32_t w;
  std::memcpy(&w, q, 4);
  const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh),
                                     _mm256_set1_epi32(15));
  return _mm256_cvtepi32_ps(v);
}

void dequant_u4(const uint8_t* q, int64_t n, float m, float d, bool f16, void* y) {
  const __m256 vm = _mm256_set1_ps(m), vd = _mm256_set1_ps(d);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_add_ps(vm, _mm256_mul_ps(vd, load_u4(q + i / 2)));
    const __m256 b = _mm256_add_ps(vm, _mm256_mul_ps(vd, load_u4(q + i / 2 + 4)));
    store8(y, f16, i, a);
    store8(y, f16, i + 8, b);
  }
  for (; i + 8 <= n; i += 8) store8(y, f16, i, _mm256_add_ps(vm, _mm256_mul_ps(vd, load_u4(q + i / 2))));
  if (i < n) ref().dequant_u4(q + i / 2, n - i, m, d, f16, static_cast<uint8_t*>(y) + i * (f16 ? 2 : 4));
}

inline __m256 load_h8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

void dequant_u4_cols(const uint8_t* q, int64_t n, const uint16_t* m, const uint16_t* d, bool f16, void* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    store8(y, f16, i, _mm256_add_ps(load_h8(m + i), _mm256_mul_ps(load_h8(d + i), load_u4(q + i / 2))));
  if (i < n)
    ref().dequant_u4_cols(q + i / 2, n - i, m + i, d + i, f16, static_cast<uint8_t*>(y) + i * (f16 ? 2 : 4));
}

}  // namespace

const KvCodecKernels& kv_codec_kernels_avx2() {
  static const KvCodecKernels k{to_f32,   absmax,        minmax,     col_minmax,     quant_i8,
                                dequant_i8, quant_u4, quant_u4_cols, dequant_u4, dequant_u4_cols};
  return k;
}

}  // namespace ebb::detail
