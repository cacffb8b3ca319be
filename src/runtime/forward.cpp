#include "runtime/forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "kernels/attention.h"
#include "memory/kv_cache.h"
#include "runtime/device_forward.h"
#include "platform/error.h"

namespace ebb {

Forward::Forward(const Model& model, Isa isa, ThreadPool& pool, Allocator& alloc, ForwardOptions opts)
    : model_(model),
      cfg_(model.config()),
      resident_(model),
      isa_(isa),
      ks_(kernel_set(isa)),
      ops_(ops_kernels(isa)),
      pool_(pool),
      alloc_(alloc),
      opts_(opts),
      lk_(lora_kernels(isa)) {
  if (opts_.max_batch < 1) throw Error("prefill batch must be at least 1 token");
  plan_scratch();
  joined_.reserve(static_cast<size_t>(opts_.max_batch));
  attn_args_.reserve(static_cast<size_t>(opts_.max_batch));
}

void Forward::ensure_chunk_size(int64_t chunk_size) {
  if (chunk_size <= opts_.max_chunk_size) return;
  opts_.max_chunk_size = chunk_size;
  plan_scratch();
}

void Forward::ensure_lora_rank(int64_t rank) {
  if (rank <= lora_rank_) return;
  lora_scratch_.reset();
  // Rows of a batch's A x, or the A x of every term of a fused product group.
  const int64_t rows = std::max<int64_t>(opts_.max_batch, kMaxSharedInput * kMaxFusedAdapters);
  lora_scratch_ = alloc_.allocate(static_cast<size_t>(rows * rank) * sizeof(float), MemCategory::kScratch);
  lora_rank_ = rank;
}

void Forward::plan_scratch() {
  const int64_t B = opts_.max_batch;
  const ModelConfig& c = cfg_;
  // Largest activation scratch any weight needs for B rows.
  size_t mm = 0;
  // From the unit layouts, not the data: units need not be resident here.
  auto consider = [&](const WeightUnit& u) {
    for (const TensorSlot& s : u.slots())
      if (s.dims.size() == 2) mm = std::max(mm, matmul_scratch_bytes(s.type, s.dims[0], B));
  };
  for (int l = 0; l < model_.n_layers(); ++l) consider(model_.layer_unit(l));
  consider(model_.globals_unit());

  const size_t floats[] = {
      static_cast<size_t>(B * c.n_embd), static_cast<size_t>(B * c.n_embd), static_cast<size_t>(B * c.q_dim()),
      static_cast<size_t>(B * c.kv_dim()), static_cast<size_t>(B * c.kv_dim()), static_cast<size_t>(B * c.q_dim()),
      static_cast<size_t>(B * c.n_ff), static_cast<size_t>(B * c.n_ff), static_cast<size_t>(B * c.rope_dim),
      attention_scratch_floats(pool_.size(), c.head_dim, opts_.max_chunk_size)};
  size_t total = 0;
  for (size_t f : floats) total += (f * sizeof(float) + 63) & ~size_t{63};
  total += (mm + 63) & ~size_t{63};
  scratch_.reset();
  scratch_ = alloc_.allocate(total, MemCategory::kScratch);
  auto* p = scratch_.as<uint8_t>();
  float** outs[] = {&x_, &xn_, &q_, &k_, &v_, &att_, &gate_, &up_, &rope_, &attn_scratch_};
  for (size_t i = 0; i < std::size(floats); ++i) {
    *outs[i] = reinterpret_cast<float*>(p);
    p += (floats[i] * sizeof(float) + 63) & ~size_t{63};
  }
  mm_scratch_ = p;
}

void Forward::matmul(const WeightView& w, const float* x, int64_t n, float* y, int64_t y_stride,
                     std::span<const LowRankTerm> terms) {
  MatmulArgs a;
  a.w = &w;
  a.x = x;
  a.x_stride = w.cols;
  a.n_tokens = n;
  a.y = y;
  a.y_stride = y_stride;
  a.scratch = mm_scratch_;
  a.terms = terms;
  ebb::matmul(ks_, a, pool_);
}

void Forward::matmul_shared_input(std::span<const MatmulOut> outs, const float* x, int64_t n) {
  MatmulArgs a[kMaxSharedInput];
  EBB_CHECK(outs.size() <= kMaxSharedInput);
  size_t i = 0;
  for (const MatmulOut& o : outs) {
    a[i].w = o.w;
    a[i].x = x;
    a[i].x_stride = o.w->cols;
    a[i].n_tokens = n;
    a[i].y = o.y;
    a[i].y_stride = o.y_stride;
    a[i].scratch = mm_scratch_;
    a[i].terms = o.terms;
    ++i;
  }
  ebb::matmul_multi(ks_, a, static_cast<int>(outs.size()), pool_);
}

namespace {

// Stores n rows of `dim` floats into the cache rows of positions pos0.. .
// F16 rows through the target's F16 rounding (the F16 weight format's
// activation conversion: fp32_to_fp16 bit for bit, vectorized).
void store_rows(const KernelSet& ks, KvCache& kv, int64_t layer, int64_t pos0, int64_t n, const float* src,
                bool is_k) {
  const int64_t dim = kv.shape().n_kv_heads * kv.shape().head_dim;
  const auto to_f16 = ks.format(DType::kF16)->quantize_act;
  for (int64_t t = 0; t < n; ++t) {
    void* dst = is_k ? kv.k_row(layer, pos0 + t) : kv.v_row(layer, pos0 + t);
    const float* s = src + t * dim;
    if (kv.options().type == DType::kF32) {
      std::copy(s, s + dim, static_cast<float*>(dst));
    } else {
      to_f16(s, dst, dim);
    }
  }
}

}  // namespace

class Forward::StepHooks final : public LayerHooks {
 public:
  StepHooks(Forward& f, std::span<const StepSeq> seqs) : f_(f), seqs_(seqs) {}

  // Every row of the step in one product (one dispatch for the products
  // sharing x), then each sequence's adapters on its rows.
  // A one-row step of one sequence adds its adapters inside the products
  // (Forward::lora_terms, slot i for the i-th product of a group).
  void project(int layer, std::initializer_list<Out> outs, const float* x, int64_t x_stride, int64_t n) override {
    EBB_CHECK(outs.size() >= 1 && outs.size() <= kMaxSharedInput);
    if (outs.size() == 1) {
      const Out& o = *outs.begin();
      f_.matmul(*o.w, x, n, o.y, o.y_stride, f_.lora_terms(seqs_, layer, o.target, *o.w, 0));
    } else {
      MatmulOut m[kMaxSharedInput];
      int i = 0;
      for (const Out& o : outs) {
        m[i] = {o.w, o.y, o.y_stride, f_.lora_terms(seqs_, layer, o.target, *o.w, i)};
        ++i;
      }
      f_.matmul_shared_input({m, outs.size()}, x, n);
    }
    if (!f_.fused_lora_)
      for (const Out& o : outs) f_.apply_lora(seqs_, layer, o.target, x, x_stride, o.y, o.y_stride);
  }

  // K and V into each sequence's chunks, then every sequence over its own
  // chunks, in as few pool dispatches as the kernel allows: with two or
  // more sequences each decode row sweeps its whole context on one thread,
  // so its result does not depend on the other rows (alone, it may differ
  // from that by rounding; attention_batch).
  void attend(int layer, const float* q, const float* k, const float* v, float* out, int64_t n) override {
    const ModelConfig& c = f_.cfg_;
    const int64_t qd = c.q_dim(), kvd = c.kv_dim();
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    int64_t r = 0;
    f_.attn_args_.clear();
    for (const StepSeq& s : seqs_) {
      KvCache& kv = *s.kv;
      const int64_t ns = static_cast<int64_t>(s.tokens.size());
      const int64_t pos0 = kv.n_tokens();
      store_rows(f_.ks_, kv, layer, pos0, ns, k + r * kvd, true);
      store_rows(f_.ks_, kv, layer, pos0, ns, v + r * kvd, false);
      AttentionArgs& a = f_.attn_args_.emplace_back();
      a.q = q + r * qd;
      a.out = out + r * qd;
      a.n_q = ns;
      a.n_heads = c.n_head;
      a.n_kv_heads = c.n_head_kv;
      a.head_dim = c.head_dim;
      a.pos0 = pos0;
      a.chunks = kv.chunks(layer);
      a.chunk_size = kv.options().chunk_size;
      a.kv_type = kv.options().type;
      a.f16_accumulator = kv.options().f16_accumulator;
      a.scale = scale;
      a.scratch = f_.attn_scratch_;
      r += ns;
    }
    EBB_CHECK(r == n);
    attention_batch(f_.isa_, f_.attn_args_, f_.pool_);
  }

 private:
  Forward& f_;
  std::span<const StepSeq> seqs_;
};

void Forward::run(std::span<const int32_t> tokens, KvCache& kv, float* logits, bool all_logits,
                  WeightSource* source, const AdapterSet* adapters) {
  const StepSeq one{&kv, tokens, logits, all_logits, adapters};
  run_batch({&one, 1}, source);
}

void Forward::run_batch(std::span<const StepSeq> seqs, WeightSource* source) {
  if (device_ && device_->first_layer() == 0) {  // the engine runs on a device: weights there, no weight source
    device_->run_batch(seqs);
    return;
  }
  // A split (-ngl N < n_layers): the first layers here, the rest and the
  // head on the device. What the device refuses is refused before anything
  // runs; its dropped layers (and ours) come back first.
  if (device_) device_->prepare(seqs);
  const int n_host_layers = device_ ? device_->first_layer() : model_.n_layers();
  WeightSource& src = source ? *source : resident_;
  const ModelConfig& c = cfg_;
  const int64_t d = c.n_embd;
  EBB_CHECK(!seqs.empty());
  // Rows of the step: sequence after sequence. row0[i]: first row of seqs[i].
  int64_t n = 0;
  int64_t n_out = 0;
  for (const StepSeq& s : seqs) {
    const int64_t ns = static_cast<int64_t>(s.tokens.size());
    EBB_CHECK(ns >= 1 && s.kv && s.logits);
    EBB_CHECK(s.kv->n_chunks(0) * s.kv->options().chunk_size >= s.kv->n_tokens() + ns);
    EBB_CHECK(s.kv->options().chunk_size <= opts_.max_chunk_size);
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.n_vocab) {
        throw Error("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(c.n_vocab) +
                    ")");
      }
    }
    n += ns;
    n_out += s.all_logits ? ns : 1;
  }
  EBB_CHECK(n <= opts_.max_batch);
  any_lora_ = false;
  for (const StepSeq& s : seqs) {
    if (!s.adapters) continue;
    for (const ActiveAdapter& a : *s.adapters) {
      EBB_CHECK_MSG(a.v->lora->max_rank() <= lora_rank_, "adapter rank not planned (Forward::ensure_lora_rank)");
      any_lora_ = true;
    }
  }
  fused_lora_ = any_lora_ && seqs.size() == 1 && n == 1 &&
                seqs[0].adapters->size() <= static_cast<size_t>(kMaxFusedAdapters);
  // Several sequences: logits land in a planned block, then go to each
  // sequence's own buffer. One sequence writes straight into its buffer.
  float* head_out = seqs[0].logits;
  if (seqs.size() > 1 && !device_) {
    // Grows to the most rows a step has asked for, then stays.
    const size_t bytes = static_cast<size_t>(n_out * c.n_vocab) * sizeof(float);
    if (head_scratch_.size() < bytes) {
      head_scratch_.reset();
      head_scratch_ = alloc_.allocate(bytes, MemCategory::kScratch);
    }
    head_out = head_scratch_.as<float>();
  }
  if (seqs.size() > 1) {
    joined_.clear();
    for (const StepSeq& s : seqs) joined_.insert(joined_.end(), s.tokens.begin(), s.tokens.end());
  }

  // Ends the pass on every exit, so a streamer's window is reset after an error too.
  struct PassGuard {
    WeightSource& s;
    ~PassGuard() { s.end_pass(); }
  };
  // The streamer (budget mode) only looks at the tokens to know the step's size.
  src.begin_pass(seqs.size() > 1 ? std::span<const int32_t>(joined_) : seqs[0].tokens);
  PassGuard guard{src};
  {
    int64_t r = 0;
    for (const StepSeq& s : seqs) {
      const int64_t pos0 = s.kv->n_tokens();
      for (size_t t = 0; t < s.tokens.size(); ++t, ++r) {
        const MatrixRow e = src.embedding_row(s.tokens[t]);
        dequantize_row(ks_, e.matrix, e.row, x_ + r * d);
        if (s.adapters) {
          // token_embd: A's row of the token is the rank-r intermediate.
          for (const ActiveAdapter& a : *s.adapters) {
            const LoraPair* p = a.v->lora->find(-1, LoraTarget::kTokenEmbd);
            if (!p) continue;
            lk_.up(p->bt_data(), p->a_data() + static_cast<int64_t>(s.tokens[t]) * p->rank, a.scale * p->scale, 1,
                   p->rank, d, 0, d, x_ + r * d, d);
          }
        }
        ops_.rope_angles(pos0 + static_cast<int64_t>(t), c.rope_dim, c.rope_base, c.rope_freq_scale,
                         rope_ + r * c.rope_dim, c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data());
      }
    }
  }

  // The layers, in place on the residual stream x_.
  StepHooks hooks(*this, seqs);
  const BlockKernels bk{c, ops_};
  const AttentionRows ar{.x_in = x_, .x_out = x_, .y = xn_, .xn = xn_, .q = q_, .k = k_, .v = v_, .att = att_,
                         .rope = rope_};
  const FfnRows fr{.x_in = x_, .x_out = x_, .y = xn_, .xn = xn_, .gate = gate_, .up = up_, .h = gate_};
  for (int l = 0; l < n_host_layers; ++l) {
    const LayerWeights w = src.acquire_layer(l);
    attention_block(bk, w, l, hooks, ar, n);
    ffn_block(bk, w, l, hooks, fr, n);
    src.release_layer(l);
  }
  if (device_) {  // the hidden rows go up; the device runs its layers and the head, and advances the KV
    device_->run_batch(seqs, x_);
    return;
  }
  for (const StepSeq& s : seqs) s.kv->set_n_tokens(s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size()));

  // Output head on the rows the callers want, gathered in order.
  GlobalWeights g = src.acquire_head();
  {
    int64_t r = 0, o = 0;
    for (const StepSeq& s : seqs) {
      const int64_t ns = static_cast<int64_t>(s.tokens.size());
      for (int64_t t = s.all_logits ? 0 : ns - 1; t < ns; ++t, ++o)
        ops_.rmsnorm(x_ + (r + t) * d, g.output_norm, xn_ + o * d, d, c.rms_eps);
      r += ns;
    }
  }
  // A streamer may serve the head in row ranges: each acquire_head() gives the next.
  for (int64_t r0 = 0;;) {
    matmul(g.output, xn_, n_out, head_out + r0, c.n_vocab);
    r0 += g.output.rows;
    src.release_head();
    if (r0 >= c.n_vocab) break;
    g = src.acquire_head();
  }
  apply_lora(seqs, -1, LoraTarget::kOutput, xn_, d, head_out, c.n_vocab, /*out_rows=*/true);
  if (seqs.size() > 1) {
    int64_t o = 0;
    for (const StepSeq& s : seqs) {
      const int64_t rows = s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
      std::copy(head_out + o * c.n_vocab, head_out + (o + rows) * c.n_vocab, s.logits);
      o += rows;
    }
  }
}

namespace {

// t[i, 0 .. r) = A[j0 .. j0 + r) x[i] for i < n, with p's weight type.
void lora_down(const LoraKernels& k, const LoraPair& p, int64_t j0, const float* x, int64_t x_stride, int64_t n,
               int64_t r, float* t) {  // t: [n, r]
  if (p.dtype == DType::kF16) {
    k.down_f16(p.a_f16() + j0 * p.n_in, x, x_stride, n, r, p.n_in, t);
  } else {
    k.down(p.a_data() + j0 * p.n_in, x, x_stride, n, r, p.n_in, t);
  }
}

// y[i, c0 .. c1) += s · (B t[i]) for i < n (t: [n, p.rank]).
void lora_up(const LoraKernels& k, const LoraPair& p, const float* t, float s, int64_t n, int64_t c0, int64_t c1,
             float* y, int64_t y_stride) {
  if (p.dtype == DType::kF16) {
    k.up_f16(p.bt_f16(), t, s, n, p.rank, p.n_out, c0, c1, y, y_stride);
  } else {
    k.up(p.bt_data(), t, s, n, p.rank, p.n_out, c0, c1, y, y_stride);
  }
}

}  // namespace

std::span<const LowRankTerm> Forward::lora_terms(std::span<const StepSeq> seqs, int layer, LoraTarget target,
                                                 const WeightView& w, int slot) {
  if (!fused_lora_) return {};
  int k = 0;
  for (const ActiveAdapter& a : *seqs[0].adapters) {
    const LoraPair* p = a.v->lora->find(layer, target);
    if (!p || a.scale == 0.0f) continue;
    EBB_CHECK(p->n_in == w.cols && p->n_out == w.rows && k < kMaxFusedAdapters);
    LowRankTerm& t = terms_[slot][k];
    const bool f16 = p->dtype == DType::kF16;
    t.a = f16 ? static_cast<const void*>(p->a_f16()) : p->a_data();
    t.bt = f16 ? static_cast<const void*>(p->bt_f16()) : p->bt_data();
    t.f16 = f16;
    t.rank = p->rank;
    t.scale = a.scale * p->scale;
    t.t = lora_scratch_.as<float>() + (slot * kMaxFusedAdapters + k) * lora_rank_;  // [rank]
    ++k;
  }
  return {terms_[slot], static_cast<size_t>(k)};
}

void Forward::apply_lora(std::span<const StepSeq> seqs, int layer, LoraTarget target, const float* x,
                         int64_t x_stride, float* y, int64_t y_stride, bool out_rows) {
  if (!any_lora_) return;
  int64_t r0 = 0;
  for (const StepSeq& s : seqs) {
    const int64_t ns = static_cast<int64_t>(s.tokens.size());
    const int64_t rows = out_rows && !s.all_logits ? 1 : ns;
    if (s.adapters) {
      for (const ActiveAdapter& a : *s.adapters) {
        const LoraPair* p = a.v->lora->find(layer, target);
        if (!p || a.scale == 0.0f) continue;
        const float* xs = x + r0 * x_stride;  // [rows, x_stride]
        float* ys = y + r0 * y_stride;        // [rows, y_stride]
        float* t = lora_scratch_.as<float>();  // [rows, rank]
        const int64_t rank = p->rank, n_in = p->n_in, n_out = p->n_out;
        const float scale = a.scale * p->scale;
        if (rows == 1 && pool_.size() > 1 && rank * (n_in + n_out) >= (int64_t{1} << 14)) {
          // Decode: A and B stream from memory once per token, so both
          // products are split over the threads in one dispatch (A's rows,
          // then, past a barrier, B's columns), to read at every thread's
          // bandwidth.
          std::atomic<int> arrived{0};
          pool_.run([&](int th, int nt) {
            const int64_t j0 = rank * th / nt, j1 = rank * (th + 1) / nt;
            if (j1 > j0) lora_down(lk_, *p, j0, xs, x_stride, 1, j1 - j0, t + j0);
            arrived.fetch_add(1, std::memory_order_acq_rel);
            while (arrived.load(std::memory_order_acquire) < nt) std::this_thread::yield();
            const int64_t blocks = (n_out + 15) / 16;
            const int64_t c0 = std::min(n_out, blocks * th / nt * 16), c1 = std::min(n_out, blocks * (th + 1) / nt * 16);
            if (c1 > c0) lora_up(lk_, *p, t, scale, 1, c0, c1, ys, y_stride);
          });
          continue;
        }
        // A x: rows split across threads when there is enough work.
        if (rows * rank * n_in >= (int64_t{1} << 17) && rows > 1) {
          pool_.parallel_for(rows, 1, [&](int64_t i0, int64_t i1, int) {
            lora_down(lk_, *p, 0, xs + i0 * x_stride, x_stride, i1 - i0, rank, t + i0 * rank);
          });
        } else {
          lora_down(lk_, *p, 0, xs, x_stride, rows, rank, t);
        }
        // y += s · B t: columns split across threads.
        if (rows * rank * n_out >= (int64_t{1} << 16)) {
          pool_.parallel_for(n_out, 64, [&](int64_t c0, int64_t c1, int) {
            lora_up(lk_, *p, t, scale, rows, c0, c1, ys, y_stride);
          });
        } else {
          lora_up(lk_, *p, t, scale, rows, 0, n_out, ys, y_stride);
        }
      }
    }
    r0 += rows;
  }
}

}  // namespace ebb
