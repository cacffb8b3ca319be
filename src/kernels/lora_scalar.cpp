// Scalar reference of the LoRA products (STYLE habit 2): float sums in index
// order, one product and one addition per term, nothing fused. The F16
// variants convert each weight exactly to float first, so on the same values
// they give the F32 variants' bits.
#include "kernels/lora_internal.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

inline float weight(float w) { return w; }
inline float weight(uint16_t w) { return fp16_to_fp32(w); }

template <typename W>
void down_scalar(const W* a,      // [r, n_in]
                 const float* x,  // [n, x_stride]
                 int64_t x_stride, int64_t n, int64_t r, int64_t n_in,
                 float* t) {  // [n, r]
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * x_stride;
    for (int64_t j = 0; j < r; ++j) {
      const W* aj = a + j * n_in;
      float acc = 0.0f;
      for (int64_t k = 0; k < n_in; ++k) acc += weight(aj[k]) * xi[k];
      t[i * r + j] = acc;
    }
  }
}

template <typename W>
void up_scalar(const W* bt,      // [r, n_out]
               const float* t,   // [n, r]
               float s, int64_t n, int64_t r, int64_t n_out, int64_t c0, int64_t c1,
               float* y,  // [n, y_stride]
               int64_t y_stride) {
  // Columns in blocks of kBlock, so bt is read along its rows; each column's
  // sum still runs over j in order.
  constexpr int64_t kBlock = 256;
  float acc[kBlock];
  for (int64_t i = 0; i < n; ++i) {
    const float* ti = t + i * r;
    float* yi = y + i * y_stride;
    for (int64_t cb = c0; cb < c1; cb += kBlock) {
      const int64_t w = c1 - cb < kBlock ? c1 - cb : kBlock;
      for (int64_t c = 0; c < w; ++c) acc[c] = 0.0f;
      for (int64_t j = 0; j < r; ++j) {
        const float tj = ti[j];
        const W* b = bt + j * n_out + cb;
        for (int64_t c = 0; c < w; ++c) acc[c] += tj * weight(b[c]);
      }
      for (int64_t c = 0; c < w; ++c) yi[cb + c] += s * acc[c];
    }
  }
}

}  // namespace

namespace detail {
const LoraKernels& lora_kernels_scalar() {
  static const LoraKernels k{down_scalar<float>, up_scalar<float>, down_scalar<uint16_t>, up_scalar<uint16_t>};
  return k;
}
}  // namespace detail

}  // namespace ebb
