#include "train/train_pass.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/weight_source.h"
#include "platform/error.h"
#include "runtime/layer_blocks.h"

namespace ebb {

void LoraGrads::zero() {
  for (Buffer& b : da) std::memset(b.data(), 0, b.size());
  for (Buffer& b : dbt) std::memset(b.data(), 0, b.size());
}

LoraGrads make_grads(const LoraAdapter& adapter, Allocator& alloc) {
  LoraGrads g;
  for (const LoraPair& p : adapter.pairs) {
    g.da.push_back(alloc.allocate(p.a.size(), MemCategory::kTrainGrads));
    g.dbt.push_back(alloc.allocate(p.bt.size(), MemCategory::kTrainGrads));
  }
  g.zero();
  return g;
}

// What the backward of one layer reads (F32, rows of the sample).
struct TrainPass::LayerActs {
  Buffer xn;    // [T, d]   attention norm's output
  Buffer qraw;  // [T, qd]  q projection (+ bias), before the Q norm and RoPE
  Buffer kraw;  // [T, kvd]
  Buffer q;     // [T, qd]  after the Q norm and RoPE
  Buffer k;     // [T, kvd]
  Buffer v;     // [T, kvd]
  Buffer o;     // [T, qd]  attention output
  Buffer lse;   // [T, n_head]
  Buffer x2;    // [T, d]   after the attention residual
  Buffer xn2;   // [T, d]   FFN norm's output
  Buffer g, u;  // [T, ff]
  Buffer h;     // [T, ff]  swiglu(g, u)
  Buffer t[kLoraLayerTargets];  // [T, rank] each pair's A x
};

namespace {

float* f(const Buffer& b) { return b.as<float>(); }

Buffer alloc_f(Allocator& a, int64_t n) {
  Buffer b = a.allocate(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float), MemCategory::kTrainActivations);
  return b;
}


// Causal attention of the sample, split over the pool by KV head: each
// thread gathers one KV head's group of query heads into contiguous rows,
// runs the kernel on them (n_heads = group, n_kv_heads = 1), and scatters the
// results back. Heads are independent, so this is exact.
struct HeadSplit {
  int64_t T, n_head, n_kv, hd, group;
  int64_t qd() const { return n_head * hd; }
  int64_t kvd() const { return n_kv * hd; }
  // floats of one thread's gathered buffers: q, out, dout, dq [T, group, hd],
  // k, v, dk, dv [T, hd], lse [T, group], scratch [T]
  int64_t floats() const { return T * (4 * group * hd + 4 * hd + group + 1); }
};

void gather(const float* src, int64_t T, int64_t stride, int64_t off, int64_t n, float* dst) {
  for (int64_t t = 0; t < T; ++t) std::memcpy(dst + t * n, src + t * stride + off, static_cast<size_t>(n) * sizeof(float));
}
void scatter(const float* src, int64_t T, int64_t stride, int64_t off, int64_t n, float* dst) {
  for (int64_t t = 0; t < T; ++t) std::memcpy(dst + t * stride + off, src + t * n, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace

int64_t default_head_rows(const Model& model) {
  // The head: output.weight, or the token embedding when the model ties them.
  const TensorSlot* head = nullptr;
  for (const TensorSlot& s : model.globals_unit().slots()) {
    if (s.name == "output.weight") head = &s;
    if (s.name == "token_embd.weight" && head == nullptr) head = &s;
  }
  return head != nullptr && type_info(head->type).block_size > 1 ? 32 : 16;
}

TrainPass::TrainPass(const Model& model, Isa isa, ThreadPool& pool, Allocator& alloc, TrainPassOptions opts)
    : model_(model),
      cfg_(model.config()),
      isa_(isa),
      ks_(kernel_set(isa)),
      ops_(ops_kernels(isa)),
      lk_(lora_kernels(isa)),
      tk_(train_ops_kernels(isa)),
      pool_(pool),
      alloc_(alloc),
      opts_(opts),
      resident_(model) {
  if (opts_.head_rows == 0) opts_.head_rows = default_head_rows(model_);
  if (opts_.head_rows < 1 || opts_.matmul_rows < 1) throw Error("training: head_rows and matmul_rows must be >= 1");
  size_t mm = 0;
  auto consider = [&](const WeightUnit& u) {
    for (const TensorSlot& s : u.slots())
      if (s.dims.size() == 2) mm = std::max(mm, matmul_scratch_bytes(s.type, s.dims[0], opts_.matmul_rows));
  };
  for (int l = 0; l < model_.n_layers(); ++l) consider(model_.layer_unit(l));
  consider(model_.globals_unit());
  mm_scratch_ = alloc_.allocate(mm, MemCategory::kTrainActivations);
  head_ = alloc_f(alloc_, opts_.head_rows * cfg_.n_vocab);
}

TrainPass::~TrainPass() = default;

uint64_t TrainPass::activation_bytes(int64_t T, int64_t max_rank) const {
  const ModelConfig& c = cfg_;
  const int64_t per_layer = T * (3 * c.n_embd + 3 * c.q_dim() + 3 * c.kv_dim() + c.n_head + 3 * c.n_ff) +
                            kLoraLayerTargets * T * max_rank;
  const int64_t layers = opts_.recompute ? 1 : c.n_layer;
  const int64_t inputs = (c.n_layer + 1) * T * c.n_embd;
  const int64_t work = T * (3 * c.n_embd + 2 * c.q_dim() + 3 * c.kv_dim() + 3 * c.n_ff + max_rank) + T + 2 * T * c.rope_dim;
  return static_cast<uint64_t>(per_layer * layers + inputs + work) * sizeof(float);
}

void TrainPass::release() {
  acts_.clear();
  inputs_.clear();
  rope_.reset();
  rope_back_.reset();
  attn_.reset();
  work_.reset();
  dx_.clear();
  dx_.shrink_to_fit();
  T_ = 0;
  cap_T_ = cap_rank_ = 0;
}

uint64_t TrainPass::held_bytes() const {
  uint64_t b = 0;
  for (const LayerActs& a : acts_) {
    for (const Buffer* x : {&a.xn, &a.qraw, &a.kraw, &a.q, &a.k, &a.v, &a.o, &a.lse, &a.x2, &a.xn2, &a.g, &a.u, &a.h})
      b += x->size();
    for (const Buffer& t : a.t) b += t.size();
  }
  for (const Buffer& x : inputs_) b += x.size();
  for (const Buffer* x : {&attn_, &rope_, &rope_back_, &work_}) b += x->size();
  return b;
}

void TrainPass::allocate_acts(int64_t T, int64_t max_rank) {
  const ModelConfig& c = cfg_;
  // The buffers of an earlier sample at least as long serve this one: every
  // buffer is [T, ...] rows from its start, and nothing reads what this
  // sample has not written (re-allocating them for each sample was a tenth
  // of a training step in page faults and zeroing).
  if (cap_T_ >= T && cap_rank_ >= std::max<int64_t>(max_rank, 1)) {
    T_ = T;
    return;
  }
  release();
  T_ = T;
  cap_T_ = T;
  cap_rank_ = std::max<int64_t>(max_rank, 1);
  const int64_t layers = opts_.recompute ? 1 : c.n_layer;
  acts_.resize(static_cast<size_t>(layers));
  for (LayerActs& a : acts_) {
    a.xn = alloc_f(alloc_, T * c.n_embd);
    a.qraw = alloc_f(alloc_, T * c.q_dim());
    a.kraw = alloc_f(alloc_, T * c.kv_dim());
    a.q = alloc_f(alloc_, T * c.q_dim());
    a.k = alloc_f(alloc_, T * c.kv_dim());
    a.v = alloc_f(alloc_, T * c.kv_dim());
    a.o = alloc_f(alloc_, T * c.q_dim());
    a.lse = alloc_f(alloc_, T * c.n_head);
    a.x2 = alloc_f(alloc_, T * c.n_embd);
    a.xn2 = alloc_f(alloc_, T * c.n_embd);
    a.g = alloc_f(alloc_, T * c.n_ff);
    a.u = alloc_f(alloc_, T * c.n_ff);
    a.h = alloc_f(alloc_, T * c.n_ff);
    for (Buffer& t : a.t) t = alloc_f(alloc_, T * std::max<int64_t>(max_rank, 1));
  }
  for (int64_t l = 0; l <= c.n_layer; ++l) inputs_.push_back(alloc_f(alloc_, T * c.n_embd));
  // matmul_t's scratch for the largest product of a T-row sample (from the
  // shapes: the units need not be resident now).
  {
    size_t mt = matmul_t_scratch_floats(head_shape(model_), std::min(T, opts_.head_rows), pool_.size());
    for (int l = 0; l < model_.n_layers(); ++l) {
      const LayerWeights w = layer_shapes(model_, l);
      for (const WeightView* v : {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down})
        mt = std::max(mt, matmul_t_scratch_floats(*v, T, pool_.size()));
    }
    if (mt_scratch_.size() < mt * sizeof(float)) {
      mt_scratch_.reset();
      mt_scratch_ = alloc_.allocate(mt * sizeof(float), MemCategory::kTrainActivations);
    }
  }
  attn_ = alloc_f(alloc_, pool_.size() * HeadSplit{T, c.n_head, c.n_head_kv, c.head_dim, c.n_head / c.n_head_kv}.floats());
  rope_ = alloc_f(alloc_, T * c.rope_dim);
  rope_back_ = alloc_f(alloc_, T * c.rope_dim);
  const int64_t work = T * (3 * c.n_embd + 2 * c.q_dim() + 3 * c.kv_dim() + 3 * c.n_ff + max_rank) + T;
  work_ = alloc_f(alloc_, work);
}

void TrainPass::project(const WeightView& w, const float* x, int64_t x_stride, float* y, int64_t y_stride) {
  for (int64_t r0 = 0; r0 < T_; r0 += opts_.matmul_rows) {
    MatmulArgs a;
    a.w = &w;
    a.x = x + r0 * x_stride;
    a.x_stride = x_stride;
    a.n_tokens = std::min(opts_.matmul_rows, T_ - r0);
    a.y = y + r0 * y_stride;
    a.y_stride = y_stride;
    a.scratch = mm_scratch_.data();
    matmul(ks_, a, pool_);
  }
}

// The sample's part of the layer blocks (runtime/layer_blocks.h): products
// in blocks of matmul_rows rows, the trainable adapter's pairs keeping their
// A x for the backward, and causal attention over the sample keeping the
// log-sum-exp.
class TrainPass::SampleHooks final : public LayerHooks {
 public:
  SampleHooks(TrainPass& p, const LoraAdapter& ad, LayerActs& a) : p_(p), ad_(ad), a_(a) {}

  // y = x W^T, then y += s B (A x), keeping A x in a.t[target].
  void project(int layer, std::initializer_list<Out> outs, const float* x, int64_t x_stride, int64_t n) override {
    for (const Out& o : outs) {
      p_.project(*o.w, x, x_stride, o.y, o.y_stride);
      const LoraPair* pr = ad_.find(layer, o.target);
      if (!pr) continue;
      float* t = f(a_.t[static_cast<int>(o.target)]);
      p_.lk_.down(pr->a_data(), x, x_stride, n, pr->rank, pr->n_in, t);
      p_.lk_.up(pr->bt_data(), t, pr->scale, n, pr->rank, pr->n_out, 0, pr->n_out, o.y, o.y_stride);
    }
  }

  // Split over the pool by KV head (HeadSplit), keeping each row's LSE.
  void attend(int layer, const float* qa, const float* ka, const float* va, float* out, int64_t n) override {
    const ModelConfig& c = p_.cfg_;
    const int64_t T = n;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const HeadSplit hs{T, c.n_head, c.n_head_kv, c.head_dim, c.n_head / c.n_head_kv};
    p_.pool_.parallel_for(c.n_head_kv, 1, [&](int64_t h0, int64_t h1, int th) {
      float* b = f(p_.attn_) + th * hs.floats();
      float *q = b, *o = q + T * hs.group * hs.hd, *k = o + 3 * T * hs.group * hs.hd, *v = k + T * hs.hd,
            *lse = v + 3 * T * hs.hd;
      for (int64_t h = h0; h < h1; ++h) {
        gather(qa, T, hs.qd(), h * hs.group * hs.hd, hs.group * hs.hd, q);
        gather(ka, T, hs.kvd(), h * hs.hd, hs.hd, k);
        gather(va, T, hs.kvd(), h * hs.hd, hs.hd, v);
        p_.tk_.attention_forward(q, k, v, T, hs.group, 1, hs.hd, scale, o, lse);
        scatter(o, T, hs.qd(), h * hs.group * hs.hd, hs.group * hs.hd, out);
        scatter(lse, T, c.n_head, h * hs.group, hs.group, f(a_.lse));
      }
    });
  }

 private:
  TrainPass& p_;
  const LoraAdapter& ad_;
  LayerActs& a_;
};

void TrainPass::layer_forward(int l, const LayerWeights& w, const LoraAdapter& ad, LayerActs& a, const float* x_in,
                              float* x_out) {
  // The blocks keep what layer_backward reads: the norms' outputs, q and k
  // before and after their norms and RoPE, v, the attention output and its
  // LSE, the residual stream between the blocks, gate, up and their SwiGLU.
  SampleHooks hooks(*this, ad, a);
  const BlockKernels bk{cfg_, ops_};
  attention_block(bk, w, l, hooks,
                  {.x_in = x_in, .x_out = f(a.x2), .y = f(a.x2), .xn = f(a.xn), .q = f(a.q), .k = f(a.k),
                   .v = f(a.v), .att = f(a.o), .rope = f(rope_), .q_raw = f(a.qraw), .k_raw = f(a.kraw)},
                  T_);
  ffn_block(bk, w, l, hooks,
            {.x_in = f(a.x2), .x_out = x_out, .y = x_out, .xn = f(a.xn2), .gate = f(a.g), .up = f(a.u), .h = f(a.h)},
            T_);
}

void TrainPass::forward_begin(std::span<const int32_t> tokens, std::span<const float> weights, const LoraAdapter& ad) {
  const ModelConfig& c = cfg_;
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (T < 2) throw Error("a training sample needs at least 2 tokens (it has " + std::to_string(T) + ")");
  if (weights.size() != tokens.size()) {
    throw Error("a training sample has " + std::to_string(tokens.size()) + " tokens and " +
                std::to_string(weights.size()) + " weights; they must be as many");
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.n_vocab) {
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(c.n_vocab) + ")");
    }
  }
  for (const LoraPair& p : ad.pairs) {
    if (static_cast<int>(p.target) >= kLoraLayerTargets) {
      throw Error("training: '" + lora_base_tensor_name(p.layer, p.target) +
                  "' cannot be trained (only q, k, v, o, gate, up and down)");
    }
  }
  allocate_acts(T, ad.max_rank());
  tokens_.assign(tokens.begin(), tokens.end());
  weights_.assign(weights.begin(), weights.end());
  loss_ = 0;
  const int64_t d = c.n_embd;
  WeightSource& src = source();
  PassScope pass(src, pass_tokens());
  // Embeddings and RoPE tables: (cos, sin) per position, and (cos, -sin)
  // for the backward (the transposed rotation).
  for (int64_t t = 0; t < T; ++t) {
    const MatrixRow e = src.embedding_row(tokens[t]);
    dequantize_row(ks_, e.matrix, e.row, f(inputs_[0]) + t * d);
    float* cs = f(rope_) + t * c.rope_dim;
    ops_.rope_angles(t, c.rope_dim, c.rope_base, c.rope_freq_scale, cs,
                     c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data());
    float* cb = f(rope_back_) + t * c.rope_dim;
    for (int64_t i = 0; i < c.rope_dim; i += 2) {
      cb[i] = cs[i];
      cb[i + 1] = -cs[i + 1];
    }
  }
}

void TrainPass::forward_layers(int l0, int l1, const LoraAdapter& ad) {
  EBB_CHECK_MSG(T_ > 0 && 0 <= l0 && l0 <= l1 && l1 <= model_.n_layers(), "TrainPass::forward_layers out of order");
  WeightSource& src = source();
  PassScope pass(src, pass_tokens());
  for (int l = l0; l < l1; ++l) {
    LayerActs& a = acts_[opts_.recompute ? 0 : static_cast<size_t>(l)];
    const LayerLease w(src, l);
    layer_forward(l, w.weights(), ad, a, f(inputs_[l]), f(inputs_[l + 1]));
  }
}

void TrainPass::forward_head(int64_t r0, int64_t r1) {
  const ModelConfig& c = cfg_;
  const int64_t T = T_, d = c.n_embd;
  EBB_CHECK_MSG(T > 0 && 0 <= r0 && r0 <= r1 && r1 <= T && r0 % opts_.head_rows == 0 &&
                    (r1 == T || r1 % opts_.head_rows == 0),
                "TrainPass::forward_head: rows out of range or not on a block boundary");
  WeightSource& src = source();
  PassScope pass(src, pass_tokens());
  // The head, a block of rows at a time: logits, the loss and its gradient,
  // and the gradient back through the head, kept in the work buffer's first
  // [T, d] (dxf, for loss scale 1).
  const GlobalWeights g = src.acquire_head();
  struct HeadLease {
    WeightSource& s;
    ~HeadLease() { s.release_head(); }
  } head_lease{src};
  if (g.output.rows != c.n_vocab) {
    throw Error("training needs the whole output head at once; this weight source serves it in parts of " +
                std::to_string(g.output.rows) + " of " + std::to_string(c.n_vocab) + " rows (budget mode)");
  }
  float* xf = f(work_);          // [T, d] the final norm's output (the first block of work)
  float* dxf = xf + T * d;       // [T, d]
  const float* x_last = f(inputs_[static_cast<size_t>(c.n_layer)]);
  for (int64_t t = r0; t < r1; ++t) {
    std::memset(dxf + t * d, 0, static_cast<size_t>(d) * sizeof(float));
    ops_.rmsnorm(x_last + t * d, g.output_norm, xf + t * d, d, c.rms_eps);
  }
  double loss = loss_;
  for (int64_t b0 = r0; b0 < r1; b0 += opts_.head_rows) {
    const int64_t n = std::min(opts_.head_rows, r1 - b0);
    for (int64_t i = 0; i < n; i += opts_.matmul_rows) {
      MatmulArgs m;
      m.w = &g.output;
      m.x = xf + (b0 + i) * d;
      m.x_stride = d;
      m.n_tokens = std::min(opts_.matmul_rows, n - i);
      m.y = f(head_) + i * c.n_vocab;
      m.y_stride = c.n_vocab;
      m.scratch = mm_scratch_.data();
      matmul(ks_, m, pool_);
    }
    bool any = false;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = b0 + i;  // predicts token pos + 1
      const bool has = pos + 1 < T && weights_[static_cast<size_t>(pos + 1)] != 0.0f;
      float* z = f(head_) + i * c.n_vocab;
      if (!has) {
        std::memset(z, 0, static_cast<size_t>(c.n_vocab) * sizeof(float));
        continue;
      }
      loss += tk_.cross_entropy(z, c.n_vocab, tokens_[static_cast<size_t>(pos + 1)], weights_[static_cast<size_t>(pos + 1)]);
      any = true;
    }
    if (any) matmul_t(ks_, g.output, f(head_), n, dxf + b0 * d, f(mt_scratch_), pool_);
  }
  loss_ = loss;
}

double TrainPass::forward(std::span<const int32_t> tokens, std::span<const float> weights, const LoraAdapter& ad) {
  forward_begin(tokens, weights, ad);
  forward_layers(0, model_.n_layers(), ad);
  forward_head(0, T_);
  return loss_;
}

void TrainPass::layer_backward(int l, const LayerWeights& w, const LoraAdapter& ad, float s, LayerActs& a, float* dx,
                               bool want_dx, LoraGrads& grads) {
  const ModelConfig& c = cfg_;
  const int64_t T = T_, d = c.n_embd, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.n_ff;
  const float* x_in = f(inputs_[static_cast<size_t>(l)]);
  // Temporaries, after the head's [2T, d] at the start of work_.
  float* p = f(work_) + 2 * T * d;
  auto take = [&](int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  float* dh = take(T * ff);
  float* dg = take(T * ff);
  float* du = take(T * ff);
  float* dxn = take(T * d);  // also dxn2
  float* dq = take(T * qd);
  float* dqraw = take(T * qd);
  float* dk = take(T * kvd);
  float* dkraw = take(T * kvd);
  float* dv = take(T * kvd);
  float* dt = take(T * std::max<int64_t>(ad.max_rank(), 1));
  float* scratch = take(T);
  (void)scratch;
  auto zero = [](float* x, int64_t n) { std::memset(x, 0, static_cast<size_t>(n) * sizeof(float)); };
  // LoRA backward of a pair, if the layer has one for the target.
  auto lora = [&](LoraTarget tg, const float* x, int64_t n_in, const float* dy, int64_t n_out, float* dxo) {
    const LoraPair* pr = ad.find(l, tg);
    if (!pr) return;
    const size_t i = static_cast<size_t>(pr - ad.pairs.data());
    tk_.lora_backward(x, f(a.t[static_cast<int>(tg)]), dy, pr->a_data(), pr->bt_data(), pr->scale * s, T, pr->rank,
                      n_in, n_out, f(grads.da[i]), f(grads.dbt[i]), dt, dxo);
  };
  // dx holds d(loss)/d(x_out) (already times s for the base path: see backward()).
  // FFN: x_out = x2 + down(h).
  zero(dh, T * ff);
  matmul_t(ks_, w.down, dx, T, dh, f(mt_scratch_), pool_);
  lora(LoraTarget::kDown, f(a.h), ff, dx, d, dh);
  tk_.swiglu_backward(f(a.g), f(a.u), dh, dg, du, T * ff);
  zero(dxn, T * d);
  matmul_t(ks_, w.gate, dg, T, dxn, f(mt_scratch_), pool_);
  matmul_t(ks_, w.up, du, T, dxn, f(mt_scratch_), pool_);
  lora(LoraTarget::kGate, f(a.xn2), d, dg, ff, dxn);
  lora(LoraTarget::kUp, f(a.xn2), d, du, ff, dxn);
  // dx becomes d/d(x2): the residual plus the FFN norm's backward.
  for (int64_t t = 0; t < T; ++t) tk_.rmsnorm_backward(f(a.x2) + t * d, w.ffn_norm, dxn + t * d, dx + t * d, d, c.rms_eps);
  // Attention: x2 = x_in + o_proj(attention(...)).
  float* dout = dqraw;  // [T, qd], reused below once consumed
  zero(dout, T * qd);
  matmul_t(ks_, w.o, dx, T, dout, f(mt_scratch_), pool_);
  lora(LoraTarget::kO, f(a.o), qd, dx, d, dout);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const HeadSplit hs{T, c.n_head, c.n_head_kv, c.head_dim, c.n_head / c.n_head_kv};
  pool_.parallel_for(c.n_head_kv, 1, [&](int64_t h0, int64_t h1, int th) {
    float* b = f(attn_) + th * hs.floats();
    const int64_t gq = T * hs.group * hs.hd, gk = T * hs.hd;
    float *q = b, *o = q + gq, *dob = o + gq, *dqb = dob + gq, *k = dqb + gq, *v = k + gk, *dkb = v + gk,
          *dvb = dkb + gk, *lse = dvb + gk, *sc = lse + T * hs.group;
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t qo = h * hs.group * hs.hd, ko = h * hs.hd;
      gather(f(a.q), T, hs.qd(), qo, hs.group * hs.hd, q);
      gather(f(a.o), T, hs.qd(), qo, hs.group * hs.hd, o);
      gather(dout, T, hs.qd(), qo, hs.group * hs.hd, dob);
      gather(f(a.k), T, hs.kvd(), ko, hs.hd, k);
      gather(f(a.v), T, hs.kvd(), ko, hs.hd, v);
      gather(f(a.lse), T, c.n_head, h * hs.group, hs.group, lse);
      tk_.attention_backward(q, k, v, o, dob, lse, T, hs.group, 1, hs.hd, scale, dqb, dkb, dvb, sc);
      scatter(dqb, T, hs.qd(), qo, hs.group * hs.hd, dq);
      scatter(dkb, T, hs.kvd(), ko, hs.hd, dk);
      scatter(dvb, T, hs.kvd(), ko, hs.hd, dv);
    }
  });
  // RoPE, then the Q/K norms, backward.
  for (int64_t t = 0; t < T; ++t) {
    ops_.rope(dq + t * qd, c.n_head, c.head_dim, c.rope_dim, f(rope_back_) + t * c.rope_dim, c.rope_style);
    ops_.rope(dk + t * kvd, c.n_head_kv, c.head_dim, c.rope_dim, f(rope_back_) + t * c.rope_dim, c.rope_style);
  }
  if (w.q_norm) {
    zero(dqraw, T * qd);
    zero(dkraw, T * kvd);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < c.n_head; ++h) {
        const int64_t o = t * qd + h * c.head_dim;
        tk_.rmsnorm_backward(f(a.qraw) + o, w.q_norm, dq + o, dqraw + o, c.head_dim, c.rms_eps);
      }
      for (int64_t h = 0; h < c.n_head_kv; ++h) {
        const int64_t o = t * kvd + h * c.head_dim;
        tk_.rmsnorm_backward(f(a.kraw) + o, w.k_norm, dk + o, dkraw + o, c.head_dim, c.rms_eps);
      }
    }
  } else {
    std::memcpy(dqraw, dq, static_cast<size_t>(T * qd) * sizeof(float));
    std::memcpy(dkraw, dk, static_cast<size_t>(T * kvd) * sizeof(float));
  }
  float* dxn_or_null = want_dx ? dxn : nullptr;
  if (want_dx) {
    zero(dxn, T * d);
    matmul_t(ks_, w.q, dqraw, T, dxn, f(mt_scratch_), pool_);
    matmul_t(ks_, w.k, dkraw, T, dxn, f(mt_scratch_), pool_);
    matmul_t(ks_, w.v, dv, T, dxn, f(mt_scratch_), pool_);
  }
  lora(LoraTarget::kQ, f(a.xn), d, dqraw, qd, dxn_or_null);
  lora(LoraTarget::kK, f(a.xn), d, dkraw, kvd, dxn_or_null);
  lora(LoraTarget::kV, f(a.xn), d, dv, kvd, dxn_or_null);
  if (want_dx) {
    for (int64_t t = 0; t < T; ++t) tk_.rmsnorm_backward(x_in + t * d, w.attn_norm, dxn + t * d, dx + t * d, d, c.rms_eps);
  }
}

void TrainPass::backward_begin(float loss_scale) {
  EBB_CHECK_MSG(T_ > 0, "TrainPass::backward without a forward");
  const ModelConfig& c = cfg_;
  const int64_t T = T_, d = c.n_embd;
  WeightSource& src = source();
  PassScope pass(src, pass_tokens());
  const GlobalWeights g = src.acquire_head();  // only its norm is read
  struct HeadLease {
    WeightSource& s;
    ~HeadLease() { s.release_head(); }
  } head_lease{src};
  // The gradient at the last layer's output: the loss scale applied once
  // here, so every gradient below is d(loss_scale · loss).
  const float* dxf = f(work_) + T * d;
  dx_.assign(static_cast<size_t>(T * d), 0.0f);
  std::vector<float> scaled(static_cast<size_t>(d));
  const float* x_last = f(inputs_[static_cast<size_t>(c.n_layer)]);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < d; ++i) scaled[static_cast<size_t>(i)] = loss_scale * dxf[t * d + i];
    tk_.rmsnorm_backward(x_last + t * d, g.output_norm, scaled.data(), dx_.data() + t * d, d, c.rms_eps);
  }
}

void TrainPass::backward_layers(int l1, int l0, const LoraAdapter& ad, LoraGrads& grads) {
  EBB_CHECK_MSG(T_ > 0 && !dx_.empty() && 0 <= l0 && l0 <= l1 && l1 <= model_.n_layers(),
                "TrainPass::backward_layers out of order");
  const int64_t T = T_, d = cfg_.n_embd;
  std::vector<float> discard;
  WeightSource& src = source();
  PassScope pass(src, pass_tokens());
  for (int l = l1 - 1; l >= l0; --l) {
    LayerActs& a = acts_[opts_.recompute ? 0 : static_cast<size_t>(l)];
    // The frozen base weights the backward reads (and the recomputed
    // forward), held for this layer only.
    const LayerLease w(src, l);
    if (opts_.recompute) {
      discard.resize(static_cast<size_t>(T * d));
      layer_forward(l, w.weights(), ad, a, f(inputs_[static_cast<size_t>(l)]), discard.data());
    }
    layer_backward(l, w.weights(), ad, 1.0f, a, dx_.data(), /*want_dx=*/l > 0, grads);
  }
}

void TrainPass::backward(const LoraAdapter& ad, float loss_scale, LoraGrads& grads) {
  backward_begin(loss_scale);
  backward_layers(model_.n_layers(), 0, ad, grads);
}

}  // namespace ebb
