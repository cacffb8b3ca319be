#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant_blocks.h"
#include "kernels/quant_lowbit.h"
#include "platform/error.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

int nearest(float v) { return static_cast<int>(std::nearbyint(v)); }

void quantize_q4_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* x = src + i * kQK8_0;
    // The value of largest magnitude maps to -8, so the full [-8, 7] range is used.
    float vmax = 0.f;
    for (int j = 0; j < kQK8_0; ++j)
      if (std::fabs(x[j]) > std::fabs(vmax)) vmax = x[j];
    const float d = vmax / -8.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK8_0 / 2; ++j) {
      const int q0 = std::clamp(nearest(x[j] * id) + 8, 0, 15);
      const int q1 = std::clamp(nearest(x[j + 16] * id) + 8, 0, 15);
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Fits x[i] ~= s * q[i] - m with q in [0, nmax], s >= 0, m >= 0 (the min is
// clamped to <= 0 as the K-quant layouts require): tries a few grid scales
// around (max - min) / nmax, refits each by least squares, keeps the best.
void fit_scale_min(const float* x, int len, int nmax, float* s_out, float* m_out) {
  float lo = 0.f, hi = x[0];
  for (int i = 0; i < len; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (hi <= lo) {
    *s_out = 0.f;
    *m_out = -lo;
    return;
  }
  float best_err = INFINITY, best_s = (hi - lo) / nmax, best_m = -lo;
  for (int k = -6; k <= 6; ++k) {
    const float iscale = (nmax + 0.1f * k) / (hi - lo);
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < len; ++i) {
      const int q = std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax);
      sq += q;
      sqq += double(q) * q;
      sx += x[i];
      sxq += double(x[i]) * q;
    }
    // Least squares for x ~= s * q + b.
    const double det = len * sqq - sq * sq;
    double s, b;
    if (det > 0) {
      s = (len * sxq - sq * sx) / det;
      b = (sx - s * sq) / len;
    } else {
      s = (hi - lo) / nmax;
      b = lo;
    }
    if (b > 0) {  // the offset must be a non-negative min subtracted
      b = 0;
      s = sqq > 0 ? sxq / sqq : 0;
    }
    if (s < 0) continue;
    float err = 0.f;
    for (int i = 0; i < len; ++i) {
      const int q = s > 0 ? std::clamp(nearest(static_cast<float>((x[i] - b) / s)), 0, nmax) : 0;
      const float e = static_cast<float>(s * q + b) - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_s = static_cast<float>(s);
      best_m = static_cast<float>(-b);
    }
  }
  *s_out = best_s;
  *m_out = best_m;
}

// Packs 8 six-bit scales and mins into the 12 bytes of a Q4_K / Q5_K block
// (the inverse of unpack_scale_min_k4).
void pack_scales_mins(const uint8_t* sc, const uint8_t* m, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 4; ++j) {
    q[j] = sc[j] & 63;
    q[j + 4] = m[j] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    q[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
    q[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
    q[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
  }
}

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): the super-block scales and
// the per-element values q[256] in [0, nmax].
void quantize_k_super(const float* x, int nmax, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scales, uint8_t* q) {
  float s[8], m[8], smax = 0.f, mmax = 0.f;
  for (int j = 0; j < 8; ++j) {
    fit_scale_min(x + 32 * j, 32, nmax, &s[j], &m[j]);
    smax = std::max(smax, s[j]);
    mmax = std::max(mmax, m[j]);
  }
  const float d = smax / 63.f, dmin = mmax / 63.f;
  *d_out = fp32_to_fp16(d);
  *dmin_out = fp32_to_fp16(dmin);
  const float dq = fp16_to_fp32(*d_out), dminq = fp16_to_fp32(*dmin_out);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(dq > 0 ? std::clamp(nearest(s[j] / dq), 0, 63) : 0);
    mn[j] = static_cast<uint8_t>(dminq > 0 ? std::clamp(nearest(m[j] / dminq), 0, 63) : 0);
  }
  pack_scales_mins(sc, mn, scales);
  // Requantize against the scales as stored.
  for (int j = 0; j < 8; ++j) {
    const float ds = dq * sc[j], dm = dminq * mn[j];
    for (int l = 0; l < 32; ++l)
      q[32 * j + l] = static_cast<uint8_t>(ds > 0 ? std::clamp(nearest((x[32 * j + l] + dm) / ds), 0, nmax) : 0);
  }
}

void quantize_q4_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t q[kQK_K];
    quantize_k_super(src + i * kQK_K, 15, &b[i].d, &b[i].dmin, b[i].scales, q);
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) b[i].qs[32 * k + l] = static_cast<uint8_t>(q[64 * k + l] | (q[64 * k + 32 + l] << 4));
  }
}

void quantize_q5_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t q[kQK_K];
    quantize_k_super(src + i * kQK_K, 31, &b[i].d, &b[i].dmin, b[i].scales, q);
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const uint8_t a = q[64 * k + l], c = q[64 * k + 32 + l];
        b[i].qs[32 * k + l] = static_cast<uint8_t>((a & 0xF) | ((c & 0xF) << 4));
        b[i].qh[l] |= static_cast<uint8_t>(((a >> 4) << (2 * k)) | ((c >> 4) << (2 * k + 1)));
      }
  }
}

// Symmetric fit of 16 values to s * q, q in [-32, 31]: the value of largest
// magnitude maps near -32; a few candidate scales, each refit by least squares.
float fit_scale_q6(const float* x) {
  float vmax = 0.f;
  for (int i = 0; i < 16; ++i)
    if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
  if (vmax == 0.f) return 0.f;
  float best_err = INFINITY, best_s = vmax / -32.f;
  for (int k = 0; k <= 8; ++k) {
    const float iscale = -(32.f - 0.25f * k) / vmax;
    double sxq = 0, sqq = 0;
    for (int i = 0; i < 16; ++i) {
      const int q = std::clamp(nearest(iscale * x[i]), -32, 31);
      sxq += double(x[i]) * q;
      sqq += double(q) * q;
    }
    if (sqq <= 0) continue;
    const float s = static_cast<float>(sxq / sqq);
    float err = 0.f;
    for (int i = 0; i < 16; ++i) {
      const float e = s * std::clamp(nearest(x[i] / s), -32, 31) - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_s = s;
    }
  }
  return best_s;
}

void quantize_q6_k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    float s[16], amax = 0.f;
    for (int g = 0; g < 16; ++g) {
      s[g] = fit_scale_q6(x + 16 * g);
      amax = std::max(amax, std::fabs(s[g]));
    }
    b[i].d = fp32_to_fp16(amax / 127.f);
    const float dq = fp16_to_fp32(b[i].d);
    uint8_t q[kQK_K];
    for (int g = 0; g < 16; ++g) {
      const int sc = dq > 0 ? std::clamp(nearest(s[g] / dq), -127, 127) : 0;
      b[i].scales[g] = static_cast<int8_t>(sc);
      const float ds = dq * sc;
      for (int l = 0; l < 16; ++l)
        q[16 * g + l] = static_cast<uint8_t>((ds != 0.f ? std::clamp(nearest(x[16 * g + l] / ds), -32, 31) : 0) + 32);
    }
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const uint8_t* qq = q + 128 * h;
        b[i].ql[64 * h + l] = static_cast<uint8_t>((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
        b[i].ql[64 * h + l + 32] = static_cast<uint8_t>((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
        b[i].qh[32 * h + l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                                   ((qq[l + 96] >> 4) << 6));
      }
  }
}

}  // namespace

bool can_quantize(DType t) { return kernel_format_index(t) >= 0; }

namespace {

// The formats of quantize_lowbit.cpp, with `span` candidate scales a side.
bool quantize_lowbit(DType t, const float* src, void* dst, int64_t n, int span) {
  switch (t) {
    case DType::kQ4_1: quantize_q4_1(src, dst, n, span); return true;
    case DType::kQ5_0: quantize_q5_0(src, dst, n, span); return true;
    case DType::kQ5_1: quantize_q5_1(src, dst, n, span); return true;
    case DType::kIQ4_NL: quantize_iq4_nl(src, dst, n, span); return true;
    case DType::kIQ4_XS: quantize_iq4_xs(src, dst, n, span); return true;
    case DType::kQ2_K: quantize_q2_k(src, dst, n, span); return true;
    case DType::kQ3_K: quantize_q3_k(src, dst, n, span); return true;
    default: return false;
  }
}

}  // namespace

void quantize_row_fast(DType t, const float* src, void* dst, int64_t n) {
  EBB_CHECK(n >= 0 && n % type_info(t).block_size == 0);
  if (!quantize_lowbit(t, src, dst, n, 0)) quantize_row(t, src, dst, n);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  EBB_CHECK_MSG(can_quantize(t), "quantize_row: format has no quantizer");
  EBB_CHECK(n >= 0 && n % type_info(t).block_size == 0);
  if (quantize_lowbit(t, src, dst, n, kSearchSpan)) return;
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::kQ4_0: quantize_q4_0(src, dst, n); return;
    case DType::kQ4_K: quantize_q4_k(src, dst, n); return;
    case DType::kQ5_K: quantize_q5_k(src, dst, n); return;
    case DType::kQ6_K: quantize_q6_k(src, dst, n); return;
    case DType::kQ8_1:
    case DType::kQ8_0:
    case DType::kQ8_K: {
      // Same round-to-nearest as the activation quantizers.
      static const FormatTable table = scalar_format_table();
      table[kernel_format_index(t)].quantize_act(src, dst, n);
      return;
    }
    default: break;
  }
  EBB_CHECK_MSG(false, "quantize_row: unreachable format");
}

}  // namespace ebb
