// Weight quantizers of Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K and Q3_K (see
// kernels/quantize.h): round to nearest against a scale chosen from a few
// candidates, each refit by least squares, keeping the smallest squared
// error. Valid GGUF blocks, not bit-identical to other engines' choices.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant_lowbit.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

int nearest(float v) { return static_cast<int>(std::nearbyint(v)); }

// The value of largest magnitude (with its sign); 0 for an all-zero input.
float signed_absmax(const float* x, int len) {
  float v = 0.f;
  for (int i = 0; i < len; ++i)
    if (std::fabs(x[i]) > std::fabs(v)) v = x[i];
  return v;
}

// A set of integer levels x is rounded to: the integers [lo, hi], or a
// sorted codebook of 16.
struct Levels {
  int lo = 0, hi = 0;
  const int8_t* book = nullptr;

  int first() const { return book ? book[0] : lo; }
  int last() const { return book ? book[15] : hi; }
  // The index (codebook) or value (range) nearest to v.
  int nearest_index(float v) const {
    if (!book) return std::clamp(nearest(v), lo, hi);
    // Binary search for the first level whose upper midpoint is >= v.
    int a = 0, b = 15;
    while (a < b) {
      const int m = (a + b) / 2;
      if (v > 0.5f * static_cast<float>(book[m] + book[m + 1])) {
        a = m + 1;
      } else {
        b = m;
      }
    }
    return a;
  }
  int value(int index) const { return book ? book[index] : index; }
};

// Symmetric fit x ~= s * level: candidate scales map the value of largest
// magnitude to near either end of the levels, each refit by least squares.
float fit_symmetric(const float* x, int len, const Levels& lv, int span) {
  const float vmax = signed_absmax(x, len);
  if (vmax == 0.f) return 0.f;
  float best_err = INFINITY, best_s = vmax / static_cast<float>(lv.first());
  const float step = static_cast<float>(lv.last() - lv.first()) / 64.f;
  for (int end = 0; end < 2; ++end)
    for (int k = -span; k <= span; ++k) {
      const float target = static_cast<float>(end == 0 ? lv.first() : lv.last()) + step * static_cast<float>(k);
      if (target == 0.f) continue;
      const float inv = target / vmax;
      double sxq = 0, sqq = 0;
      for (int i = 0; i < len; ++i) {
        const int q = lv.value(lv.nearest_index(x[i] * inv));
        sxq += double(x[i]) * q;
        sqq += double(q) * q;
      }
      if (sqq <= 0) continue;
      const float s = static_cast<float>(sxq / sqq);
      if (s == 0.f) continue;
      double err = 0;
      for (int i = 0; i < len; ++i) {
        const double e = double(s) * lv.value(lv.nearest_index(x[i] / s)) - x[i];
        err += e * e;
      }
      if (err < best_err) {
        best_err = static_cast<float>(err);
        best_s = s;
      }
    }
  return best_s;
}

// Affine fit x ~= s * q + b, q in [0, nmax], s >= 0; with nonpos_offset the
// offset is kept <= 0 (the K-quants subtract a non-negative min).
void fit_affine(const float* x, int len, int nmax, bool nonpos_offset, int span, float* s_out, float* b_out) {
  float lo = x[0], hi = x[0];
  for (int i = 0; i < len; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (nonpos_offset) lo = std::min(lo, 0.f);
  if (hi <= lo) {
    *s_out = 0.f;
    *b_out = lo;
    return;
  }
  double best_err = INFINITY;
  float best_s = (hi - lo) / nmax, best_b = lo;
  for (int k = -span; k <= span; ++k) {
    const float iscale = (nmax + 0.1f * k) / (hi - lo);
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < len; ++i) {
      const int q = std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax);
      sq += q;
      sqq += double(q) * q;
      sx += x[i];
      sxq += double(x[i]) * q;
    }
    const double det = len * sqq - sq * sq;
    double s = (hi - lo) / nmax, b = lo;
    if (det > 0) {
      s = (len * sxq - sq * sx) / det;
      b = (sx - s * sq) / len;
    }
    if (nonpos_offset && b > 0) {
      b = 0;
      s = sqq > 0 ? sxq / sqq : 0;
    }
    if (s <= 0) continue;
    double err = 0;
    for (int i = 0; i < len; ++i) {
      const int q = std::clamp(nearest(static_cast<float>((x[i] - b) / s)), 0, nmax);
      const double e = s * q + b - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_s = static_cast<float>(s);
      best_b = static_cast<float>(b);
    }
  }
  *s_out = best_s;
  *b_out = best_b;
}

// Q4_1 / Q5_1: q[32] in [0, nmax] against the stored (fp16) d and m.
void quantize_offset_block(const float* x, int nmax, int span, uint16_t* d_out, uint16_t* m_out, int* q) {
  float s, b;
  fit_affine(x, 32, nmax, false, 2 * span, &s, &b);
  *d_out = fp32_to_fp16(s);
  *m_out = fp32_to_fp16(b);
  const float d = fp16_to_fp32(*d_out), m = fp16_to_fp32(*m_out);
  for (int j = 0; j < 32; ++j) q[j] = d > 0.f ? std::clamp(nearest((x[j] - m) / d), 0, nmax) : 0;
}

void put_q5_bits(const int* q, uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
    h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    h |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh, &h, 4);
}

constexpr Levels kIq4Levels{0, 0, kIq4nlValues};

// 32 codebook indices of x against scale d, packed as IQ4_NL orders them.
void put_iq4_indices(const float* x, float d, uint8_t* qs) {
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int j = 0; j < 16; ++j) {
    const int lo = kIq4Levels.nearest_index(x[j] * id), hi = kIq4Levels.nearest_index(x[j + 16] * id);
    qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace

void quantize_q4_1(const float* src, void* dst, int64_t n, int span) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    int q[32];
    quantize_offset_block(src + 32 * i, 15, span, &b[i].d, &b[i].m, q);
    for (int j = 0; j < 16; ++j) b[i].qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
  }
}

void quantize_q5_1(const float* src, void* dst, int64_t n, int span) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    int q[32];
    quantize_offset_block(src + 32 * i, 31, span, &b[i].d, &b[i].m, q);
    put_q5_bits(q, b[i].qs, b[i].qh);
  }
}

void quantize_q5_0(const float* src, void* dst, int64_t n, int span) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  const Levels lv{-16, 15, nullptr};
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* x = src + 32 * i;
    b[i].d = fp32_to_fp16(fit_symmetric(x, 32, lv, span));
    const float d = fp16_to_fp32(b[i].d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = (d != 0.f ? lv.nearest_index(x[j] / d) : 0) + 16;
    put_q5_bits(q, b[i].qs, b[i].qh);
  }
}

void quantize_iq4_nl(const float* src, void* dst, int64_t n, int span) {
  auto* b = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* x = src + 32 * i;
    b[i].d = fp32_to_fp16(fit_symmetric(x, 32, kIq4Levels, span));
    put_iq4_indices(x, fp16_to_fp32(b[i].d), b[i].qs);
  }
}

void quantize_iq4_xs(const float* src, void* dst, int64_t n, int span) {
  auto* b = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + kQK_K * i;
    float s[8];
    for (int j = 0; j < 8; ++j) s[j] = fit_symmetric(x + 32 * j, 32, kIq4Levels, span);
    const float smax = signed_absmax(s, 8);
    // The largest scale maps to -32 (the 6-bit range is [-32, 31]).
    b[i].d = fp32_to_fp16(smax / -32.f);
    const float d = fp16_to_fp32(b[i].d);
    b[i].scales_h = 0;
    std::memset(b[i].scales_l, 0, sizeof(b[i].scales_l));
    for (int j = 0; j < 8; ++j) {
      const int l = d != 0.f ? std::clamp(nearest(s[j] / d), -32, 31) : 0;
      const int u = l + 32;
      b[i].scales_l[j / 2] |= static_cast<uint8_t>((u & 15) << (4 * (j % 2)));
      b[i].scales_h |= static_cast<uint16_t>((u >> 4) << (2 * j));
      put_iq4_indices(x + 32 * j, d * static_cast<float>(l), b[i].qs + 16 * j);
    }
  }
}

void quantize_q2_k(const float* src, void* dst, int64_t n, int span) {
  auto* b = static_cast<BlockQ2_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + kQK_K * i;
    float s[16], m[16], smax = 0.f, mmax = 0.f;
    for (int g = 0; g < 16; ++g) {
      float off;
      fit_affine(x + 16 * g, 16, 3, true, 2 * span, &s[g], &off);
      m[g] = -off;
      smax = std::max(smax, s[g]);
      mmax = std::max(mmax, m[g]);
    }
    b[i].d = fp32_to_fp16(smax / 15.f);
    b[i].dmin = fp32_to_fp16(mmax / 15.f);
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    int q[kQK_K];
    for (int g = 0; g < 16; ++g) {
      const int sc = d > 0.f ? std::clamp(nearest(s[g] / d), 0, 15) : 0;
      const int mn = dmin > 0.f ? std::clamp(nearest(m[g] / dmin), 0, 15) : 0;
      b[i].scales[g] = static_cast<uint8_t>(sc | (mn << 4));
      const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(mn);
      for (int l = 0; l < 16; ++l)
        q[16 * g + l] = ds > 0.f ? std::clamp(nearest((x[16 * g + l] + dm) / ds), 0, 3) : 0;
    }
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    for (int h = 0; h < 2; ++h)
      for (int sh = 0; sh < 4; ++sh)
        for (int l = 0; l < 32; ++l)
          b[i].qs[32 * h + l] |= static_cast<uint8_t>(q[128 * h + 32 * sh + l] << (2 * sh));
  }
}

void quantize_q3_k(const float* src, void* dst, int64_t n, int span) {
  auto* b = static_cast<BlockQ3_K*>(dst);
  const Levels lv{-4, 3, nullptr};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + kQK_K * i;
    float s[16];
    for (int g = 0; g < 16; ++g) s[g] = fit_symmetric(x + 16 * g, 16, lv, span);
    const float smax = signed_absmax(s, 16);
    b[i].d = fp32_to_fp16(smax / -32.f);
    const float d = fp16_to_fp32(b[i].d);
    std::memset(b[i].scales, 0, sizeof(b[i].scales));
    std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    int u[kQK_K];  // q + 4, in [0, 7]
    for (int g = 0; g < 16; ++g) {
      const int l = d != 0.f ? std::clamp(nearest(s[g] / d), -32, 31) : 0;
      const int sc = l + 32;
      if (g < 8) {
        b[i].scales[g] |= static_cast<uint8_t>(sc & 15);
      } else {
        b[i].scales[g - 8] |= static_cast<uint8_t>((sc & 15) << 4);
      }
      b[i].scales[8 + g % 4] |= static_cast<uint8_t>((sc >> 4) << (2 * (g / 4)));
      const float ds = d * static_cast<float>(l);
      for (int e = 0; e < 16; ++e) u[16 * g + e] = (ds != 0.f ? lv.nearest_index(x[16 * g + e] / ds) : 0) + 4;
    }
    for (int h = 0; h < 2; ++h)
      for (int sh = 0; sh < 4; ++sh)
        for (int l = 0; l < 32; ++l) {
          const int v = u[128 * h + 32 * sh + l];
          b[i].qs[32 * h + l] |= static_cast<uint8_t>((v & 3) << (2 * sh));
          b[i].hmask[l] |= static_cast<uint8_t>((v >> 2) << (4 * h + sh));
        }
  }
}

}  // namespace ebb
