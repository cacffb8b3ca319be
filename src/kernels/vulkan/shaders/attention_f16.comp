#version 450
#extension GL_GOOGLE_include_directive : require
// Causal grouped-query attention over an F16 KV held in chunks, with an
// online softmax in F32 (kernels/attention.h's F32 arithmetic):
//   out[i][h] = softmax_j(scale * q[i][h] . k[j][h / group]) . v[j][h / group],
//   j <= pos0 + i, group = n_heads / n_kv_heads.
// KV position j lives in chunk j / chunk_size, slot j % chunk_size; chunk c's
// K starts at half chunk_off[c] of the K buffer and its V at the same half of
// the V buffer, each chunk [chunk_size, n_kv_heads, head_dim] halves.
// One workgroup per (query row i, head h); WG positions are scored at a time
// (one per invocation), then every invocation updates its head_dim / WG
// output dimensions. head_dim <= 256.
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };        // [n_q, n_heads, head_dim]
layout(std430, binding = 1) writeonly buffer O { float o[]; };       // [n_q, n_heads, head_dim]
layout(std430, binding = 2) readonly buffer K { uint k[]; };         // F16 halves, see above
layout(std430, binding = 3) readonly buffer V { uint v[]; };         // F16 halves
layout(std430, binding = 4) readonly buffer C { uint chunk_off[]; }; // [n_chunks] halves
layout(push_constant) uniform P {
  uint off[6];  // q, o: floats; k, v: halves (even); chunk table: words
  uint n_q;
  uint n_heads;
  uint n_kv_heads;
  uint head_dim;
  uint pos0;
  uint chunk_size;
  float scale;
} p;
#include "reduce.glsl"

shared float qs[256];
shared float ps[WG];

// Half offset of position j's head kvh in the K (and V) buffer.
uint kv_at(uint j, uint kvh) {
  const uint c = j / p.chunk_size;
  return p.off[2] + chunk_off[p.off[4] + c] + ((j % p.chunk_size) * p.n_kv_heads + kvh) * p.head_dim;
}

void main() {
  const uint i = gl_WorkGroupID.x;
  const uint h = gl_WorkGroupID.y;
  const uint tid = gl_LocalInvocationID.x;
  const uint kvh = h / (p.n_heads / p.n_kv_heads);
  const uint qo = (i * p.n_heads + h) * p.head_dim;
  for (uint d = tid; d < p.head_dim; d += WG) qs[d] = q[p.off[0] + qo + d] * p.scale;
  barrier();
  const uint n_ctx = p.pos0 + i + 1u;
  const int v_delta = int(p.off[3]) - int(p.off[2]);  // V's start relative to K's
  const float NEG_INF = uintBitsToFloat(0xFF800000u);
  float m = NEG_INF;  // running maximum
  float l = 0.0;         // running sum of e^(s - m)
  float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);  // dims tid + WG * a
  for (uint j0 = 0u; j0 < n_ctx; j0 += WG) {
    const uint j = j0 + tid;
    float s = NEG_INF;
    if (j < n_ctx) {
      const uint ko = kv_at(j, kvh);
      s = 0.0;
      for (uint d = 0u; d < p.head_dim; ++d) s += qs[d] * LOAD_F16_ELEM(k, ko + d);
    }
    const float m_new = max(m, wg_max(s));  // finite: position j0 is always in range
    const float e = j < n_ctx ? exp(s - m_new) : 0.0;
    ps[tid] = e;
    const float corr = j0 == 0u ? 0.0 : exp(m - m_new);  // nothing to rescale on the first block
    l = l * corr + wg_sum(e);           // wg_sum's barriers also publish ps
    m = m_new;
    const uint n_blk = min(WG, n_ctx - j0);
    for (uint a = 0u; a < 4u; ++a) {
      const uint d = tid + WG * a;
      if (d >= p.head_dim) break;
      float sum = acc[a] * corr;
      for (uint jj = 0u; jj < n_blk; ++jj) {
        const uint vo = uint(int(kv_at(j0 + jj, kvh)) + v_delta);
        sum += ps[jj] * LOAD_F16_ELEM(v, vo + d);
      }
      acc[a] = sum;
    }
    barrier();  // ps is rewritten by the next block
  }
  const float inv = 1.0 / l;
  for (uint a = 0u; a < 4u; ++a) {
    const uint d = tid + WG * a;
    if (d < p.head_dim) o[p.off[1] + qo + d] = acc[a] * inv;
  }
}
