// Workgroup reductions of one float per invocation over WG invocations
// (shared-memory tree; every invocation must call them, in uniform control
// flow). Include after common.glsl, inside a shader with local_size_x = WG.
shared float red_[WG];

float wg_sum(float v) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();
  red_[tid] = v;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1u) {
    if (tid < s) red_[tid] += red_[tid + s];
    barrier();
  }
  const float r = red_[0];
  barrier();
  return r;
}

float wg_max(float v) {
  const uint tid = gl_LocalInvocationID.x;
  barrier();
  red_[tid] = v;
  barrier();
  for (uint s = WG / 2u; s > 0u; s >>= 1u) {
    if (tid < s) red_[tid] = max(red_[tid], red_[tid + s]);
    barrier();
  }
  const float r = red_[0];
  barrier();
  return r;
}
