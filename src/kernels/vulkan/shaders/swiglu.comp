#version 450
#extension GL_GOOGLE_include_directive : require
// y[i] = silu(gate[i]) * up[i] = gate[i] / (1 + e^-gate[i]) * up[i]. y may alias gate.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer G { float gate[]; };  // [n]
layout(std430, binding = 1) readonly buffer U { float up[]; };    // [n]
layout(std430, binding = 2) buffer Y { float y[]; };              // [n]
layout(push_constant) uniform P {
  uint off[6];  // gate, up, y: floats
  uint n;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.y * (gl_NumWorkGroups.x * WG) + gl_GlobalInvocationID.x;
  if (i >= p.n) return;
  const float g = gate[p.off[0] + i];
  y[p.off[2] + i] = g / (1.0 + exp(-g)) * up[p.off[1] + i];
}
