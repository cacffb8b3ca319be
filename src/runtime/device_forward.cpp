#include "runtime/device_forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "memory/kv_cache.h"
#include "platform/error.h"
#include "platform/checksum.h"
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
    // The unit's bytes the piece is `copies` copies of, unchanged (the
    // direct restore reads them from the file); nullptr when converted.
    const void* origin = nullptr;
    int64_t copies = 1;
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
    p.origin = w.data;
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
  p.origin = v;
  p.copies = copies;
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
  write_staged(st, *buf);
  return buf;
}

void DeviceForward::write_staged(const Staged& st, BackendBuffer& buf) {
  EBB_CHECK(buf.size() == std::max<uint64_t>(st.size, kAlign));
  static constexpr uint8_t kZeros[kAlign] = {};
  uint64_t end = 0;  // the padding between pieces is zeros: a layer's buffer is the same bytes whichever way it came
  for (const Staged::Piece& p : st.pieces) {
    if (p.offset > end) buf.write(end, kZeros, p.offset - end);
    buf.write(p.offset, p.owned.empty() ? p.src : p.owned.data(), p.bytes);
    end = p.offset + p.bytes;
  }
  if (buf.size() > end) buf.write(end, kZeros, buf.size() - end);
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
  direct_.resize(static_cast<size_t>(model.n_layers()));
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
  // Timeline waits need the restore thread to write the layers' buffers
  // itself: mapped device memory. A discrete device's staging copies go
  // through the one queue, behind the segments that wait for them: the
  // host-wait path there.
  const LayerBuf& some = layers_[static_cast<size_t>(opts_.first_layer)];
  if (stream_->supports_timeline() && some.buf && some.buf->host_data()) timeline_ = be_.new_timeline();
}

void DeviceForward::upload_layer(int l, BackendBuffer* into) {
  const ModelConfig& c = cfg_;
  const int64_t B = opts_.max_batch;
  {
    const LayerWeights w = model_.layer(l);
    // Into a buffer the step already holds (a restore beside a step that
    // reads layers_[l]): the layout is the one computed at load, unchanged.
    LayerBuf scratch;
    LayerBuf& lb = into ? scratch : layers_[l];
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
    if (into) {
      EBB_CHECK(lb.q.offset == layers_[l].q.offset && lb.down.offset == layers_[l].down.offset);
      write_staged(st, *into);
      return;
    }
    lb.buf = upload(st);
    layer_bytes_[l] = lb.buf->size();
    plan_direct(l, st);
  }
}

void DeviceForward::plan_direct(int l, const Staged& st) {
  // Direct when every piece is a slot's file bytes, unchanged (or copies of
  // them: replicated biases), and every slot is one piece's.
  WeightUnit& u = model_.layer_unit(l);
  const uint8_t* base = u.base();
  const std::vector<TensorSlot>& slots = u.slots();
  std::vector<DirectPiece> plan(slots.size());
  std::vector<char> seen(slots.size(), 0);
  direct_[l].clear();
  for (const Staged::Piece& p : st.pieces) {
    if (!p.origin) return;  // converted (widened or dequantised): read, convert, upload
    const uint64_t off = static_cast<uint64_t>(static_cast<const uint8_t*>(p.origin) - base);
    size_t i = 0;
    while (i < slots.size() && slots[i].unit_offset != off) ++i;
    if (i == slots.size()) return;
    const TensorSlot& t = slots[i];
    if (seen[i] || t.type != t.file_type || t.packing != Packing::kRows || t.unit_bytes != t.file_bytes ||
        p.bytes != t.file_bytes * static_cast<uint64_t>(p.copies))
      return;
    seen[i] = 1;
    plan[i] = DirectPiece{p.offset, t.file_offset, t.file_bytes, p.copies};
  }
  for (char c : seen)
    if (!c) return;
  direct_[l] = std::move(plan);
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
  stats_ = DeviceRestoreStats{};
  // Under a memory limit: the dropped layers that fit, lowest first
  // (device_limit.cpp); without one, all.
  uint64_t left = limit_ > 0 ? restore_room_locked(0) : UINT64_MAX;
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l) {
    if (layers_[l].buf) continue;
    if (layer_bytes_[l] > left) break;  // forward-in: the later layers stay dropped too
    if (left != UINT64_MAX) left -= layer_bytes_[l];
    ++stats_.layers;
    try {
      ++(restore_layer(l) ? stats_.direct_layers : stats_.staged_layers);
    } catch (const Error& e) {
      throw Error("layer " + std::to_string(l) + " could not be restored to the device: " + e.what());
    }
    ++n;
  }
  return n;
}

bool DeviceForward::restore_layer(int l) {
  auto buf = be_.alloc(layer_bytes_[l], MemoryPlace::kDevice);
  const bool direct = restore_layer_into(l, *buf);
  layers_[l].buf = std::move(buf);
  return direct;
}

bool DeviceForward::direct_restore(int l, BackendBuffer& buf) const {
  return !direct_[l].empty() && buf.host_data() != nullptr && !hooks_.staged_only;
}

bool DeviceForward::restore_layer_into(int l, BackendBuffer& buf) {
  const GgufFile& f = model_.file();
  if (!descriptor_unchanged(f.fd(), f))
    throw Error(f.path() + ": the model file changed on disk since it was loaded; its weights cannot be restored "
                "(reload the model)");
  if (direct_restore(l, buf)) {
    read_direct(l, static_cast<uint8_t*>(buf.host_data()));
    return true;
  }
  WeightUnit& u = model_.layer_unit(l);
  u.load(f, alloc_);  // throws naming the file on an I/O error (the layer stays dropped)
  struct Release {
    WeightUnit& u;
    ~Release() { u.release(); }  // the device holds it again; the host copy goes
  } release{u};
  // The CRC only when the inode may have been written since load (as the CPU path).
  if (!bytes_unchanged(f.fd(), f)) crc_.verify(l, u, u.base(), f.path());
  upload_layer(l, &buf);
  return false;
}

void DeviceForward::read_direct(int l, uint8_t* dst) {
  const GgufFile& f = model_.file();
  if (!dfile_.is_open()) {
    // The descriptor the model was loaded through, opened again for direct
    // I/O: the same inode even if the path was replaced since.
    dfile_ = DirectFile::open_read("/proc/self/fd/" + std::to_string(f.fd()));
    io_ = std::make_unique<IoEngine>();
  }
  {  // the padding between pieces is zeros, as write_staged leaves it
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [offset, end) of each piece's copies
    for (const DirectPiece& p : direct_[l])
      ranges.emplace_back(p.dev_offset, p.dev_offset + p.bytes * static_cast<uint64_t>(p.copies));
    std::sort(ranges.begin(), ranges.end());
    uint64_t end = 0;
    for (const auto& [a, b] : ranges) {
      if (a > end) std::memset(dst + end, 0, a - end);
      end = b;
    }
    if (layer_bytes_[l] > end) std::memset(dst + end, 0, layer_bytes_[l] - end);
  }
  try {
    for (const DirectPiece& p : direct_[l]) {
      // O_DIRECT for the aligned middle when the file offset and the mapping
      // line up on 4 KiB, a bounce block for the ends (read_range).
      read_range(*io_, dfile_, p.file_offset, dst + p.dev_offset, p.bytes);
      for (int64_t c = 1; c < p.copies; ++c) std::memcpy(dst + p.dev_offset + c * p.bytes, dst + p.dev_offset, p.bytes);
    }
  } catch (const Error& e) {
    throw Error(f.path() + ": " + e.what());
  }
  // The CRC, on the mapped bytes, where it runs today: the unit image's slots
  // in slot order are the pieces' first copies in that order.
  if (!bytes_unchanged(f.fd(), f) && crc_.has(l)) {
    uint32_t c = 0;
    for (const DirectPiece& p : direct_[l]) c = crc32c(dst + p.dev_offset, p.bytes, c);
    if (c != crc_.crc(l)) throw Error(weights_changed_message(f.path(), "layer " + std::to_string(l), c, crc_.crc(l)));
  }
}

std::vector<uint8_t> DeviceForward::read_layer(int l) {
  std::lock_guard lock(mu_);
  EBB_CHECK(l >= opts_.first_layer && l < model_.n_layers() && layers_[l].buf);
  std::vector<uint8_t> out(layers_[l].buf->size());
  layers_[l].buf->read(0, out.data(), out.size());
  return out;
}

bool DeviceForward::layer_direct(int l) const {
  std::lock_guard lock(mu_);
  return l >= 0 && l < model_.n_layers() && !direct_[l].empty();
}

DeviceRestoreStats DeviceForward::restore_stats() const {
  std::lock_guard lock(mu_);
  return stats_;
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
  // The streamed layers' reader (device_stream.h) starts once the restorer
  // is done (its layers all come before them), so the two never hold host
  // copies at once.
  const int stream_from = dropped.empty() ? opts_.first_layer : dropped.back() + 1;
  std::optional<LayerStreamer> streamer;
  if (!streamed.empty()) streamer.emplace(std::move(streamed), n_windows_, [this](int l, int w) { stream_read(l, w); });
  // With timelines (device_restore.h) their buffers are allocated now and
  // the whole step is recorded and submitted in segments, each dropped
  // layer's waiting on the device for the restore thread's signal; without,
  // the host waits per layer below.
  stats_ = DeviceRestoreStats{};
  stats_.layers = static_cast<int64_t>(dropped.size());
  const bool timeline = !dropped.empty() && timeline_ && !hooks_.host_waits;
  const uint64_t tl_base = timeline_value_;  // dropped[i]'s bytes are in place at tl_base + 1 + i
  std::vector<uint64_t> tl_value(static_cast<size_t>(model_.n_layers()), 0);
  std::atomic<int64_t> n_direct{0}, n_staged{0};
  std::optional<LayerRestorer> restorer;
  // Frees the buffers of the layers whose read failed (or never ran), once
  // nothing in flight uses them; they stay dropped.
  auto drop_unrestored = [&] {
    if (!timeline) return;
    if (restorer) restorer->finish();  // no read still writes into them
    for (int l = opts_.first_layer; l < model_.n_layers(); ++l)
      if (tl_value[l] > 0 && !(restorer && restorer->ready(l))) layers_[l].buf.reset();
  };
  if (timeline) {
    timeline_value_ = tl_base + dropped.size();  // the restorer reaches it whatever happens
    for (size_t i = 0; i < dropped.size(); ++i) tl_value[dropped[i]] = tl_base + 1 + i;
    try {
      for (int l : dropped) layers_[l].buf = be_.alloc(layer_bytes_[l], MemoryPlace::kDevice);
    } catch (...) {
      timeline_->signal(timeline_value_);
      drop_unrestored();
      throw;
    }
    restorer.emplace(
        dropped,
        [this, &n_direct, &n_staged](int l) { ++(restore_layer_into(l, *layers_[l].buf) ? n_direct : n_staged); },
        &hooks_, [this, tl_base](size_t k) { timeline_->signal(tl_base + k); });
  } else if (!dropped.empty()) {
    restorer.emplace(
        std::move(dropped), [this, &n_direct, &n_staged](int l) { ++(restore_layer(l) ? n_direct : n_staged); },
        &hooks_);
  }
  struct DropOnThrow {  // whatever throws from here on (KV growth, recording, the device, a failed read)
    const std::function<void()> drop;
    const int n = std::uncaught_exceptions();
    ~DropOnThrow() {
      if (std::uncaught_exceptions() > n) drop();
    }
  } drop_on_throw{drop_unrestored};
  struct Count {  // the restore's counters, whatever way the step ends
    DeviceRestoreStats& st;
    std::atomic<int64_t>& d;
    std::atomic<int64_t>& s;
    ~Count() {
      st.direct_layers = d;
      st.staged_layers = s;
    }
  } count{stats_, n_direct, n_staged};
  stats_.timeline = timeline;
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
      if (streamer) start_stream(*streamer, l, stream_from, restorer ? &*restorer : nullptr);
      if (timeline && tl_value[l] > 0) {
        // Layer l may still be being read: what is recorded goes to the
        // device now, and its ops from here on wait there for l's bytes.
        const bool any = s.n_recorded() > 0;
        s.wait_for(*timeline_, tl_value[l]);
        if (any && hooks_.after_submit) hooks_.after_submit(l - 1);
      } else if (restorer && restorer->pending(l) && !restorer->ready(l)) {
        // Layer l is still being read: the device runs what is recorded
        // meanwhile; recording goes on once l is back and the stream is free.
        if (s.n_recorded() > 0) {
          s.submit();
          ++stats_.submissions;
          if (hooks_.after_submit) hooks_.after_submit(l - 1);
        }
        ++stats_.host_waits;
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
    stats_.submissions += s.n_submitted() + 1;  // the segments, and run_on's submission
    ++stats_.host_waits;                        // run_on's wait: the logits
  });  // on a throw run_on waited out everything in flight before drop_on_throw frees anything
  if (timeline) {
    // Every segment ran, so every dropped layer is settled: one that failed
    // ran on stale bytes, and the step fails naming the first.
    for (int l = opts_.first_layer; l < model_.n_layers(); ++l)
      if (tl_value[l] > 0 && !restorer->ready(l)) restorer->wait(l);  // throws naming the layer
  }
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

int64_t DeviceForward::n_lora_ops_last_step() const {
  std::lock_guard lock(mu_);
  return lora_.n_ops_last_step();
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
