// y[r * y_stride + o] += alpha * sum_j B[o][j] * t[r][j]: a LoRA term's
// up-projection and its accumulate in one dispatch (backend.h's
// LowRankUpOp). The including shader defines B_F16 or B_F32 first.
//
// One workgroup per (64 outputs, tile of up to TT rows): the tile's t rows
// go through shared memory in slices of 64 rank columns (so any rank works;
// a LoRA rank <= 64 is one slice), each invocation owns one output o and
// keeps TT accumulators, reading B's row o once for the whole tile. The sum
// over j runs in order, in F32. Work groups: x over outputs, y over tiles.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer B { uint b[]; };   // [n_out, rank]: F16 (two a word) or F32 bits
layout(std430, binding = 1) readonly buffer T { float t[]; };  // [n_tokens, t_stride]
layout(std430, binding = 2) buffer Y { float y[]; };           // [n_tokens, y_stride]
layout(push_constant) uniform P {
  uint off[6];  // b: elements (halves or floats), t, y: floats
  uint n_out;
  uint rank;
  uint n_tokens;
  uint t_stride;  // floats between rows of t
  uint y_stride;  // floats between rows of y
  float alpha;
} p;

#define TT 8u
shared float ts[TT * WG];  // [TT, 64]: the tile's rows, one slice of rank columns

float load_b(uint e) {
#if defined(B_F16)
  return LOAD_F16_ELEM(b, e);
#elif defined(B_F32)
  return uintBitsToFloat(b[e]);
#else
#error "define B_F16 or B_F32"
#endif
}

void main() {
  const uint tid = gl_LocalInvocationID.x;
  const uint o = gl_WorkGroupID.x * WG + tid;
  const uint r0 = gl_WorkGroupID.y * TT;
  const uint nr = min(TT, p.n_tokens - r0);
  const uint bo = p.off[0] + o * p.rank;
  float acc[TT];
  for (uint i = 0u; i < TT; ++i) acc[i] = 0.0;
  for (uint j0 = 0u; j0 < p.rank; j0 += WG) {  // uniform: every invocation meets the barriers
    const uint nj = min(WG, p.rank - j0);
    barrier();  // the previous slice is read
    for (uint i = 0u; i < TT; ++i) {
      float v = 0.0;
      if (i < nr && tid < nj) v = t[p.off[1] + (r0 + i) * p.t_stride + j0 + tid];
      ts[i * WG + tid] = v;
    }
    barrier();
    if (o < p.n_out) {
      for (uint j = 0u; j < nj; ++j) {
        const float w = load_b(bo + j0 + j);
        for (uint i = 0u; i < TT; ++i) acc[i] += w * ts[i * WG + j];
      }
    }
  }
  if (o >= p.n_out) return;
  for (uint i = 0u; i < nr; ++i) {
    const uint yo = p.off[2] + (r0 + i) * p.y_stride + o;
    y[yo] += p.alpha * acc[i];
  }
}
