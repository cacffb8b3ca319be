#include "runtime/device_lora.h"

#include <algorithm>
#include <cstring>

#include "platform/error.h"
#include "runtime/forward.h"

namespace ebb {
namespace {

constexpr uint64_t kAlign = 256;  // each matrix of an upload starts here (as device_forward.cpp's pieces)

uint64_t align_piece(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

int64_t padded_rank(int64_t rank) { return (rank + 1) / 2 * 2; }

bool uploaded(const LoraPair& p) { return p.target != LoraTarget::kTokenEmbd; }

// Whether two sequences apply the same terms (the same version objects at
// the same scales, in the same order): their rows can share one product.
bool same_terms(const AdapterSet* a, const AdapterSet* b) {
  if (!a || !b || a->size() != b->size()) return false;
  for (size_t i = 0; i < a->size(); ++i)
    if ((*a)[i].v != (*b)[i].v || (*a)[i].scale != (*b)[i].scale) return false;
  return true;
}

std::string version_name(const AdapterVersion& v) { return "adapter '" + v.name + "' v" + std::to_string(v.version); }

}  // namespace

DeviceLora::DeviceLora(Backend& be, const ModelConfig& cfg, int64_t max_batch, Isa isa)
    : be_(be), cfg_(cfg), max_batch_(max_batch), lk_(lora_kernels(isa)) {}

DeviceLora::Upload DeviceLora::make_upload(const std::shared_ptr<const AdapterVersion>& v) {
  const LoraAdapter& lora = *v->lora;
  Upload u;
  u.owner = v;
  u.pairs.resize(lora.pairs.size());
  uint64_t size = 0;
  for (size_t i = 0; i < lora.pairs.size(); ++i) {
    const LoraPair& p = lora.pairs[i];
    if (!uploaded(p)) continue;
    if (p.dtype != DType::kF16 && p.dtype != DType::kF32)
      throw Error(be_.info().id + ": " + version_name(*v) + ": a pair of type " + std::string(dtype_name(p.dtype)) +
                  " (F16 or F32 only)");
    if (p.n_in % 2 != 0)
      throw Error(be_.info().id + ": " + version_name(*v) + ": " + lora_base_tensor_name(p.layer, p.target) +
                  " has " + std::to_string(p.n_in) + " inputs; the device's products need an even number");
    const uint64_t esz = p.dtype == DType::kF16 ? 2 : 4;
    PairAt& at = u.pairs[i];
    at.rank_p = padded_rank(p.rank);
    at.a = size;
    size = align_piece(size + static_cast<uint64_t>(at.rank_p * p.n_in) * esz);
    at.b = size;
    size = align_piece(size + static_cast<uint64_t>(p.n_out * at.rank_p) * esz);
    at.present = true;
  }
  if (size == 0) return u;  // token_embd alone: nothing on the device
  u.buf = be_.alloc(size, MemoryPlace::kDevice);
  std::vector<uint8_t> host;
  for (size_t i = 0; i < lora.pairs.size(); ++i) {
    const LoraPair& p = lora.pairs[i];
    const PairAt& at = u.pairs[i];
    if (!at.present) continue;
    const uint64_t esz = p.dtype == DType::kF16 ? 2 : 4;
    // A: its rank rows as held, then zero rows up to rank_p.
    host.assign(static_cast<size_t>(at.rank_p * p.n_in) * esz, 0);
    std::memcpy(host.data(), p.a.data(), static_cast<size_t>(p.rank * p.n_in) * esz);
    u.buf->write(at.a, host.data(), host.size());
    // B [n_out, rank_p] from B^T [rank, n_out] (element copies: F16 bits or F32), zero columns past rank.
    host.assign(static_cast<size_t>(p.n_out * at.rank_p) * esz, 0);
    const auto* bt = static_cast<const uint8_t*>(p.bt.data());
    for (int64_t j = 0; j < p.rank; ++j)
      for (int64_t c = 0; c < p.n_out; ++c)
        std::memcpy(host.data() + static_cast<size_t>(c * at.rank_p + j) * esz,
                    bt + static_cast<size_t>(j * p.n_out + c) * esz, esz);
    u.buf->write(at.b, host.data(), host.size());
  }
  return u;
}

void DeviceLora::ensure_scratch(int64_t rank_p) {
  if (rank_p <= rank_cap_) return;
  t_.reset();
  t_ = be_.alloc(static_cast<uint64_t>(max_batch_) * static_cast<uint64_t>(rank_p) * sizeof(float),
                 MemoryPlace::kDevice);
  rank_cap_ = rank_p;
}

bool DeviceLora::prepare(std::span<const StepSeq> seqs) {
  active_ = false;
  n_ops_ = 0;
  std::vector<const ActiveAdapter*> bound;
  int64_t rank_p = 0;
  for (const StepSeq& s : seqs) {
    if (!s.adapters) continue;
    for (const ActiveAdapter& a : *s.adapters) {
      bound.push_back(&a);
      if (a.scale == 0.0f) continue;
      for (const LoraPair& p : a.v->lora->pairs) {
        if (!uploaded(p)) continue;
        active_ = true;
        rank_p = std::max(rank_p, padded_rank(p.rank));
      }
    }
  }
  auto in_step = [&](const Key& k) {
    return std::any_of(bound.begin(), bound.end(),
                       [&](const ActiveAdapter* a) { return a->v->name == k.first && a->v->version == k.second; });
  };
  auto name_in_step = [&](const std::string& name) {
    return std::any_of(bound.begin(), bound.end(), [&](const ActiveAdapter* a) { return a->v->name == name; });
  };
  // First what goes (gone, replaced by another version of its name, or the
  // key now names another object), so the device never holds both at once.
  for (auto it = uploads_.begin(); it != uploads_.end();) {
    bool drop = false;
    if (in_step(it->first)) {
      const std::shared_ptr<const AdapterVersion> owner = it->second.owner.lock();
      drop = std::none_of(bound.begin(), bound.end(), [&](const ActiveAdapter* a) { return a->v == owner; });
    } else {
      drop = it->second.owner.expired() || name_in_step(it->first.first);
    }
    it = drop ? uploads_.erase(it) : std::next(it);
  }
  for (const ActiveAdapter* a : bound) {
    const Key k{a->v->name, a->v->version};
    if (!uploads_.contains(k)) uploads_.emplace(k, make_upload(a->v));
  }
  if (active_) ensure_scratch(rank_p);
  return active_;
}

void DeviceLora::add_token_embd(const AdapterSet& set, int32_t token, float* x_row) const {
  const int64_t d = cfg_.n_embd;
  // As Forward::run_batch: A's row of the token is the rank-r intermediate.
  for (const ActiveAdapter& a : set) {
    const LoraPair* p = a.v->lora->find(-1, LoraTarget::kTokenEmbd);
    if (!p) continue;
    lk_.up(p->bt_data(), p->a_data() + static_cast<int64_t>(token) * p->rank, a.scale * p->scale, 1, p->rank, d, 0, d,
           x_row, d);
  }
}

void DeviceLora::record(BackendStream& s, std::span<const StepSeq> seqs, int layer, LoraTarget target, TensorRef x,
                        int64_t x_stride, TensorRef y, int64_t y_stride, bool out_rows) {
  if (!active_) return;
  auto rows_of = [&](const StepSeq& q) {
    const int64_t ns = static_cast<int64_t>(q.tokens.size());
    return out_rows && !q.all_logits ? 1 : ns;
  };
  int64_t r0 = 0;
  for (size_t i = 0; i < seqs.size();) {
    const AdapterSet* set = seqs[i].adapters;
    int64_t n = rows_of(seqs[i]);
    size_t j = i + 1;
    for (; j < seqs.size() && same_terms(set, seqs[j].adapters); ++j) n += rows_of(seqs[j]);
    if (set) {
      for (const ActiveAdapter& a : *set) {
        const LoraPair* p = a.v->lora->find(layer, target);
        if (!p || a.scale == 0.0f) continue;
        const Upload& up = uploads_.at(Key{a.v->name, a.v->version});
        const PairAt& at = up.pairs[static_cast<size_t>(p - a.v->lora->pairs.data())];
        EBB_CHECK(at.present && n <= max_batch_ && at.rank_p <= rank_cap_);
        MatmulOp down;  // t = A x
        down.w_type = p->dtype;
        down.rows = at.rank_p;
        down.cols = p->n_in;
        down.w = {up.buf.get(), at.a};
        down.x = {x.buf, x.offset + static_cast<uint64_t>(r0 * x_stride) * sizeof(float)};
        down.x_stride = x_stride;
        down.n_tokens = n;
        down.y = {t_.get(), 0};
        s.matmul(down);
        LowRankUpOp up_add;  // y += s B t: the up-projection and the accumulate in one dispatch
        up_add.b_type = p->dtype;
        up_add.n_out = p->n_out;
        up_add.rank = at.rank_p;
        up_add.b = {up.buf.get(), at.b};
        up_add.t = {t_.get(), 0};
        up_add.n_tokens = n;
        up_add.y = {y.buf, y.offset + static_cast<uint64_t>(r0 * y_stride) * sizeof(float)};
        up_add.y_stride = y_stride;
        up_add.alpha = a.scale * p->scale;
        s.low_rank_up(up_add);
        n_ops_ += 2;
      }
    }
    r0 += n;
    i = j;
  }
}

void DeviceLora::collect() {
  for (auto it = uploads_.begin(); it != uploads_.end();)
    it = it->second.owner.expired() ? uploads_.erase(it) : std::next(it);
}

uint64_t DeviceLora::adapter_bytes() const {
  uint64_t t = 0;
  for (const auto& [k, u] : uploads_) t += u.buf ? u.buf->size() : 0;
  return t;
}

uint64_t DeviceLora::scratch_bytes() const { return t_ ? t_->size() : 0; }

}  // namespace ebb
