#version 450
#extension GL_GOOGLE_include_directive : require
// y[r][i] = x[r][i] / sqrt(mean_i(x[r]^2) + eps) * w[i]: one workgroup per row.
// y may alias x.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };  // [n_rows, n]
layout(std430, binding = 1) readonly buffer Wt { float w[]; }; // [n]
layout(std430, binding = 2) buffer Y { float y[]; };           // [n_rows, n]
layout(push_constant) uniform P {
  uint off[6];  // x, w, y: floats
  uint n;
  uint n_rows;
  float eps;
  uint groups_x;  // rows are spread over x and y (each at most 65535)
} p;
#include "reduce.glsl"

void main() {
  const uint row = gl_WorkGroupID.y * p.groups_x + gl_WorkGroupID.x;
  if (row >= p.n_rows) return;  // uniform: the whole workgroup
  const uint tid = gl_LocalInvocationID.x;
  const uint xo = p.off[0] + row * p.n, yo = p.off[2] + row * p.n;
  float ss = 0.0;
  for (uint i = tid; i < p.n; i += WG) ss += x[xo + i] * x[xo + i];
  ss = wg_sum(ss);
  const float scale = 1.0 / sqrt(ss / float(p.n) + p.eps);
  for (uint i = tid; i < p.n; i += WG) y[yo + i] = x[xo + i] * scale * w[p.off[1] + i];
}
