// The KV chunk pool (DESIGN.md "Many sessions"): every KV chunk of every
// session is a pool entry with a reference count. A session's KV is a table
// of handles (KvCache); the prefix cache holds handles too. A full chunk is
// immutable and shared by any number of holders; a holder that must write
// into a chunk someone else also holds copies it first (KvCache does this).
// Elastic memory walks the pool, not the sessions, so a shared chunk is
// compressed, stored and restored once, and counted once.
//
// Thread model: entries are created and released by the thread that owns the
// engine; restore workers only move the storage of existing entries in and
// out (put/take), and the per-layer byte counters are atomic for them.
#pragma once

#include <atomic>
#include <cstdint>
#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/tensor.h"
#include "memory/compressed_stack.h"
#include "memory/residency.h"
#include "memory/swap_file.h"
#include "platform/allocator.h"

namespace ebb {

struct KvShape {
  int64_t n_layer = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

// Where an evicted chunk went (bookkeeping only; storage is separate).
struct KvChunkMeta {
  UnitState state = UnitState::kResident;
  SwapSlot slot;                       // kStored, kStoredCompressed
  CompressedStack::Handle handle = 0;  // kCompressed
  uint64_t compressed_bytes = 0;       // kCompressed, kStoredCompressed
  int64_t n_tokens = 0;                // valid rows when evicted
};

class KvPool;

// One pool entry: K and V of chunk_size positions of one layer.
//   storage: [2, chunk_size, n_kv_heads, head_dim] of `type` (K rows, then V
//            rows), padded to whole 4 KiB pages; empty while evicted.
struct KvChunk {
  KvPool* pool = nullptr;
  int32_t layer = 0;
  int64_t chunk_size = 0;
  DType type = DType::kF16;
  uint64_t row_bytes = 0;    // one token's K (or V) row
  uint64_t seq = 0;          // creation order, for a stable eviction order
  Buffer storage;
  KvChunkMeta meta;
  // Rows [0, rows) hold K and V written by some holder. A holder only reads
  // the rows below its own token count.
  int64_t rows = 0;
  std::atomic<int32_t> refs{0};
  // Set when a restore could not bring the chunk back (checksum, read or
  // decode failure): its contents are zeros and every holder recomputes it.
  std::atomic<bool> lost{false};

  bool resident() const { return !storage.empty(); }
  uint64_t chunk_bytes() const { return 2 * row_bytes * static_cast<uint64_t>(chunk_size); }
  uint64_t alloc_bytes() const { return (chunk_bytes() + 4095) & ~uint64_t{4095}; }
  KvChunkRef ref() {
    if (!resident()) return {};
    uint8_t* base = storage.as<uint8_t>();
    return KvChunkRef{base, base + row_bytes * static_cast<uint64_t>(chunk_size)};
  }
};

// Owning reference to a pool entry; the entry returns to the pool when the
// last handle goes. Copying a handle shares the chunk (no data is copied).
class KvChunkHandle {
 public:
  KvChunkHandle() = default;
  explicit KvChunkHandle(KvChunk* c) : c_(c) {
    if (c_) c_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  KvChunkHandle(const KvChunkHandle& o) : KvChunkHandle(o.c_) {}
  KvChunkHandle(KvChunkHandle&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  KvChunkHandle& operator=(KvChunkHandle o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  ~KvChunkHandle() { reset(); }
  void reset();

  KvChunk* get() const { return c_; }
  KvChunk* operator->() const { return c_; }
  KvChunk& operator*() const { return *c_; }
  explicit operator bool() const { return c_ != nullptr; }
  // More than one holder: writing needs a private copy first.
  bool shared() const { return c_ && c_->refs.load(std::memory_order_relaxed) > 1; }

 private:
  KvChunk* c_ = nullptr;
};

// Told when an entry leaves the pool, before its storage goes, so that swap
// space holding it (a compressed blob, a swap slot) is freed and no restore
// still writes into it.
class KvPoolListener {
 public:
  virtual void on_release(KvChunk& c) = 0;
  virtual ~KvPoolListener() = default;
};

class KvPool {
 public:
  KvPool(KvShape shape, Allocator* alloc);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvShape& shape() const { return shape_; }
  Allocator* allocator() const { return alloc_; }
  void set_listener(KvPoolListener* l) { listener_ = l; }

  // New resident chunks of `layers[i]`, all in one mapping (huge pages when
  // large enough; each is freed on its own). populate: fault the pages in now.
  std::vector<KvChunkHandle> create(const std::vector<int32_t>& layers, int64_t chunk_size, DType type,
                                    bool populate = false);
  // A private copy of a chunk (copy-on-write). c must be resident.
  KvChunkHandle copy(const KvChunk& c);

  // Elastic memory moves an entry's storage out and back.
  Buffer take(KvChunk& c);
  void put(KvChunk& c, Buffer b);
  // n chunk buffers of `bytes` in one mapping (restoration).
  std::vector<Buffer> new_buffers(size_t n, uint64_t bytes) const;

  // Every live entry of a layer, in creation order.
  std::vector<KvChunk*> layer_chunks(int64_t layer) const;
  // Every live entry: layer by layer, each in creation order.
  std::vector<KvChunk*> all_chunks() const;
  int64_t n_chunks() const;

  // Resident chunk bytes (whole pages), per layer and in all.
  uint64_t layer_bytes(int64_t layer) const { return resident_bytes_[static_cast<size_t>(layer)].load(); }
  uint64_t total_bytes() const;
  // The most resident chunk bytes at any moment since reset_peak() (or the
  // pool's creation), and resetting it to what is resident now.
  uint64_t peak_bytes() const { return peak_resident_.load(); }
  void reset_peak();

  // Spare chunk buffers. With a limit above zero, the storage of a resident
  // entry that leaves the pool is kept (up to the limit in all) and handed
  // to the next entries of its size, instead of being unmapped and faulted
  // in again: requests come and go on a server, and a new session's first
  // chunks (28 MiB for Qwen3-0.6B at 256 positions) cost about 47 ms to
  // fault in on a guest whose freed pages go back to the host, against
  // nothing when reused. Spare bytes stay in the ledger (as KV) and are the
  // first memory elastic eviction gives back. Off (0) by default.
  void set_spare_limit(uint64_t bytes);  // releases what is over the new limit
  uint64_t spare_limit() const { return spare_limit_.load(std::memory_order_relaxed); }
  uint64_t spare_bytes() const { return spare_bytes_.load(std::memory_order_relaxed); }
  // Unmaps every spare buffer; returns the bytes given back.
  uint64_t release_spare();

  // Bytes the KV of every session could reach at its full context: what a
  // swap file must be able to take. Sessions register their share.
  void add_capacity(int64_t bytes) { capacity_bytes_ += bytes; }
  uint64_t capacity_bytes() const { return static_cast<uint64_t>(std::max<int64_t>(0, capacity_bytes_.load())); }

 private:
  friend class KvChunkHandle;
  void release(KvChunk* c);
  void add_resident(int64_t layer, int64_t delta);  // the per-layer, total and peak counts

  KvShape shape_;
  Allocator* alloc_;
  KvPoolListener* listener_ = nullptr;
  mutable std::mutex mu_;                        // guards the entry lists
  std::vector<std::vector<KvChunk*>> by_layer_;  // [layer] live entries, creation order
  std::unique_ptr<std::atomic<uint64_t>[]> resident_bytes_;  // [layer]
  std::atomic<int64_t> capacity_bytes_{0};
  std::atomic<uint64_t> total_resident_{0}, peak_resident_{0};
  uint64_t next_seq_ = 0;
  std::vector<Buffer> spare_;  // guarded by mu_; released entries' storage
  std::atomic<uint64_t> spare_limit_{0}, spare_bytes_{0};
};

}  // namespace ebb
