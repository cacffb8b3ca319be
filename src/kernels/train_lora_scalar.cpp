// Scalar reference of the training products (STYLE habit 2): float sums in
// index order, one product and one addition per term, nothing fused; and the
// LoRA backward every target shares, written over a target's products.
#include <algorithm>

#include "kernels/train_lora_internal.h"
#include "platform/error.h"

namespace ebb::detail {
namespace {

void gemm_nn_scalar(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t a_sm, int64_t a_sk,
                    const float* b,  // [K, ldb]
                    int64_t ldb,
                    float* c,  // [M, ldc]
                    int64_t ldc) {
  // Columns in blocks of kBlock, so B is read along its rows; each column's
  // sum still runs over k in order.
  constexpr int64_t kBlock = 256;
  float acc[kBlock];
  for (int64_t m = 0; m < M; ++m) {
    const float* am = a + m * a_sm;
    float* cm = c + m * ldc;
    for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
      const int64_t w = std::min(kBlock, N - n0);
      for (int64_t j = 0; j < w; ++j) acc[j] = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float ak = am[k * a_sk];
        const float* bk = b + k * ldb + n0;
        for (int64_t j = 0; j < w; ++j) acc[j] += ak * bk[j];
      }
      for (int64_t j = 0; j < w; ++j) cm[n0 + j] += alpha * acc[j];
    }
  }
}

void gemm_nt_scalar(int64_t M, int64_t N, int64_t K, float alpha,
                    const float* a,  // [M, lda]
                    int64_t lda,
                    const float* b,  // [N, ldb]
                    int64_t ldb,
                    float* c,  // [M, ldc]
                    int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float* am = a + m * lda;
      const float* bn = b + n * ldb;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += am[k] * bn[k];
      c[m * ldc + n] += alpha * acc;
    }
}

}  // namespace

const TrainGemm& train_gemm_scalar() {
  static const TrainGemm g{gemm_nn_scalar, gemm_nt_scalar};
  return g;
}

const TrainGemm& train_gemm(Isa isa) {
  switch (isa) {
#if defined(EBB_ARCH_X86)
    case Isa::kAvx2: return train_gemm_avx2();
    case Isa::kAvx512: return train_gemm_avx512();
#endif
#if defined(EBB_ARCH_ARM)
    case Isa::kNeon: return train_gemm_neon();
#endif
    // kRefEngine: the reference engine has no training kernels; the scalar
    // reference stands in.
    case Isa::kScalar:
    case Isa::kRefEngine: return train_gemm_scalar();
    default: break;
  }
  EBB_CHECK_MSG(false, "train_gemm: instruction set not compiled in");
  __builtin_unreachable();
}

void lora_backward_with(const TrainGemm& g,
                        const float* x,   // [T, n_in]
                        const float* t,   // [T, r]
                        const float* dy,  // [T, n_out]
                        const float* a,   // [r, n_in]
                        const float* bt,  // [r, n_out]
                        float s, int64_t T, int64_t r, int64_t n_in, int64_t n_out,
                        float* da,   // [r, n_in]   +=
                        float* dbt,  // [r, n_out]  +=
                        float* dt,   // [T, r]      written
                        float* dx) {  // [T, n_in]  +=, or nullptr
  EBB_CHECK(T >= 0 && r >= 1 && n_in >= 0 && n_out >= 0);
  // dbt += s · tᵀ dy: A[j, i] = t[i, j].
  g.nn(r, n_out, T, s, t, 1, r, dy, n_out, dbt, n_out);
  // dt = s · dy btᵀ, the dot products over columns of dy and bt in chunks of
  // about 128 KB of bt, so each chunk is read from cache by every row of dy.
  const int64_t chunk = std::clamp<int64_t>(32768 / r / 64 * 64, 256, 4096);
  std::fill(dt, dt + T * r, 0.0f);
  for (int64_t c0 = 0; c0 < n_out; c0 += chunk)
    g.nt(T, r, std::min(chunk, n_out - c0), 1.0f, dy + c0, n_out, bt + c0, n_out, dt, r);
  for (int64_t e = 0; e < T * r; ++e) dt[e] *= s;
  // da += dtᵀ x: A[j, i] = dt[i, j].
  g.nn(r, n_in, T, 1.0f, dt, 1, r, x, n_in, da, n_in);
  // dx += dt a.
  if (dx != nullptr) g.nn(T, n_in, r, 1.0f, dt, r, 1, a, n_in, dx, n_in);
}

void lora_backward_scalar(const float* x, const float* t, const float* dy, const float* a, const float* bt, float s,
                          int64_t T, int64_t r, int64_t n_in, int64_t n_out, float* da, float* dbt, float* dt,
                          float* dx) {
  lora_backward_with(train_gemm_scalar(), x, t, dy, a, bt, s, T, r, n_in, n_out, da, dbt, dt, dx);
}

}  // namespace ebb::detail
