// y[t][r] = sum_c W[r][c] * x[t][c]: a matrix product against weights in
// GGUF's own row layout (kRows; no repacking on the GPU), F32 activations,
// F32 accumulation. The including shader defines exactly one of W_F16,
// W_Q8_0, W_Q4_0 (W_F32 too) before including this file.
//
// One workgroup per (weight row r, tile of up to TT tokens): its WG
// invocations stride over the row's 32-element blocks, dequantise each block
// once and multiply it into TT token accumulators, then sum them across the
// workgroup. Work groups: x * y cover the rows (x <= groups_x), z the token
// tiles.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };   // [rows] rows of row_bytes (bytes)
layout(std430, binding = 1) readonly buffer X { float x[]; };  // [n_tokens, x_stride]
layout(std430, binding = 2) writeonly buffer Y { float y[]; }; // [n_tokens, y_stride]
layout(push_constant) uniform P {
  uint off[6];  // w: bytes, x, y: floats
  uint rows;
  uint cols;  // a multiple of 32 (Q8_0, Q4_0) or of 2 (F32, F16)
  uint n_tokens;
  uint x_stride;  // floats between token rows of x
  uint y_stride;  // floats between token rows of y
  uint row_bytes;
  uint groups_x;
} p;

#define TT 4u
#include "reduce.glsl"

#if defined(W_F16) || defined(W_F32)
// Elements c and c + 1 (c even) of the row at byte rb.
vec2 load_pair(uint rb, uint c) {
#if defined(W_F16)
  return unpackHalf2x16(w[(rb + 2u * c) >> 2]);  // rb + 2c is 4-aligned: even cols, 4-aligned offsets
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
#if defined(W_F16) || defined(W_F32)
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
