#include "runtime/layer_blocks.h"

#include <cstring>

#include "platform/error.h"

namespace ebb {
namespace {

void add_bias(float* y, const float* bias, int64_t n, int64_t dim, const OpsKernels& ops) {
  if (!bias) return;
  for (int64_t t = 0; t < n; ++t) ops.add(y + t * dim, bias, dim);
}

// x_out = x_in + y over n rows of d, where the product is already in y:
// in place (x_out == x_in: x_out += y) or into the product (y == x_out:
// x_out += x_in). Addition commutes, so both round alike.
void residual(const float* x_in, float* x_out, const float* y, int64_t n, int64_t d, const OpsKernels& ops) {
  if (x_out == x_in) {
    for (int64_t t = 0; t < n; ++t) ops.add(x_out + t * d, y + t * d, d);
  } else {
    EBB_CHECK_MSG(y == x_out, "a block's residual: x_out must be x_in or y");
    for (int64_t t = 0; t < n; ++t) ops.add(x_out + t * d, x_in + t * d, d);
  }
}

}  // namespace

void attention_block(const BlockKernels& k, const LayerWeights& w, int layer, LayerHooks& hooks,
                     const AttentionRows& r, int64_t n) {
  const ModelConfig& c = k.cfg;
  const OpsKernels& ops = k.ops;
  const int64_t d = c.n_embd, qd = c.q_dim(), kvd = c.kv_dim();
  for (int64_t t = 0; t < n; ++t) ops.rmsnorm(r.x_in + t * d, w.attn_norm, r.xn + t * d, d, c.rms_eps);
  hooks.project(layer, {{LoraTarget::kQ, &w.q, r.q, qd}, {LoraTarget::kK, &w.k, r.k, kvd}, {LoraTarget::kV, &w.v, r.v, kvd}},
                r.xn, d, n);
  add_bias(r.q, w.q_bias, n, qd, ops);
  add_bias(r.k, w.k_bias, n, kvd, ops);
  add_bias(r.v, w.v_bias, n, kvd, ops);
  if (r.q_raw) std::memcpy(r.q_raw, r.q, static_cast<size_t>(n * qd) * sizeof(float));
  if (r.k_raw) std::memcpy(r.k_raw, r.k, static_cast<size_t>(n * kvd) * sizeof(float));
  for (int64_t t = 0; t < n; ++t) {
    float* qt = r.q + t * qd;   // [n_head, head_dim]
    float* kt = r.k + t * kvd;  // [n_head_kv, head_dim]
    if (w.q_norm) {
      for (int64_t h = 0; h < c.n_head; ++h)
        ops.rmsnorm(qt + h * c.head_dim, w.q_norm, qt + h * c.head_dim, c.head_dim, c.rms_eps);
      for (int64_t h = 0; h < c.n_head_kv; ++h)
        ops.rmsnorm(kt + h * c.head_dim, w.k_norm, kt + h * c.head_dim, c.head_dim, c.rms_eps);
    }
    ops.rope(qt, c.n_head, c.head_dim, c.rope_dim, r.rope + t * c.rope_dim, c.rope_style);
    ops.rope(kt, c.n_head_kv, c.head_dim, c.rope_dim, r.rope + t * c.rope_dim, c.rope_style);
  }
  hooks.attend(layer, r.q, r.k, r.v, r.att, n);
  hooks.project(layer, {{LoraTarget::kO, &w.o, r.y, d}}, r.att, qd, n);
  residual(r.x_in, r.x_out, r.y, n, d, ops);
}

void ffn_block(const BlockKernels& k, const LayerWeights& w, int layer, LayerHooks& hooks, const FfnRows& r,
               int64_t n) {
  const ModelConfig& c = k.cfg;
  const OpsKernels& ops = k.ops;
  const int64_t d = c.n_embd, ff = c.n_ff;
  for (int64_t t = 0; t < n; ++t) ops.rmsnorm(r.x_in + t * d, w.ffn_norm, r.xn + t * d, d, c.rms_eps);
  hooks.project(layer, {{LoraTarget::kGate, &w.gate, r.gate, ff}, {LoraTarget::kUp, &w.up, r.up, ff}}, r.xn, d, n);
  for (int64_t t = 0; t < n; ++t) ops.swiglu(r.gate + t * ff, r.up + t * ff, r.h + t * ff, ff);
  hooks.project(layer, {{LoraTarget::kDown, &w.down, r.y, d}}, r.h, ff, n);
  residual(r.x_in, r.x_out, r.y, n, d, ops);
}

}  // namespace ebb
