#include "memory/kv_pool.h"

#include <algorithm>
#include <cstring>

#include "platform/error.h"

namespace ebb {

void KvChunkHandle::reset() {
  KvChunk* c = std::exchange(c_, nullptr);
  if (c && c->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) c->pool->release(c);
}

KvPool::KvPool(KvShape shape, Allocator* alloc) : shape_(shape), alloc_(alloc) {
  by_layer_.resize(static_cast<size_t>(shape_.n_layer));
  resident_bytes_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(shape_.n_layer));
}

KvPool::~KvPool() {
  // Every holder (sessions, the prefix cache) goes before the pool.
  for (const auto& l : by_layer_) EBB_CHECK_MSG(l.empty(), "KV pool destroyed while chunks are held");
}

std::vector<KvChunkHandle> KvPool::create(const std::vector<int32_t>& layers, int64_t chunk_size, DType type,
                                          bool populate) {
  if (type != DType::kF16 && type != DType::kF32) {
    throw Error("KV cache type must be F16 or F32, not " + std::string(dtype_name(type)));
  }
  std::vector<KvChunkHandle> out;
  if (layers.empty()) return out;
  const uint64_t row_bytes =
      static_cast<uint64_t>(shape_.n_kv_heads * shape_.head_dim) * (type == DType::kF16 ? 2 : 4);
  const uint64_t alloc_bytes = (2 * row_bytes * static_cast<uint64_t>(chunk_size) + 4095) & ~uint64_t{4095};
  std::vector<Buffer> bufs;
  bufs.reserve(layers.size());
  {
    // Spare buffers of this size first (already faulted in).
    std::lock_guard lock(mu_);
    for (size_t i = spare_.size(); i-- > 0 && bufs.size() < layers.size();) {
      if (spare_[i].size() != alloc_bytes) continue;
      spare_bytes_ -= spare_[i].size();
      bufs.push_back(std::move(spare_[i]));
      spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  if (bufs.size() < layers.size()) {
    std::vector<Buffer> fresh =
        alloc_->allocate_group(layers.size() - bufs.size(), alloc_bytes, MemCategory::kKvCache, populate);
    for (Buffer& b : fresh) bufs.push_back(std::move(b));
  }
  out.reserve(layers.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < layers.size(); ++i) {
    auto* c = new KvChunk;
    c->pool = this;
    c->layer = layers[i];
    c->chunk_size = chunk_size;
    c->type = type;
    c->row_bytes = row_bytes;
    c->seq = next_seq_++;
    c->storage = std::move(bufs[i]);
    add_resident(c->layer, static_cast<int64_t>(c->storage.size()));
    by_layer_[static_cast<size_t>(c->layer)].push_back(c);
    out.emplace_back(c);
  }
  return out;
}

KvChunkHandle KvPool::copy(const KvChunk& src) {
  EBB_CHECK_MSG(src.resident(), "copying an evicted KV chunk: restore first");
  std::vector<KvChunkHandle> h = create({src.layer}, src.chunk_size, src.type);
  KvChunk& dst = *h[0];
  // Only the written rows of K and of V.
  const uint64_t n = src.row_bytes * static_cast<uint64_t>(src.rows);
  const uint64_t v_off = src.row_bytes * static_cast<uint64_t>(src.chunk_size);
  std::memcpy(dst.storage.as<uint8_t>(), src.storage.as<const uint8_t>(), n);
  std::memcpy(dst.storage.as<uint8_t>() + v_off, src.storage.as<const uint8_t>() + v_off, n);
  dst.rows = src.rows;
  return std::move(h[0]);
}

Buffer KvPool::take(KvChunk& c) {
  EBB_CHECK(c.resident());
  Buffer b = std::move(c.storage);
  add_resident(c.layer, -static_cast<int64_t>(b.size()));
  return b;
}

void KvPool::put(KvChunk& c, Buffer b) {
  EBB_CHECK(!c.resident() && b.size() >= c.chunk_bytes());
  add_resident(c.layer, static_cast<int64_t>(b.size()));
  c.storage = std::move(b);
  c.meta.state = UnitState::kResident;
}

std::vector<Buffer> KvPool::new_buffers(size_t n, uint64_t bytes) const {
  return alloc_->allocate_group(n, bytes, MemCategory::kKvCache);
}

std::vector<KvChunk*> KvPool::layer_chunks(int64_t layer) const {
  std::lock_guard lock(mu_);
  return by_layer_[static_cast<size_t>(layer)];
}

std::vector<KvChunk*> KvPool::all_chunks() const {
  std::lock_guard lock(mu_);
  std::vector<KvChunk*> out;
  for (const auto& l : by_layer_) out.insert(out.end(), l.begin(), l.end());
  return out;
}

int64_t KvPool::n_chunks() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& l : by_layer_) n += l.size();
  return static_cast<int64_t>(n);
}

uint64_t KvPool::total_bytes() const {
  uint64_t t = 0;
  for (int64_t l = 0; l < shape_.n_layer; ++l) t += layer_bytes(l);
  return t;
}

void KvPool::add_resident(int64_t layer, int64_t delta) {
  resident_bytes_[static_cast<size_t>(layer)] += static_cast<uint64_t>(delta);
  const uint64_t t = total_resident_.fetch_add(static_cast<uint64_t>(delta)) + static_cast<uint64_t>(delta);
  if (delta <= 0) return;
  uint64_t p = peak_resident_.load(std::memory_order_relaxed);
  while (t > p && !peak_resident_.compare_exchange_weak(p, t, std::memory_order_relaxed)) {
  }
}

void KvPool::reset_peak() { peak_resident_.store(total_resident_.load()); }

void KvPool::release(KvChunk* c) {
  // Swap space first; the listener also waits for a restore in flight,
  // which may still be reading into this entry.
  if (listener_) listener_->on_release(*c);
  if (c->resident()) add_resident(c->layer, -static_cast<int64_t>(c->storage.size()));
  {
    std::lock_guard lock(mu_);
    auto& l = by_layer_[static_cast<size_t>(c->layer)];
    l.erase(std::find(l.begin(), l.end(), c));
    const uint64_t n = c->storage.size();
    if (n > 0 && spare_bytes_.load() + n <= spare_limit_.load()) {
      spare_bytes_ += n;
      spare_.push_back(std::move(c->storage));
    }
  }
  delete c;
}

void KvPool::set_spare_limit(uint64_t bytes) {
  std::vector<Buffer> drop;  // unmapped outside the lock
  {
    std::lock_guard lock(mu_);
    spare_limit_ = bytes;
    while (!spare_.empty() && spare_bytes_.load() > bytes) {
      spare_bytes_ -= spare_.back().size();
      drop.push_back(std::move(spare_.back()));
      spare_.pop_back();
    }
  }
}

uint64_t KvPool::release_spare() {
  std::vector<Buffer> drop;
  {
    std::lock_guard lock(mu_);
    drop.swap(spare_);
    spare_bytes_ = 0;
  }
  uint64_t n = 0;
  for (const Buffer& b : drop) n += b.size();
  return n;
}

}  // namespace ebb
