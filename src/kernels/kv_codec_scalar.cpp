// Scalar reference loops of the KV codecs. The SIMD tables must match these
// bit for bit: the same operations in the same order, round-to-nearest-even,
// and clamps written as max(v, lo) / min(v, hi) with the SSE semantics (the
// second operand wins when v is NaN).
#include <cmath>
#include <cstring>

#include "kernels/kv_codec.h"
#include "platform/fp16.h"

namespace ebb::detail {
namespace {

inline float vmax(float a, float b) { return a > b ? a : b; }  // _mm_max_ps(a, b)
inline float vmin(float a, float b) { return a < b ? a : b; }  // _mm_min_ps(a, b)

inline void store(void* y, bool f16, int64_t i, float v) {
  if (f16) {
    static_cast<uint16_t*>(y)[i] = fp32_to_fp16(v);
  } else {
    static_cast<float*>(y)[i] = v;
  }
}

void to_f32(const void* x, bool f16, int64_t n, float* y) {
  if (f16) {
    const uint16_t* h = static_cast<const uint16_t*>(x);
    for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(h[i]);
  } else {
    std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
  }
}

float absmax(const float* x, int64_t n) {
  float m = 0.f;
  for (int64_t i = 0; i < n; ++i) m = vmax(std::fabs(x[i]), m);
  return m;
}

void minmax(const float* x, int64_t n, float* lo, float* hi) {
  float a = x[0], b = x[0];
  for (int64_t i = 1; i < n; ++i) {
    a = vmin(x[i], a);
    b = vmax(x[i], b);
  }
  *lo = a;
  *hi = b;
}

void col_minmax(const float* x, int64_t rows, int64_t cols, float* lo, float* hi) {
  for (int64_t c = 0; c < cols; ++c) lo[c] = hi[c] = x[c];
  for (int64_t r = 1; r < rows; ++r) {
    const float* row = x + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      lo[c] = vmin(row[c], lo[c]);
      hi[c] = vmax(row[c], hi[c]);
    }
  }
}

inline int q8(float x, float id) {
  float v = std::nearbyint(x * id);
  v = vmin(vmax(v, -127.f), 127.f);
  return static_cast<int>(v);
}

void quant_i8(const float* x, int64_t n, float id, int8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(q8(x[i], id));
}

void dequant_i8(const int8_t* q, int64_t n, float d, bool f16, void* y) {
  for (int64_t i = 0; i < n; ++i) store(y, f16, i, d * static_cast<float>(q[i]));
}

inline unsigned q4(float x, float m, float id) {
  float v = std::nearbyint((x - m) * id);
  v = vmin(vmax(v, 0.f), 15.f);
  return static_cast<unsigned>(v);
}

void quant_u4(const float* x, int64_t n, float m, float id, uint8_t* q) {
  for (int64_t i = 0; i + 1 < n; i += 2) q[i / 2] = static_cast<uint8_t>(q4(x[i], m, id) | q4(x[i + 1], m, id) << 4);
  if (n & 1) q[n / 2] = static_cast<uint8_t>(q4(x[n - 1], m, id));
}

void quant_u4_cols(const float* x, int64_t n, const float* m, const float* id, uint8_t* q) {
  for (int64_t i = 0; i + 1 < n; i += 2)
    q[i / 2] = static_cast<uint8_t>(q4(x[i], m[i], id[i]) | q4(x[i + 1], m[i + 1], id[i + 1]) << 4);
  if (n & 1) q[n / 2] = static_cast<uint8_t>(q4(x[n - 1], m[n - 1], id[n - 1]));
}

inline unsigned nibble(const uint8_t* q, int64_t i) { return (q[i / 2] >> (4 * (i & 1))) & 15u; }

void dequant_u4(const uint8_t* q, int64_t n, float m, float d, bool f16, void* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float t = d * static_cast<float>(nibble(q, i));
    store(y, f16, i, m + t);
  }
}

void dequant_u4_cols(const uint8_t* q, int64_t n, const uint16_t* m, const uint16_t* d, bool f16, void* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float t = fp16_to_fp32(d[i]) * static_cast<float>(nibble(q, i));
    store(y, f16, i, fp16_to_fp32(m[i]) + t);
  }
}

}  // namespace

const KvCodecKernels& kv_codec_kernels_scalar() {
  static const KvCodecKernels k{to_f32,   absmax,        minmax,     col_minmax,     quant_i8,
                                dequant_i8, quant_u4, quant_u4_cols, dequant_u4, dequant_u4_cols};
  return k;
}

}  // namespace ebb::detail
