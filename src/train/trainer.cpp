#include "train/trainer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>

#include "platform/error.h"
#include "platform/hash.h"
#include "platform/timer.h"
#include "runtime/device_forward.h"

namespace ebb {

const char* phase_name(PhaseKind k) {
  switch (k) {
    case PhaseKind::kForward: return "forward";
    case PhaseKind::kBackward: return "backward";
    case PhaseKind::kCommit: return "commit";
  }
  return "?";
}

namespace {

constexpr double kEmaAlpha = 0.2;  // LOCAL §7.1

std::unique_ptr<LoraAdapter> copy_adapter(const LoraAdapter& src, Allocator& alloc, MemCategory cat, int n_layers) {
  auto ad = std::make_unique<LoraAdapter>();
  ad->source = src.source;
  ad->format = src.format;
  ad->arch = src.arch;
  ad->alpha = src.alpha;
  ad->digest = src.digest;
  // F32 whatever the source holds (a loaded adapter may be F16, model/lora.h).
  for (const LoraPair& p : src.pairs) ad->pairs.push_back(widen_lora_pair(p, alloc, cat));
  ad->index(n_layers);
  return ad;
}

uint64_t digest_of(const LoraAdapter& ad) {
  uint64_t h = fnv1a64(&ad.alpha, sizeof ad.alpha);
  for (const LoraPair& p : ad.pairs) {
    const int32_t id[2] = {p.layer, static_cast<int32_t>(p.target)};
    h = fnv1a64(id, sizeof id, h);
    h = fnv1a64(&p.scale, sizeof p.scale, h);
    h = hash_words64(p.a.data(), p.a.size(), h);  // fnv1a64 here was 2/3 of a commit (40 MB at rank 16)
    h = hash_words64(p.bt.data(), p.bt.size(), h);
  }
  return h;
}

uint64_t samples_digest(const std::vector<TrainSample>& s) {
  uint64_t h = kFnv1a64Offset;
  for (const TrainSample& x : s) {
    const uint64_t n = x.tokens.size();
    h = fnv1a64(&n, sizeof n, h);
    h = fnv1a64(x.tokens.data(), x.tokens.size() * sizeof(int32_t), h);
    h = fnv1a64(x.weights.data(), x.weights.size() * sizeof(float), h);
  }
  return h;
}

std::unique_ptr<LoraAdapter> make_params(Engine& e, const TrainerOptions& o, const LoraAdapter* start) {
  const int nl = static_cast<int>(e.config().n_layer);
  if (start) {
    for (const LoraPair& p : start->pairs) {
      if (static_cast<int>(p.target) >= kLoraLayerTargets) {
        throw Error("training: the adapter to continue adapts '" + lora_base_tensor_name(p.layer, p.target) +
                    "', which ebb does not train (only q, k, v, o, gate, up and down)");
      }
    }
    return copy_adapter(*start, e.allocator(), MemCategory::kTrainOptimizer, nl);
  }
  std::unique_ptr<LoraAdapter> init = init_lora(e.config(), o.init, e.allocator());
  return copy_adapter(*init, e.allocator(), MemCategory::kTrainOptimizer, nl);
}

// Brackets a phase that reads base weights. Evicted units come back the way
// a session's step gets them: a restore of what eviction took starts here
// and the phase's layers wait on their latches (or stream, under a memory
// limit) through the engine's weight source. settle() waits for the rest of
// the restore before the phase returns, so its errors are this phase's and
// no restore runs on past it; on an exception the destructor waits too.
class PhaseWeights {
 public:
  explicit PhaseWeights(Engine& e) : em_(e.elastic()) {
    if (em_ && em_->restore_pending()) em_->begin_restore();
  }
  ~PhaseWeights() {
    if (!em_ || !em_->restoring()) return;
    try {
      em_->wait_restored();
    } catch (const Error&) {
      // The phase failed already; the units still out are restored next time.
    }
  }
  PhaseWeights(const PhaseWeights&) = delete;
  PhaseWeights& operator=(const PhaseWeights&) = delete;
  void settle() {
    if (em_ && em_->restoring()) em_->wait_restored();
  }

 private:
  ElasticMemory* em_;
};

}  // namespace

Trainer::Trainer(Engine& engine, std::vector<TrainSample> samples, TrainerOptions opts, const LoraAdapter* start)
    : engine_(engine),
      samples_(std::move(samples)),
      opts_(opts),
      alloc_(engine.allocator().ledger()),
      params_(make_params(engine, opts_, start)),
      grads_(make_grads(*params_, alloc_)),
      optimizer_(*params_, opts_.adamw, alloc_) {
  if (samples_.empty()) throw Error("training needs at least one sample");
  if (engine.device() && engine.device()->first_layer() > 0) {
    throw Error("training on an engine whose layers are split between " + engine.device()->device().id +
                " and the CPU (-ngl below the model's layers) is not supported yet; train with -ngl 0 or with every "
                "layer on the device");
  }
  if (opts_.batch < 1) throw Error("training: batch must be at least 1 sample, got " + std::to_string(opts_.batch));
  if (!(opts_.phase_target_s >= 0)) {
    throw Error("training: the phase target must be >= 0 seconds (0: off), got " + std::to_string(opts_.phase_target_s));
  }
  if (opts_.phase_layers < 0 || opts_.phase_head_rows < 0) {
    throw Error("training: phase_layers and phase_head_rows must be >= 0 (0: whole), got " +
                std::to_string(opts_.phase_layers) + " and " + std::to_string(opts_.phase_head_rows));
  }
  const ModelConfig& c = engine_.config();
  for (size_t i = 0; i < samples_.size(); ++i) {
    const TrainSample& s = samples_[i];
    if (s.tokens.size() < 2 || s.weights.size() != s.tokens.size()) {
      throw Error("training sample " + std::to_string(i) + ": it needs at least 2 tokens and one weight per token (" +
                  std::to_string(s.tokens.size()) + " tokens, " + std::to_string(s.weights.size()) + " weights)");
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.n_vocab) {
        throw Error("training sample " + std::to_string(i) + ": token id " + std::to_string(t) +
                    " is outside the vocabulary [0, " + std::to_string(c.n_vocab) + ")");
      }
    }
    for (float w : s.weights) {
      if (!std::isfinite(w)) throw Error("training sample " + std::to_string(i) + ": a weight is not finite");
    }
  }
  if (engine_.budget_source()) {
    // Its streamer serves layers in one forward window and the head in row
    // ranges; a step reads every layer again downwards and the head whole.
    throw Error("training is not supported in budget mode (--budget: weights streamed through a forward-only "
                "window); run without --budget, where evicted weights are restored for each training phase");
  }
  TrainPassOptions po;
  po.recompute = opts_.recompute == TrainerOptions::Recompute::kAlways;
  po.weights = engine_.weight_source();
  pass_ = std::make_unique<TrainPass>(engine_.model(), engine_.isa(), engine_.pool(), alloc_, po);
  pass_recompute_ = po.recompute;
  samples_digest_ = samples_digest(samples_);
  plan_pieces();
  track_peak();
}

void Trainer::plan_pieces() {
  if (opts_.phase_layers > 0) {
    step_layers_ = opts_.phase_layers;
    step_rows_ = opts_.phase_head_rows;
    return;
  }
  if (opts_.phase_target_s <= 0) {
    step_layers_ = step_rows_ = 0;
    return;
  }
  const int64_t L = engine_.config().n_layer, hr = pass_->head_rows();
  const double per_layer = std::max(layer_s_[0], layer_s_[1]);
  if (per_layer <= 0 || row_s_ <= 0) {  // nothing measured yet: the finest pieces
    step_layers_ = 1;
    step_rows_ = hr;
    return;
  }
  // A whole sample's forward (or backward) within the target: whole phases.
  int64_t longest = 0;
  for (int64_t b = 0; b < opts_.batch; ++b)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(samples_[sample_at(cursor_ + b)].tokens.size()));
  if (per_layer * static_cast<double>(L) + row_s_ * static_cast<double>(longest) <= opts_.phase_target_s) {
    step_layers_ = step_rows_ = 0;
    return;
  }
  step_layers_ = std::clamp<int64_t>(static_cast<int64_t>(opts_.phase_target_s / per_layer), 1, L);
  step_rows_ = std::max<int64_t>(1, static_cast<int64_t>(opts_.phase_target_s / row_s_ / static_cast<double>(hr))) * hr;
}

Trainer::~Trainer() = default;

uint64_t Trainer::bytes_now() const {
  const Ledger& l = *alloc_.ledger();
  return static_cast<uint64_t>(l.bytes(MemCategory::kTrainActivations) + l.bytes(MemCategory::kTrainGrads) +
                               l.bytes(MemCategory::kTrainOptimizer));
}

void Trainer::track_peak() { peak_ = std::max(peak_, bytes_now()); }

size_t Trainer::sample_at(int64_t cursor) const {
  // Epoch e visits the samples in a permutation seeded by (data_seed, e).
  const int64_t n = static_cast<int64_t>(samples_.size());
  const int64_t epoch = cursor / n, i = cursor % n;
  std::vector<size_t> order(samples_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937_64 rng(opts_.data_seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch));
  for (size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[rng() % k]);
  return order[static_cast<size_t>(i)];
}

void Trainer::begin_step() {
  step_loss_ = 0;
  step_weight_ = 0;
  for (int64_t b = 0; b < opts_.batch; ++b) {
    const TrainSample& s = samples_[sample_at(cursor_ + b)];
    for (size_t i = 1; i < s.weights.size(); ++i) step_weight_ += s.weights[i] != 0.0f ? 1.0 : 0.0;
  }
  grads_.zero();
}

int64_t Trainer::pieces_of(int64_t T) const {
  if (step_layers_ <= 0) return 2;
  const int64_t L = engine_.config().n_layer, k = step_layers_;
  const int64_t layer_pieces = (L + k - 1) / k;
  const int64_t hr = pass_->head_rows();
  const int64_t rows = step_rows_ > 0 ? (step_rows_ + hr - 1) / hr * hr : T;
  return 2 * layer_pieces + (T + rows - 1) / rows;
}

Trainer::Piece Trainer::piece_at(int phase) const {
  Piece pc;
  int64_t p = phase;
  for (int64_t b = 0; b < opts_.batch; ++b) {
    const int64_t T = static_cast<int64_t>(samples_[sample_at(cursor_ + b)].tokens.size());
    const int64_t n = pieces_of(T);
    if (p >= n) {
      p -= n;
      continue;
    }
    pc.sample = b;
    if (step_layers_ <= 0) {
      pc.kind = p == 0 ? PhaseKind::kForward : PhaseKind::kBackward;
      pc.whole = pc.first = pc.last = true;
      return pc;
    }
    const int64_t L = engine_.config().n_layer, k = step_layers_;
    const int64_t nl = (L + k - 1) / k;
    const int64_t nh = n - 2 * nl;
    const int64_t hr = pass_->head_rows();
    const int64_t rows = step_rows_ > 0 ? (step_rows_ + hr - 1) / hr * hr : T;
    if (p < nl) {
      pc.kind = PhaseKind::kForward;
      pc.a = p * k;
      pc.b = std::min(L, pc.a + k);
      pc.first = p == 0;
    } else if (p < nl + nh) {
      pc.kind = PhaseKind::kForward;
      pc.head = true;
      pc.a = (p - nl) * rows;
      pc.b = std::min(T, pc.a + rows);
      pc.last = p == nl + nh - 1;
    } else {
      const int64_t j = p - nl - nh;
      pc.kind = PhaseKind::kBackward;
      pc.b = L - j * k;
      pc.a = std::max<int64_t>(0, pc.b - k);
      pc.first = j == 0;
      pc.last = j == nl - 1;
    }
    return pc;
  }
  pc.kind = PhaseKind::kCommit;
  return pc;
}

PhaseEstimate Trainer::next_phase() const {
  PhaseEstimate e;
  const Piece pc = piece_at(phase_);
  e.kind = pc.kind;
  e.seconds = est_[static_cast<int>(e.kind)];
  if (e.kind == PhaseKind::kForward && pc.first) {
    const TrainSample& s = samples_[sample_at(cursor_ + pc.sample)];
    e.bytes = pass_->activation_bytes(static_cast<int64_t>(s.tokens.size()), params_->max_rank());
  }
  return e;
}

PhaseResult Trainer::run_phase() {
  PhaseResult r;
  const PhaseEstimate next = next_phase();
  const Piece pc = piece_at(phase_);
  r.kind = next.kind;
  r.step = step();
  if (phase_ == 0) begin_step();
  const Stopwatch sw;
  // Forward and backward read the base weights, never held between phases
  // (an eviction may come between two): the engine's source, as now.
  std::optional<PhaseWeights> weights;
  if (next.kind != PhaseKind::kCommit) {
    weights.emplace(engine_);
    pass_->set_weight_source(engine_.weight_source());
  }
  if (next.kind == PhaseKind::kForward && !pc.first) {
    // A later piece of the sample's forward.
    if (pc.head) {
      pass_->forward_head(pc.a, pc.b);
    } else {
      pass_->forward_layers(static_cast<int>(pc.a), static_cast<int>(pc.b), *params_);
    }
    if (pc.last) step_loss_ += pass_->loss();
    track_peak();
  } else if (next.kind == PhaseKind::kForward) {
    const TrainSample& s = samples_[sample_at(cursor_ + pc.sample)];
    const int64_t T = static_cast<int64_t>(s.tokens.size());
    // Checkpointing when keeping every layer's activations would not fit.
    bool recompute = opts_.recompute == TrainerOptions::Recompute::kAlways;
    const uint64_t limit = opts_.memory_limit;
    if (opts_.recompute == TrainerOptions::Recompute::kAuto && limit > 0) {
      // What the pass holds from the last sample is freed or reused for this one.
      const uint64_t total = engine_.footprint().total();
      const uint64_t used = total - std::min(total, pass_->held_bytes());
      recompute = used + next.bytes > limit;
      if (recompute) {
        TrainPassOptions rc;
        rc.recompute = true;
        TrainPass probe(engine_.model(), engine_.isa(), engine_.pool(), alloc_, rc);
        const uint64_t need = probe.activation_bytes(T, params_->max_rank());
        if (used + need > limit) {
          throw Error("training: a sample of " + std::to_string(T) + " tokens needs " + std::to_string(need >> 20) +
                      " MiB of activations even recomputed layer by layer, and the engine holds " +
                      std::to_string(used >> 20) + " MiB of its " + std::to_string(limit >> 20) +
                      " MiB limit: shorten the samples or raise the limit");
        }
      }
    }
    if (recompute != pass_recompute_) {
      TrainPassOptions po;
      po.recompute = recompute;
      po.weights = engine_.weight_source();
      pass_.reset();
      pass_ = std::make_unique<TrainPass>(engine_.model(), engine_.isa(), engine_.pool(), alloc_, po);
      pass_recompute_ = recompute;
    }
    if (pc.whole) {
      step_loss_ += pass_->forward(s.tokens, s.weights, *params_);
    } else {
      pass_->forward_begin(s.tokens, s.weights, *params_);
      pass_->forward_layers(static_cast<int>(pc.a), static_cast<int>(pc.b), *params_);
    }
    r.tokens = T;
    track_peak();
  } else if (next.kind == PhaseKind::kBackward) {
    const float scale = step_weight_ > 0 ? static_cast<float>(1.0 / step_weight_) : 0.0f;
    if (pc.whole) {
      pass_->backward(*params_, scale, grads_);
    } else {
      if (pc.first) pass_->backward_begin(scale);
      pass_->backward_layers(static_cast<int>(pc.b), static_cast<int>(pc.a), *params_, grads_);
    }
    track_peak();
  } else {
    r.lr = optimizer_.lr_at(optimizer_.step());
    r.grad_norm = optimizer_.update(*params_, grads_, engine_.pool());
    params_->digest = digest_of(*params_);
    last_loss_ = step_weight_ > 0 ? step_loss_ / step_weight_ : 0.0;
    r.loss = last_loss_;
    r.step_done = true;
    cursor_ += opts_.batch;
  }
  if (weights) weights->settle();
  r.seconds = sw.seconds();
  double& est = est_[static_cast<int>(next.kind)];
  est = est == 0 ? r.seconds : kEmaAlpha * r.seconds + (1 - kEmaAlpha) * est;
  // Costs per layer and per head row, for sizing the pieces (phase_target_s).
  auto ema = [&](double& e, double x) { e = e == 0 ? x : kEmaAlpha * x + (1 - kEmaAlpha) * e; };
  if (next.kind != PhaseKind::kCommit && !pc.whole && pc.b > pc.a) {
    const double per = r.seconds / static_cast<double>(pc.b - pc.a);
    ema(pc.head ? row_s_ : layer_s_[next.kind == PhaseKind::kBackward ? 1 : 0], per);
  } else if (next.kind != PhaseKind::kCommit && pc.whole && opts_.phase_target_s > 0) {
    // A whole sample: its time spread over its layers and rows (each part
    // over-estimated by the other's share), so a slower machine splits again.
    const double T = static_cast<double>(samples_[sample_at(cursor_ + pc.sample)].tokens.size());
    ema(layer_s_[next.kind == PhaseKind::kBackward ? 1 : 0], r.seconds / static_cast<double>(engine_.config().n_layer));
    if (next.kind == PhaseKind::kForward) ema(row_s_, r.seconds / T);
  }
  phase_ = r.step_done ? 0 : phase_ + 1;
  if (r.step_done) plan_pieces();
  return r;
}

int64_t Trainer::run_steps(int64_t steps, const std::function<void(const PhaseResult&)>& on_phase) {
  int64_t done = 0;
  while (done < steps && !stop_.load()) {
    const PhaseResult r = run_phase();
    if (on_phase) on_phase(r);
    if (r.step_done) ++done;
  }
  return done;
}

void Trainer::release_buffers() { pass_->release(); }

void Trainer::discard_step() {
  pass_->release();
  grads_.zero();
  phase_ = 0;
  step_loss_ = step_weight_ = 0;
  plan_pieces();
}

std::unique_ptr<LoraAdapter> Trainer::snapshot() const {
  auto ad = copy_adapter(*params_, engine_.allocator(), MemCategory::kAdapter, static_cast<int>(engine_.config().n_layer));
  ad->source = "(trained, step " + std::to_string(step()) + ")";
  ad->digest = digest_of(*ad);
  return ad;
}

AdapterInfo Trainer::stage(const std::string& name, bool publish) {
  return engine_.adapters().add(name, snapshot(), publish);
}

// ---- checkpoints -----------------------------------------------------------
//
// trainer.ebbt (little-endian): magic "EBBTRAIN", u32 version 1, u64 step,
// u64 cursor, u64 samples digest, u64 data seed, f32 alpha, the AdamW options
// (lr, beta1, beta2, eps, weight decay, clip: f32; warm-up, total: i64;
// min lr ratio: f32), i64 batch, u32 n_pairs;
// per pair: i32 layer, u32 target, i64 rank, i64 n_in, i64 n_out, f32 scale,
// A [rank * n_in], B^T [rank * n_out], m_a, v_a, m_b, v_b (F32);
// u64 FNV-1a of everything before it. Written as NAME.tmp, then renamed.

namespace {

constexpr char kMagic[8] = {'E', 'B', 'B', 'T', 'R', 'A', 'I', 'N'};

struct Writer {
  std::FILE* f;
  std::string path;
  uint64_t h = kFnv1a64Offset;
  void put(const void* p, size_t n) {
    h = fnv1a64(p, n, h);
    if (std::fwrite(p, 1, n, f) != n) throw Error(path + ": write failed (disk full?)");
  }
  template <class T>
  void val(const T& v) {
    put(&v, sizeof v);
  }
};

struct Reader {
  std::FILE* f;
  std::string path;
  uint64_t h = kFnv1a64Offset;
  void get(void* p, size_t n, const char* what) {
    if (std::fread(p, 1, n, f) != n) throw Error(path + ": truncated in " + what);
    h = fnv1a64(p, n, h);
  }
  template <class T>
  T val(const char* what) {
    T v{};
    get(&v, sizeof v, what);
    return v;
  }
};

}  // namespace

void Trainer::save_checkpoint(const std::string& dir) const {
  if (phase_ != 0) throw Error("a checkpoint is taken between steps (this step is in its phase " + std::to_string(phase_) + ")");
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw Error(dir + ": cannot create: " + std::strerror(errno));
  write_lora_gguf(*params_, dir + "/adapter.gguf");
  const std::string path = dir + "/trainer.ebbt", tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(tmp + ": cannot create: " + std::strerror(errno));
  try {
    Writer w{f, path};
    w.put(kMagic, 8);
    w.val<uint32_t>(1);
    w.val<uint64_t>(static_cast<uint64_t>(step()));
    w.val<uint64_t>(static_cast<uint64_t>(cursor_));
    w.val<uint64_t>(samples_digest_);
    w.val<uint64_t>(opts_.data_seed);
    w.val<float>(params_->alpha);
    const AdamWOptions& ao = optimizer_.options();
    w.val<float>(ao.lr);
    w.val<float>(ao.beta1);
    w.val<float>(ao.beta2);
    w.val<float>(ao.eps);
    w.val<float>(ao.weight_decay);
    w.val<float>(ao.grad_clip);
    w.val<int64_t>(ao.warmup_steps);
    w.val<int64_t>(ao.total_steps);
    w.val<float>(ao.min_lr_ratio);
    w.val<int64_t>(opts_.batch);
    w.val<uint32_t>(static_cast<uint32_t>(params_->pairs.size()));
    const std::vector<Buffer>& mom = optimizer_.moments();
    for (size_t i = 0; i < params_->pairs.size(); ++i) {
      const LoraPair& p = params_->pairs[i];
      w.val<int32_t>(p.layer);
      w.val<uint32_t>(static_cast<uint32_t>(p.target));
      w.val<int64_t>(p.rank);
      w.val<int64_t>(p.n_in);
      w.val<int64_t>(p.n_out);
      w.val<float>(p.scale);
      w.put(p.a.data(), p.a.size());
      w.put(p.bt.data(), p.bt.size());
      for (int k = 0; k < 4; ++k) w.put(mom[i * 4 + static_cast<size_t>(k)].data(), mom[i * 4 + static_cast<size_t>(k)].size());
    }
    const uint64_t d = w.h;
    if (std::fwrite(&d, 1, sizeof d, f) != sizeof d || std::fflush(f) != 0) throw Error(path + ": write failed (disk full?)");
    if (std::fclose(std::exchange(f, nullptr)) != 0) throw Error(path + ": write failed on close (disk full?)");
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error(path + ": cannot rename into place: " + std::strerror(errno));
  } catch (...) {
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
}

std::unique_ptr<Trainer> Trainer::resume(Engine& engine, std::vector<TrainSample> samples, const std::string& dir,
                                         const TrainerOptions* override_opts) {
  const std::string path = dir + "/trainer.ebbt";
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  Reader r{f, path};
  char magic[8];
  r.get(magic, 8, "header");
  if (std::memcmp(magic, kMagic, 8) != 0) throw Error(path + ": not an ebb trainer checkpoint (bad magic)");
  const uint32_t version = r.val<uint32_t>("header");
  if (version != 1) throw Error(path + ": checkpoint version " + std::to_string(version) + " is not supported (expected 1)");
  const uint64_t step = r.val<uint64_t>("header"), cursor = r.val<uint64_t>("header");
  const uint64_t sdigest = r.val<uint64_t>("header"), data_seed = r.val<uint64_t>("header");
  const float alpha = r.val<float>("header");
  TrainerOptions o = override_opts ? *override_opts : TrainerOptions{};
  o.adamw.lr = r.val<float>("options");
  o.adamw.beta1 = r.val<float>("options");
  o.adamw.beta2 = r.val<float>("options");
  o.adamw.eps = r.val<float>("options");
  o.adamw.weight_decay = r.val<float>("options");
  o.adamw.grad_clip = r.val<float>("options");
  o.adamw.warmup_steps = r.val<int64_t>("options");
  o.adamw.total_steps = r.val<int64_t>("options");
  o.adamw.min_lr_ratio = r.val<float>("options");
  o.batch = r.val<int64_t>("options");
  const uint32_t n_pairs = r.val<uint32_t>("header");
  const ModelConfig& c = engine.config();
  if (n_pairs == 0 || n_pairs > static_cast<uint32_t>(c.n_layer * kLoraLayerTargets)) {
    throw Error(path + ": " + std::to_string(n_pairs) + " pairs is impossible for this model");
  }
  LoraAdapter start;
  start.source = dir;
  start.format = "gguf";
  start.arch = c.arch_name;
  start.alpha = alpha;
  std::vector<std::vector<float>> moments;
  for (uint32_t i = 0; i < n_pairs; ++i) {
    LoraPair p;
    p.layer = r.val<int32_t>("pairs");
    const uint32_t t = r.val<uint32_t>("pairs");
    p.rank = r.val<int64_t>("pairs");
    p.n_in = r.val<int64_t>("pairs");
    p.n_out = r.val<int64_t>("pairs");
    p.scale = r.val<float>("pairs");
    if (t >= static_cast<uint32_t>(kLoraLayerTargets) || p.layer < 0 || p.layer >= c.n_layer) {
      throw Error(path + ": pair " + std::to_string(i) + " targets layer " + std::to_string(p.layer) +
                  " target " + std::to_string(t) + ", which this model does not have");
    }
    p.target = static_cast<LoraTarget>(t);
    int64_t n_in = 0, n_out = 0;
    lora_expected_shape(c, p.target, &n_in, &n_out);
    if (p.n_in != n_in || p.n_out != n_out || p.rank < 1 || p.rank > 65536) {
      throw Error(path + ": pair '" + lora_base_tensor_name(p.layer, p.target) + "' has shape rank " +
                  std::to_string(p.rank) + " x [" + std::to_string(p.n_in) + ", " + std::to_string(p.n_out) +
                  "], this model expects [" + std::to_string(n_in) + ", " + std::to_string(n_out) + "]");
    }
    p.a = engine.allocator().allocate(static_cast<size_t>(p.rank * p.n_in) * sizeof(float), MemCategory::kTrainOptimizer);
    p.bt = engine.allocator().allocate(static_cast<size_t>(p.rank * p.n_out) * sizeof(float), MemCategory::kTrainOptimizer);
    r.get(p.a.data(), p.a.size(), "parameters");
    r.get(p.bt.data(), p.bt.size(), "parameters");
    for (const size_t bytes : {p.a.size(), p.a.size(), p.bt.size(), p.bt.size()}) {
      moments.emplace_back(bytes / sizeof(float));
      r.get(moments.back().data(), bytes, "optimizer moments");
    }
    start.pairs.push_back(std::move(p));
  }
  const uint64_t expect = r.h;
  uint64_t stored = 0;
  if (std::fread(&stored, 1, sizeof stored, f) != sizeof stored) throw Error(path + ": truncated in checksum");
  if (stored != expect) throw Error(path + ": checksum mismatch (the checkpoint is corrupt)");
  start.index(static_cast<int>(c.n_layer));
  if (samples_digest(samples) != sdigest) {
    throw Error(path + ": the checkpoint was taken with other training samples; resume with the same data");
  }
  o.data_seed = data_seed;
  auto t = std::make_unique<Trainer>(engine, std::move(samples), o, &start);
  std::vector<Buffer>& mom = t->optimizer_.moments();
  for (size_t i = 0; i < mom.size(); ++i) std::memcpy(mom[i].data(), moments[i].data(), mom[i].size());
  t->optimizer_.set_step(static_cast<int64_t>(step));
  t->cursor_ = static_cast<int64_t>(cursor);
  t->params_->digest = digest_of(*t->params_);
  return t;
}

}  // namespace ebb
