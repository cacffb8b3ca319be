#include "runtime/device_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "memory/kv_cache.h"
#include "platform/error.h"
#include "platform/fp16.h"

namespace ebb {
namespace {

constexpr uint64_t kAlign = 256;  // pieces of a layer's buffer start here (a multiple of every binding alignment seen)

uint64_t align_piece(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

uint64_t f32_bytes(int64_t n) { return static_cast<uint64_t>(n) * sizeof(float); }

}  // namespace

uint64_t DeviceFootprint::weights() const {
  uint64_t t = 0;
  for (uint64_t b : weights_per_layer) t += b;
  return t;
}

uint64_t DeviceForward::SeqKv::bytes() const {
  uint64_t t = table ? table->size() : 0;
  for (const auto& b : k) t += b ? b->size() : 0;
  for (const auto& b : v) t += b ? b->size() : 0;
  return t;
}

// The pieces of one buffer before it exists: each a copy of host bytes (or
// a pointer to bytes that outlive the upload) at its offset.
struct DeviceForward::Staged {
  struct Piece {
    uint64_t offset = 0;
    const void* src = nullptr;
    std::vector<uint8_t> owned;  // converted or replicated bytes
    uint64_t bytes = 0;
  };
  std::vector<Piece> pieces;
  uint64_t size = 0;
  Piece& add(uint64_t bytes) {
    Piece& p = pieces.emplace_back();
    p.offset = size;
    p.bytes = bytes;
    size = align_piece(size + bytes);
    return p;
  }
};

DeviceForward::Mat DeviceForward::stage_matrix(Staged& st, const WeightView& w) {
  Mat m;
  m.rows = w.rows;
  m.cols = w.cols;
  if (be_.supports(OpKind::kMatmul, w.type) && w.packing == Packing::kRows) {
    m.type = w.type;
    Staged::Piece& p = st.add(w.row_stride * static_cast<uint64_t>(w.rows));
    p.src = w.data;
    m.offset = p.offset;
    return m;
  }
  // No shader for this format (or a packing for the CPU's SIMD lanes): F16
  // rows, dequantised here once.
  const std::string name(dtype_name(w.type));
  if (w.type != DType::kF16 && std::find(converted_.begin(), converted_.end(), name) == converted_.end())
    converted_.push_back(name);
  m.type = DType::kF16;
  Staged::Piece& p = st.add(static_cast<uint64_t>(w.rows * w.cols) * 2);
  p.owned.resize(p.bytes);
  std::vector<float> row(static_cast<size_t>(w.cols));
  auto* out = reinterpret_cast<uint16_t*>(p.owned.data());
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(ks_, w, r, row.data());
    for (int64_t c = 0; c < w.cols; ++c) out[r * w.cols + c] = fp32_to_fp16(row[c]);
  }
  m.offset = p.offset;
  return m;
}

DeviceForward::Vec DeviceForward::stage_vector(Staged& st, const float* v, int64_t n, int64_t copies) {
  Vec out;
  if (!v) return out;
  Staged::Piece& p = st.add(f32_bytes(n * copies));
  if (copies == 1) {
    p.src = v;
  } else {
    p.owned.resize(p.bytes);
    for (int64_t i = 0; i < copies; ++i) std::memcpy(p.owned.data() + f32_bytes(i * n), v, f32_bytes(n));
  }
  out.present = true;
  out.offset = p.offset;
  return out;
}

std::unique_ptr<BackendBuffer> DeviceForward::upload(Staged& st) {
  auto buf = be_.alloc(std::max<uint64_t>(st.size, kAlign), MemoryPlace::kDevice);
  write_pieces(st, *buf);
  return buf;
}

void DeviceForward::write_pieces(const Staged& st, BackendBuffer& buf) {
  for (const Staged::Piece& p : st.pieces) buf.write(p.offset, p.owned.empty() ? p.src : p.owned.data(), p.bytes);
}

DeviceForward::DeviceForward(Backend& be, Model& model, Allocator& alloc, DeviceForwardOptions opts)
    : be_(be),
      model_(model),
      alloc_(alloc),
      cfg_(model.config()),
      opts_(opts),
      ks_(kernel_set(opts.isa)),
      lora_(be, model.config(), opts.max_batch, opts.isa) {
  const ModelConfig& c = cfg_;
  const std::string dev = be_.info().id;
  if (c.head_dim > 256 || c.head_dim % 2 != 0)
    throw Error(dev + ": head_dim " + std::to_string(c.head_dim) + " is not supported by the attention shader (even, <= 256)");
  if (c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim)
    throw Error(dev + ": rope_dim " + std::to_string(c.rope_dim) + " must be even and <= head_dim");
  const int64_t B = opts_.max_batch;
  if (opts_.first_layer < 0 || opts_.first_layer >= model.n_layers())
    throw Error(dev + ": the first device layer " + std::to_string(opts_.first_layer) + " is outside [0, " +
                std::to_string(model.n_layers()) + ")");
  layers_.resize(static_cast<size_t>(model.n_layers()));
  layer_bytes_.assign(static_cast<size_t>(model.n_layers()), 0);
  streamed_.assign(static_cast<size_t>(model.n_layers()), 0);
  for (int l = opts_.first_layer; l < model.n_layers(); ++l) {
    if (!model.layer_unit(l).resident()) throw Error("layer " + std::to_string(l) + " is not resident: nothing to upload");
    upload_layer(l);
  }
  crc_ = WeightChecksums(model);
  {
    const GlobalWeights g = model.globals();
    Staged st;
    head_.o = stage_matrix(st, g.output);
    head_.attn_norm = stage_vector(st, g.output_norm, c.n_embd);
    head_.buf = upload(st);
  }
  auto f32 = [&](int64_t n) { return be_.alloc(f32_bytes(n), MemoryPlace::kDevice); };
  x_ = f32(B * c.n_embd);
  xn_ = f32(B * c.n_embd);
  q_ = f32(B * c.q_dim());
  k_ = f32(B * c.kv_dim());
  v_ = f32(B * c.kv_dim());
  att_ = f32(B * c.q_dim());
  gate_ = f32(B * c.n_ff);
  up_ = f32(B * c.n_ff);
  rope_ = f32(B * c.rope_dim);
  logits_ = f32(B * c.n_vocab);
  x_host_.resize(static_cast<size_t>(B * c.n_embd));
  rope_host_.resize(static_cast<size_t>(B * c.rope_dim));
  stream_ = be_.new_stream();
}

void DeviceForward::upload_layer(int l) {
  upload_layer_into(l, layers_[l]);
  layer_bytes_[l] = layers_[l].buf->size();
}

void DeviceForward::upload_layer_into(int l, LayerBuf& lb) {
  const ModelConfig& c = cfg_;
  const int64_t B = opts_.max_batch;
  {
    const LayerWeights w = model_.layer(l);
    Staged st;
    lb.q = stage_matrix(st, w.q);
    lb.k = stage_matrix(st, w.k);
    lb.v = stage_matrix(st, w.v);
    lb.o = stage_matrix(st, w.o);
    lb.gate = stage_matrix(st, w.gate);
    lb.up = stage_matrix(st, w.up);
    lb.down = stage_matrix(st, w.down);
    lb.attn_norm = stage_vector(st, w.attn_norm, c.n_embd);
    lb.ffn_norm = stage_vector(st, w.ffn_norm, c.n_embd);
    lb.q_norm = stage_vector(st, w.q_norm, c.head_dim);
    lb.k_norm = stage_vector(st, w.k_norm, c.head_dim);
    // Biases replicated over the batch: one add over all rows of a step.
    lb.q_bias = stage_vector(st, w.q_bias, c.q_dim(), B);
    lb.k_bias = stage_vector(st, w.k_bias, c.kv_dim(), B);
    lb.v_bias = stage_vector(st, w.v_bias, c.kv_dim(), B);
    if (lb.buf) {  // a streaming window: sized for the largest layer
      EBB_CHECK(lb.buf->size() >= st.size);
      write_pieces(st, *lb.buf);
    } else {
      lb.buf = upload(st);
    }
  }
}

DeviceForward::Evicted DeviceForward::evict(uint64_t bytes, bool park_kv) {
  std::lock_guard lock(mu_);
  const uint64_t before = be_.ledger(MemoryPlace::kDevice).buffer_bytes;
  Evicted e;
  size_windows_locked(0);  // a memory limit's streaming windows (device_limit.cpp): the next step takes them again
  for (int l = model_.n_layers() - 1;
       l >= opts_.first_layer && before - be_.ledger(MemoryPlace::kDevice).buffer_bytes < bytes; --l) {
    if (!layers_[l].buf) continue;
    layers_[l].buf.reset();
    ++e.layers;
  }
  // Then the sessions' KV, parked on the host (between steps every session is idle).
  for (auto& [kv, s] : kv_) {
    if (!park_kv || before - be_.ledger(MemoryPlace::kDevice).buffer_bytes >= bytes) break;
    if (s.is_parked || s.cap_chunks == 0) continue;
    const uint64_t held = be_.ledger(MemoryPlace::kDevice).buffer_bytes;
    park(s, std::min(kv->n_tokens(), s.cap_chunks * s.chunk_size));
    e.kv_freed += held - be_.ledger(MemoryPlace::kDevice).buffer_bytes;
    ++e.kv_sessions;
  }
  if (e.kv_sessions > 0) staging_.reset();  // host-visible: taken again by the next transfer
  e.freed = before - be_.ledger(MemoryPlace::kDevice).buffer_bytes;
  // A split: then the CPU's layers, whose units the GGUF backs.
  for (int l = opts_.first_layer - 1; l >= 0 && e.freed + e.host_freed < bytes; --l) {
    WeightUnit& u = model_.layer_unit(l);
    if (!u.resident()) continue;
    e.host_freed += u.bytes();
    u.release();
    ++e.host_layers;
  }
  return e;
}

int64_t DeviceForward::restore() {
  std::lock_guard lock(mu_);
  return restore_locked();
}

int64_t DeviceForward::restore_host_locked() {
  int64_t n = 0;
  for (int l = 0; l < opts_.first_layer; ++l) {  // a split's CPU layers: read back and kept on the host
    WeightUnit& u = model_.layer_unit(l);
    if (u.resident()) continue;
    u.load(model_.file(), alloc_);
    ++n;
  }
  return n;
}

int64_t DeviceForward::restore_locked() {
  size_windows_locked(0);  // what fits is counted without them; the next step that streams takes them again
  for (auto& [kv, s] : kv_) unpark(s);
  int64_t n = restore_host_locked();
  // Under a memory limit: the dropped layers that fit, lowest first
  // (device_limit.cpp); without one, all.
  uint64_t left = limit_ > 0 ? restore_room_locked(0) : UINT64_MAX;
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l) {
    if (layers_[l].buf) continue;
    if (layer_bytes_[l] > left) break;  // forward-in: the later layers stay dropped too
    if (left != UINT64_MAX) left -= layer_bytes_[l];
    try {
      restore_layer(l);
    } catch (const Error& e) {
      throw Error("layer " + std::to_string(l) + " could not be restored to the device: " + e.what());
    }
    ++n;
  }
  return n;
}

void DeviceForward::restore_layer(int l) {
  read_layer(l, [&] { upload_layer(l); });
}

void DeviceForward::read_layer(int l, const std::function<void()>& upload) {
  const GgufFile& f = model_.file();
  if (!descriptor_unchanged(f.fd(), f))
    throw Error(f.path() + ": the model file changed on disk since it was loaded; its weights cannot be restored "
                "(reload the model)");
  WeightUnit& u = model_.layer_unit(l);
  u.load(f, alloc_);  // throws naming the file on an I/O error (the layer stays dropped)
  struct Release {
    WeightUnit& u;
    ~Release() { u.release(); }  // the device holds it again; the host copy goes
  } release{u};
  // The CRC only when the inode may have been written since load (as the CPU path).
  if (!bytes_unchanged(f.fd(), f)) crc_.verify(l, u, u.base(), f.path());
  upload();
}

int64_t DeviceForward::n_parked() const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (const auto& [kv, s] : kv_) n += s.is_parked ? 1 : 0;
  return n;
}

void DeviceForward::set_restore_hooks(DeviceRestoreHooks hooks) {
  std::lock_guard lock(mu_);
  hooks_ = std::move(hooks);
}

int64_t DeviceForward::n_dropped() const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (int l = 0; l < model_.n_layers(); ++l)
    n += (l < opts_.first_layer ? model_.layer_unit(l).resident() : layers_[l].buf != nullptr) ? 0 : 1;
  return n;
}

DeviceForward::~DeviceForward() {
  std::lock_guard lock(mu_);
  kv_.clear();
  staging_.reset();
}

void DeviceForward::release(const KvCache* kv) {
  std::lock_guard lock(mu_);
  kv_.erase(kv);
  if (kv_.empty()) staging_.reset();  // the transfers' staging goes with the last KV
}

DeviceForward::SeqKv& DeviceForward::kv_for(KvCache& kv, int64_t n) {
  const ModelConfig& c = cfg_;
  SeqKv& s = kv_[&kv];
  const int64_t cs = kv.options().chunk_size;
  if (s.chunk_size != cs) s = SeqKv{};  // a new cache (or one re-created with another chunk): start empty
  s.chunk_size = cs;
  unpark(s);
  const int64_t need = (n + cs - 1) / cs;
  if (need <= s.cap_chunks) return s;
  // Double the capacity (at most the context), copying what is held.
  const int64_t most = (kv.options().max_tokens + cs - 1) / cs;
  const int64_t cap = std::max(need, std::min(most, std::max<int64_t>(1, 2 * s.cap_chunks)));
  const uint64_t bytes = static_cast<uint64_t>(cap * cs * c.kv_dim()) * 2;
  const uint64_t held = static_cast<uint64_t>(s.cap_chunks * cs * c.kv_dim()) * 2;
  std::vector<uint8_t> tmp;
  if (held > 0) tmp.resize(held);
  s.k.resize(static_cast<size_t>(model_.n_layers()));  // a split's CPU layers stay null
  s.v.resize(static_cast<size_t>(model_.n_layers()));
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l) {
    for (auto* side : {&s.k, &s.v}) {
      auto grown = be_.alloc(bytes, MemoryPlace::kDevice);
      if (held > 0) {
        (*side)[l]->read(0, tmp.data(), held);
        grown->write(0, tmp.data(), held);
      }
      (*side)[l] = std::move(grown);
    }
  }
  make_table(s, cap);
  return s;
}

void DeviceForward::make_table(SeqKv& s, int64_t cap) {
  const int64_t cs = s.chunk_size;
  std::vector<uint32_t> table(static_cast<size_t>(cap));
  for (int64_t i = 0; i < cap; ++i) {
    const uint64_t off = static_cast<uint64_t>(i * cs * cfg_.kv_dim());
    if (off > UINT32_MAX) throw Error(be_.info().id + ": a session's KV is over 2^32 F16 elements per layer");
    table[i] = static_cast<uint32_t>(off);
  }
  s.table = be_.alloc(4 * static_cast<uint64_t>(cap), MemoryPlace::kDevice);
  s.table->write(0, table.data(), 4 * static_cast<uint64_t>(cap));
  s.cap_chunks = cap;
}

void DeviceForward::matmul(BackendStream& s, const LayerBuf& w, const Mat& m, BackendBuffer* x, uint64_t x_off,
                           BackendBuffer* y, uint64_t y_off, int64_t n_tokens) {
  MatmulOp op;
  op.w_type = m.type;
  op.rows = m.rows;
  op.cols = m.cols;
  op.w = {w.buf.get(), m.offset};
  op.x = {x, x_off};
  op.n_tokens = n_tokens;
  op.y = {y, y_off};
  s.matmul(op);
}

void DeviceForward::record_layer(BackendStream& s, const LayerBuf& w, int l, std::span<const StepSeq> seqs,
                                 int64_t n) {
  const ModelConfig& c = cfg_;
  const int64_t D = c.n_embd, hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim();
  BackendBuffer* wb = w.buf.get();
  // Attention block: norm, q/k/v, biases, Q/K norms, RoPE, KV store and
  // attention per sequence, o, residual.
  s.rms_norm({{x_.get(), 0}, {wb, w.attn_norm.offset}, {xn_.get(), 0}, n, D, c.rms_eps});
  // Each product, then its adapters' terms on the rows of the sequences that bind them.
  auto lora = [&](LoraTarget t, BackendBuffer* x, int64_t x_stride, BackendBuffer* y, int64_t y_stride) {
    lora_.record(s, seqs, l, t, {x, 0}, x_stride, {y, 0}, y_stride);
  };
  matmul(s, w, w.q, xn_.get(), 0, q_.get(), 0, n);
  lora(LoraTarget::kQ, xn_.get(), D, q_.get(), qd);
  matmul(s, w, w.k, xn_.get(), 0, k_.get(), 0, n);
  lora(LoraTarget::kK, xn_.get(), D, k_.get(), kvd);
  matmul(s, w, w.v, xn_.get(), 0, v_.get(), 0, n);
  lora(LoraTarget::kV, xn_.get(), D, v_.get(), kvd);
  if (w.q_bias.present) s.add({{q_.get(), 0}, {wb, w.q_bias.offset}, n * qd});
  if (w.k_bias.present) s.add({{k_.get(), 0}, {wb, w.k_bias.offset}, n * kvd});
  if (w.v_bias.present) s.add({{v_.get(), 0}, {wb, w.v_bias.offset}, n * kvd});
  if (w.q_norm.present) s.rms_norm({{q_.get(), 0}, {wb, w.q_norm.offset}, {q_.get(), 0}, n * c.n_head, hd, c.rms_eps});
  if (w.k_norm.present)
    s.rms_norm({{k_.get(), 0}, {wb, w.k_norm.offset}, {k_.get(), 0}, n * c.n_head_kv, hd, c.rms_eps});
  s.rope({{q_.get(), 0}, {rope_.get(), 0}, n, c.n_head, hd, c.rope_dim, c.rope_style});
  s.rope({{k_.get(), 0}, {rope_.get(), 0}, n, c.n_head_kv, hd, c.rope_dim, c.rope_style});
  int64_t r = 0;
  for (const StepSeq& seq : seqs) {
    const int64_t ns = static_cast<int64_t>(seq.tokens.size());
    const int64_t pos0 = seq.kv->n_tokens();
    SeqKv& kv = kv_.at(seq.kv);
    s.kv_store({{k_.get(), f32_bytes(r * kvd)}, {kv.k[l].get(), 0}, {kv.table.get(), 0}, ns, kvd, pos0, kv.chunk_size});
    s.kv_store({{v_.get(), f32_bytes(r * kvd)}, {kv.v[l].get(), 0}, {kv.table.get(), 0}, ns, kvd, pos0, kv.chunk_size});
    AttentionOp a;
    a.q = {q_.get(), f32_bytes(r * qd)};
    a.out = {att_.get(), f32_bytes(r * qd)};
    a.k = {kv.k[l].get(), 0};
    a.v = {kv.v[l].get(), 0};
    a.chunk_offsets = {kv.table.get(), 0};
    a.n_q = ns;
    a.n_heads = c.n_head;
    a.n_kv_heads = c.n_head_kv;
    a.head_dim = hd;
    a.pos0 = pos0;
    a.chunk_size = kv.chunk_size;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    s.attention(a);
    r += ns;
  }
  matmul(s, w, w.o, att_.get(), 0, xn_.get(), 0, n);
  lora(LoraTarget::kO, att_.get(), qd, xn_.get(), D);
  s.add({{x_.get(), 0}, {xn_.get(), 0}, n * D});
  // FFN block: norm, gate/up, SwiGLU, down, residual.
  s.rms_norm({{x_.get(), 0}, {wb, w.ffn_norm.offset}, {xn_.get(), 0}, n, D, c.rms_eps});
  matmul(s, w, w.gate, xn_.get(), 0, gate_.get(), 0, n);
  lora(LoraTarget::kGate, xn_.get(), D, gate_.get(), c.n_ff);
  matmul(s, w, w.up, xn_.get(), 0, up_.get(), 0, n);
  lora(LoraTarget::kUp, xn_.get(), D, up_.get(), c.n_ff);
  s.swiglu({{gate_.get(), 0}, {up_.get(), 0}, {gate_.get(), 0}, n * c.n_ff});
  matmul(s, w, w.down, gate_.get(), 0, xn_.get(), 0, n);
  lora(LoraTarget::kDown, gate_.get(), c.n_ff, xn_.get(), D);
  s.add({{x_.get(), 0}, {xn_.get(), 0}, n * D});
}

void DeviceForward::check_step(std::span<const StepSeq> seqs, int64_t& n, int64_t& n_out) const {
  const int64_t V = cfg_.n_vocab;
  EBB_CHECK(!seqs.empty());
  n = 0;
  n_out = 0;
  for (const StepSeq& s : seqs) {
    const int64_t ns = static_cast<int64_t>(s.tokens.size());
    EBB_CHECK(ns >= 1 && s.kv && s.logits);
    if (s.kv->options().type != DType::kF16) throw Error(be_.info().id + ": the KV cache on the device is F16 only");
    EBB_CHECK_MSG(s.kv->n_host_layers() == opts_.first_layer, "a KV cache made for another split of the layers");
    for (int32_t t : s.tokens)
      if (t < 0 || t >= V)
        throw Error("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
    n += ns;
    n_out += s.all_logits ? ns : 1;
  }
  EBB_CHECK(n <= opts_.max_batch);
}

void DeviceForward::prepare(std::span<const StepSeq> seqs) {
  std::lock_guard lock(mu_);
  int64_t n = 0, n_out = 0;
  check_step(seqs, n, n_out);
  plan_step_locked(seqs);  // under a memory limit: what comes back, what streams (refused when nothing fits)
  restore_host_locked();  // the CPU's layers evict() dropped come back first; the device's in run_batch
  lora_.prepare(seqs);    // the versions the step binds uploaded, replaced ones freed
  for (const StepSeq& s : seqs) kv_for(*s.kv, s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size()));
}

void DeviceForward::run_batch(std::span<const StepSeq> seqs, const float* x) {
  std::lock_guard lock(mu_);
  const ModelConfig& c = cfg_;
  const int64_t D = c.n_embd, V = c.n_vocab;
  int64_t n = 0, n_out = 0;
  check_step(seqs, n, n_out);
  EBB_CHECK(x || opts_.first_layer == 0);  // a split's rows come from the CPU's layers
  if (opts_.first_layer == 0) plan_step_locked(seqs);  // prepare() did it in a split
  restore_host_locked();  // prepare() did it in a split
  // Device layers evict() dropped come back on a restore thread while the
  // layers before them run (device_restore.h); under a memory limit, the
  // ones it leaves out stream (stream_layer).
  std::vector<int> dropped, streamed;
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l) {
    if (!layers_[l].buf && !streamed_[l]) dropped.push_back(l);
    if (streamed_[l]) streamed.push_back(l);
  }
  // The streamed layers' reader starts once the restorer is done (its
  // layers all come before them), so the two never hold host copies at once.
  const int stream_from = dropped.empty() ? opts_.first_layer : dropped.back() + 1;
  std::optional<LayerStreamer> streamer;
  if (!streamed.empty()) streamer.emplace(std::move(streamed), n_windows_, [this](int l, int w) { stream_read(l, w); });
  std::optional<LayerRestorer> restorer;
  if (!dropped.empty()) restorer.emplace(std::move(dropped), [this](int l) { restore_layer(l); }, &hooks_);
  lora_.prepare(seqs);  // the versions the step binds uploaded, replaced ones freed (prepare() did it in a split)
  for (const StepSeq& s : seqs) kv_for(*s.kv, s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size()));
  // Inputs: embeddings (or a split's hidden rows) and each row's (cos, sin)
  // table, computed here.
  const GlobalWeights g = model_.globals();
  {
    int64_t r = 0;
    for (const StepSeq& s : seqs) {
      const int64_t pos0 = s.kv->n_tokens();
      for (size_t t = 0; t < s.tokens.size(); ++t, ++r) {
        if (!x) {  // a split's rows come with token_embd's adapters applied (Forward)
          dequantize_row(ks_, g.token_embd, s.tokens[t], x_host_.data() + r * D);
          if (s.adapters) lora_.add_token_embd(*s.adapters, s.tokens[t], x_host_.data() + r * D);
        }
        rope_cos_sin(pos0 + static_cast<int64_t>(t), c.rope_dim, c.rope_base, c.rope_freq_scale,
                     rope_host_.data() + r * c.rope_dim,
                     c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data());
      }
    }
  }
  x_->write(0, x ? x : x_host_.data(), f32_bytes(n * D));
  rope_->write(0, rope_host_.data(), f32_bytes(n * c.rope_dim));
  BackendStream& s = *stream_;
  run_on(s, [&] {
    for (int l = opts_.first_layer; l < model_.n_layers(); ++l) {
      if (streamer) start_stream(*streamer, l, stream_from);
      if (restorer && restorer->pending(l) && !restorer->ready(l)) {
        // Layer l is still being read: the device runs what is recorded
        // meanwhile; recording goes on once l is back and the stream is free.
        if (s.n_recorded() > 0) {
          s.submit();
          if (hooks_.after_submit) hooks_.after_submit(l - 1);
        }
        restorer->wait(l);  // throws naming the layer when its read failed
        s.wait();
      }
      if (streamed_[l]) {
        stream_layer(s, *streamer, l, seqs, n);
        continue;
      }
      record_layer(s, layers_[l], l, seqs, n);
    }
    // The output head on the rows the callers want.
    int64_t r = 0, o = 0;
    for (const StepSeq& seq : seqs) {
      const int64_t ns = static_cast<int64_t>(seq.tokens.size());
      const int64_t rows = seq.all_logits ? ns : 1, first = r + ns - rows;
      s.rms_norm({{x_.get(), f32_bytes(first * D)}, {head_.buf.get(), head_.attn_norm.offset},
                  {xn_.get(), f32_bytes(o * D)}, rows, D, c.rms_eps});
      r += ns;
      o += rows;
    }
    matmul(s, head_, head_.o, xn_.get(), 0, logits_.get(), 0, n_out);
    lora_.record(s, seqs, -1, LoraTarget::kOutput, {xn_.get(), 0}, D, {logits_.get(), 0}, V, /*out_rows=*/true);
  });
  int64_t o = 0;
  for (const StepSeq& seq : seqs) {
    const int64_t rows = seq.all_logits ? static_cast<int64_t>(seq.tokens.size()) : 1;
    logits_->read(f32_bytes(o * V), seq.logits, f32_bytes(rows * V));
    o += rows;
    seq.kv->set_n_tokens(seq.kv->n_tokens() + static_cast<int64_t>(seq.tokens.size()));
  }
}

void DeviceForward::collect_adapters() {
  std::lock_guard lock(mu_);
  lora_.collect();
}

int64_t DeviceForward::n_adapter_uploads() const {
  std::lock_guard lock(mu_);
  return lora_.n_uploads();
}

DeviceFootprint DeviceForward::footprint() const {
  std::lock_guard lock(mu_);
  return footprint_locked();
}

DeviceFootprint DeviceForward::footprint_locked() const {
  DeviceFootprint f;
  f.id = be_.info().id;
  f.name = be_.info().name;
  for (const LayerBuf& l : layers_) f.weights_per_layer.push_back(l.buf ? l.buf->size() : 0);
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l)
    if (!layers_[l].buf) f.weights_dropped += layer_bytes_[l];
  f.globals = head_.buf->size();
  for (const auto& [k, s] : kv_) {
    f.kv += s.bytes();
    f.kv_parked += s.parked.size();
  }
  for (const auto* b : {&x_, &xn_, &q_, &k_, &v_, &att_, &gate_, &up_, &rope_, &logits_}) f.scratch += (*b)->size();
  f.adapters = lora_.adapter_bytes();
  f.scratch += lora_.scratch_bytes();
  f.ledger = be_.ledger(MemoryPlace::kDevice);
  return f;
}

}  // namespace ebb
