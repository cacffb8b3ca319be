// y[t][r] = sum_c W[r][c] * x[t][c]: a matrix product against weights in
// GGUF's own row layout (kRows; no repacking on the GPU), F32 activations,
// F32 accumulation. The including shader defines exactly one of W_F32,
// W_F16, W_BF16, W_Q8_0, W_Q4_0, W_Q4_K, W_Q5_K, W_Q6_K before including
// this file.
//
// One workgroup per (weight row r, tile of up to TT tokens): its WG
// invocations stride over the row's 32-element blocks (for the K-quants, the
// 32-element sub-blocks of their 256-element super-blocks, decoded as the
// CPU's scalar dequantiser does: kernels/quant_scalar.cpp), dequantise each
// block once and multiply it into TT token accumulators, then sum them
// across the workgroup. Work groups: x * y cover the rows (x <= groups_x), z
// the token tiles.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };   // [rows] rows of row_bytes (bytes)
layout(std430, binding = 1) readonly buffer X { float x[]; };  // [n_tokens, x_stride]
layout(std430, binding = 2) writeonly buffer Y { float y[]; }; // [n_tokens, y_stride]
layout(push_constant) uniform P {
  uint off[6];  // w: bytes, x, y: floats
  uint rows;
  uint cols;  // a multiple of 256 (Q4_K, Q5_K, Q6_K), of 32 (Q8_0, Q4_0) or of 2 (F32, F16, BF16)
  uint n_tokens;
  uint x_stride;  // floats between token rows of x
  uint y_stride;  // floats between token rows of y
  uint row_bytes;
  uint groups_x;
} p;

#define TT 4u
#include "reduce.glsl"

#if defined(W_F16) || defined(W_BF16) || defined(W_F32)
#define W_PLAIN
// Elements c and c + 1 (c even) of the row at byte rb.
vec2 load_pair(uint rb, uint c) {
#if defined(W_F16)
  return unpackHalf2x16(w[(rb + 2u * c) >> 2]);  // rb + 2c is 4-aligned: even cols, 4-aligned offsets
#elif defined(W_BF16)
  const uint u = w[(rb + 2u * c) >> 2];  // as F16: two BF16 a word, element c in the low half
  return vec2(uintBitsToFloat(u << 16), uintBitsToFloat(u & 0xFFFF0000u));  // F32 = bits << 16
#else
  const uint o = (rb + 4u * c) >> 2;
  return vec2(uintBitsToFloat(w[o]), uintBitsToFloat(w[o + 1u]));
#endif
}
#else
// The 32 weights of block b of the row at byte rb, into v.
void load_block(uint rb, uint b, out float v[32]) {
#if defined(W_Q8_0)
  const uint o = rb + b * 34u;  // BlockQ8_0: fp16 d, int8 qs[32]; o is even
  const float d = LOAD_F16(w, o);
  for (uint j = 0u; j < 32u; j += 4u) {  // four quants a word
    const uint q = LOAD_U32_A2(w, o + 2u + j);
    for (uint i = 0u; i < 4u; ++i) v[j + i] = d * float(int(q << (24u - 8u * i)) >> 24);
  }
#elif defined(W_Q4_0)
  const uint o = rb + b * 18u;  // BlockQ4_0: fp16 d, qs[16]: element j low nibble, j + 16 high; o is even
  const float d = LOAD_F16(w, o);
  for (uint j = 0u; j < 16u; j += 4u) {  // four bytes (eight quants) a word
    const uint q = LOAD_U32_A2(w, o + 2u + j);
    for (uint i = 0u; i < 4u; ++i) {
      const uint byte = (q >> (8u * i)) & 0xFFu;
      v[j + i] = d * float(int(byte & 15u) - 8);
      v[j + i + 16u] = d * float(int(byte >> 4) - 8);
    }
  }
#elif defined(W_Q4_K) || defined(W_Q5_K)
  // Block b is sub-block j = b % 8 of super-block b / 8. BlockQ4_K: fp16 d,
  // fp16 dmin, scales[12], qs[128]; BlockQ5_K: the same with qh[32] before
  // qs. Sub-block j's elements l < 32 are the low (j even) or high (j odd)
  // nibbles of qs[32 (j / 2) + l]; Q5_K's fifth bit is bit j of qh[l].
  // x = (d * sc[j]) * q - dmin * m[j]; o is 4-aligned (144 / 176-byte blocks).
#if defined(W_Q4_K)
  const uint o = rb + (b >> 3) * 144u, qs = o + 16u;
#else
  const uint o = rb + (b >> 3) * 176u, qs = o + 48u;
#endif
  const uint j = b & 7u;
  const vec2 dm = unpackHalf2x16(w[o >> 2]);  // d, dmin
  // unpack_scale_min_k4 (kernels/quant_blocks.h) on scale bytes o + 4 .. o + 15.
  uint sc, m;
  if (j < 4u) {
    sc = LOAD_U8(w, o + 4u + j) & 63u;
    m = LOAD_U8(w, o + 8u + j) & 63u;
  } else {
    const uint hi = LOAD_U8(w, o + 8u + j), lo_sc = LOAD_U8(w, o + j), lo_m = LOAD_U8(w, o + 4u + j);
    sc = (hi & 15u) | ((lo_sc >> 6) << 4);
    m = (hi >> 4) | ((lo_m >> 6) << 4);
  }
  const float dl = dm.x * float(sc), ml = dm.y * float(m);
  const uint shift = 4u * (j & 1u);
  for (uint l = 0u; l < 32u; l += 4u) {  // four quants a word
    const uint q = w[(qs + 32u * (j >> 1) + l) >> 2] >> shift;
#if defined(W_Q5_K)
    const uint h = w[(o + 16u + l) >> 2] >> j;  // bit j of qh[l .. l + 3]
#endif
    for (uint i = 0u; i < 4u; ++i) {
#if defined(W_Q5_K)
      const uint v5 = ((q >> (8u * i)) & 15u) | (((h >> (8u * i)) & 1u) << 4);
#else
      const uint v5 = (q >> (8u * i)) & 15u;
#endif
      v[l + i] = dl * float(v5) - ml;
    }
  }
#elif defined(W_Q6_K)
  // Block b is elements 32 (b % 8) .. + 31 of super-block b / 8. BlockQ6_K:
  // ql[128], qh[64], int8 scales[16], fp16 d (210 bytes: o is even). Half
  // hf = (b % 8) / 4, part pt = b % 4: element l's low 4 bits are the low
  // (pt < 2) or high nibble of ql[64 hf + 32 (pt % 2) + l], its high 2 bits
  // bits 2 pt of qh[32 hf + l]; x = (d * scales[8 hf + 2 pt + l / 16]) * (q - 32).
  const uint o = rb + (b >> 3) * 210u;
  const uint hf = (b >> 2) & 1u, pt = b & 3u;
  const float d = LOAD_F16(w, o + 208u);
  const float d0 = d * float(LOAD_I8(w, o + 192u + 8u * hf + 2u * pt));
  const float d1 = d * float(LOAD_I8(w, o + 193u + 8u * hf + 2u * pt));
  const uint lshift = 4u * (pt >> 1), hshift = 2u * pt;
  for (uint l = 0u; l < 32u; l += 4u) {
    const uint ql = LOAD_U32_A2(w, o + 64u * hf + 32u * (pt & 1u) + l) >> lshift;
    const uint qh = LOAD_U32_A2(w, o + 128u + 32u * hf + l) >> hshift;
    const float dd = l < 16u ? d0 : d1;
    for (uint i = 0u; i < 4u; ++i) {
      const int q = int(((ql >> (8u * i)) & 15u) | (((qh >> (8u * i)) & 3u) << 4)) - 32;
      v[l + i] = dd * float(q);
    }
  }
#else
#error "define one weight format"
#endif
}
#endif

void main() {
  const uint r = gl_WorkGroupID.y * p.groups_x + gl_WorkGroupID.x;
  if (r >= p.rows) return;  // uniform: the whole workgroup
  const uint t0 = gl_WorkGroupID.z * TT;
  const uint nt = min(TT, p.n_tokens - t0);
  const uint tid = gl_LocalInvocationID.x;
  const uint rb = p.off[0] + r * p.row_bytes;
  float acc[TT];
  for (uint t = 0u; t < TT; ++t) acc[t] = 0.0;
#if defined(W_PLAIN)
  // Plain formats: any even cols, two elements per step.
  for (uint c = 2u * tid; c < p.cols; c += 2u * WG) {
    const vec2 wv = load_pair(rb, c);
    for (uint t = 0u; t < nt; ++t) {
      const uint xo = p.off[1] + (t0 + t) * p.x_stride + c;
      acc[t] += wv.x * x[xo] + wv.y * x[xo + 1u];
    }
  }
#else
  float v[32];
  for (uint b = tid; b < p.cols / 32u; b += WG) {
    load_block(rb, b, v);
    for (uint t = 0u; t < nt; ++t) {
      const uint xo = p.off[1] + (t0 + t) * p.x_stride + b * 32u;
      float s = 0.0;
      for (uint j = 0u; j < 32u; ++j) s += v[j] * x[xo + j];
      acc[t] += s;
    }
  }
#endif
  for (uint t = 0u; t < TT; ++t) {
    const float s = wg_sum(acc[t]);
    if (tid == 0u && t < nt) y[p.off[2] + (t0 + t) * p.y_stride + r] = s;
  }
}
