#version 450
#extension GL_GOOGLE_include_directive : require
// RoPE in place over a batch of tokens: each invocation rotates one pair of
// one head of one token by its position's (cos, sin), as ops.h's rope:
//   style 0 (kNorm, llama):  pairs (2i, 2i + 1)
//   style 1 (kNeox, qwen):   pairs (i, i + rot_dim / 2)
// for i < rot_dim / 2; dimensions from rot_dim on are left unchanged.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };           // [n_tokens, n_heads, head_dim]
layout(std430, binding = 1) readonly buffer CS { float cs[]; }; // [n_tokens, rot_dim / 2, 2] (cos, sin)
layout(push_constant) uniform P {
  uint off[6];  // x, cs: floats
  uint n_tokens;
  uint n_heads;
  uint head_dim;
  uint rot_dim;
  uint style;
} p;

void main() {
  const uint half_rot = p.rot_dim / 2u;
  const uint g = gl_GlobalInvocationID.x;  // over n_tokens * n_heads * half_rot
  if (g >= p.n_tokens * p.n_heads * half_rot) return;
  const uint i = g % half_rot;
  const uint h = (g / half_rot) % p.n_heads;
  const uint t = g / (half_rot * p.n_heads);
  const uint base = p.off[0] + (t * p.n_heads + h) * p.head_dim;
  const uint a = base + (p.style == 0u ? 2u * i : i);
  const uint b = base + (p.style == 0u ? 2u * i + 1u : i + half_rot);
  const float c = cs[p.off[1] + (t * half_rot + i) * 2u];
  const float s = cs[p.off[1] + (t * half_rot + i) * 2u + 1u];
  const float x0 = x[a], x1 = x[b];
  x[a] = x0 * c - x1 * s;
  x[b] = x0 * s + x1 * c;
}
