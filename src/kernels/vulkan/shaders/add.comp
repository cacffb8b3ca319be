#version 450
#extension GL_GOOGLE_include_directive : require
// y[i] += alpha * x[i] (the residual add with alpha 1: exactly y + x; a LoRA
// term's scale otherwise).
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Y { float y[]; };           // [n]
layout(std430, binding = 1) readonly buffer X { float x[]; };  // [n]
layout(push_constant) uniform P {
  uint off[6];  // y, x: floats
  uint n;
  float alpha;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.y * (gl_NumWorkGroups.x * WG) + gl_GlobalInvocationID.x;
  if (i >= p.n) return;
  y[p.off[0] + i] += p.alpha * x[p.off[1] + i];
}
