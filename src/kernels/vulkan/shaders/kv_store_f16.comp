#version 450
#extension GL_GOOGLE_include_directive : require
// Stores a batch's K (or V) rows into the F16 KV chunks: row t goes to
// position pos0 + t, chunk (pos0 + t) / chunk_size, slot (pos0 + t) %
// chunk_size, whose row starts at half chunk_off[chunk] + slot * row_len.
// Each invocation converts and writes one pair of halves (one word, so no
// two invocations write the same word).
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer S { float src[]; };       // [n_tokens, row_len] F32
layout(std430, binding = 1) buffer D { uint dst[]; };                 // F16 chunks (halves)
layout(std430, binding = 2) readonly buffer C { uint chunk_off[]; };  // [n_chunks] halves, even
layout(push_constant) uniform P {
  uint off[6];  // src: floats; dst: halves (even); chunk table: words
  uint n_tokens;
  uint row_len;  // n_kv_heads * head_dim, even
  uint pos0;
  uint chunk_size;
} p;

void main() {
  const uint half_row = p.row_len / 2u;
  const uint g = gl_GlobalInvocationID.y * (gl_NumWorkGroups.x * WG) + gl_GlobalInvocationID.x;
  if (g >= p.n_tokens * half_row) return;
  const uint t = g / half_row, i = 2u * (g % half_row);
  const uint pos = p.pos0 + t;
  const uint e = p.off[1] + chunk_off[p.off[2] + pos / p.chunk_size] + (pos % p.chunk_size) * p.row_len + i;
  const uint s = p.off[0] + t * p.row_len + i;
  dst[e >> 1] = packHalf2x16(vec2(src[s], src[s + 1u]));
}
