// The KV cache of one session, per layer, in chunks of chunk_size tokens
// (DESIGN.md "KV chunks"). Chunks are allocated as the context grows; each
// layer has a chunk table that attention streams in order. Bookkeeping (how
// many positions are filled) is kept apart from the chunk storage.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/attention.h"
#include "memory/compressed_stack.h"
#include "memory/residency.h"
#include "memory/swap_file.h"
#include "kernels/tensor.h"
#include "platform/allocator.h"

namespace ebb {

struct KvCacheOptions {
  int64_t chunk_size = 256;    // tokens per chunk
  DType type = DType::kF16;    // kF16 or kF32
  int64_t max_tokens = 4096;   // context limit of the session
  // kF16 only: attention over this cache in the reference engine's half
  // precision (AttentionArgs::f16_accumulator) instead of F32.
  bool f16_accumulator = false;
};

struct KvShape {
  int64_t n_layer = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

// Where an evicted chunk went (bookkeeping only; storage is separate).
struct KvChunkMeta {
  UnitState state = UnitState::kResident;
  SwapSlot slot;                    // kStored, kStoredCompressed
  CompressedStack::Handle handle = 0;  // kCompressed
  uint64_t compressed_bytes = 0;    // kCompressed, kStoredCompressed
  int64_t n_tokens = 0;             // valid rows when evicted
};

class KvCache {
 public:
  KvCache(KvShape shape, KvCacheOptions opts, Allocator* alloc);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvShape& shape() const { return shape_; }
  const KvCacheOptions& options() const { return opts_; }

  // Positions [0, n_tokens()) hold valid K and V in every layer.
  int64_t n_tokens() const { return n_tokens_; }
  void set_n_tokens(int64_t n);

  // Makes sure every layer has chunks for positions [0, n). Throws when n
  // exceeds max_tokens or memory runs out.
  void reserve(int64_t n);
  // Drops positions >= n; frees chunks that become empty.
  void truncate(int64_t n);

  // Row of one position: [n_kv_heads, head_dim] elements of type().
  void* k_row(int64_t layer, int64_t pos);
  void* v_row(int64_t layer, int64_t pos);
  // The layer's chunk table (n_chunks(layer) entries).
  const KvChunkRef* chunks(int64_t layer) const { return tables_[layer].data(); }
  int64_t n_chunks(int64_t layer) const { return static_cast<int64_t>(n_alloc_[layer]); }

  // Bytes of one chunk (K and V) and of one token row (K or V).
  uint64_t chunk_bytes() const { return 2 * row_bytes_ * opts_.chunk_size; }
  // A chunk's allocation: whole 4 KiB pages, page aligned (direct I/O).
  uint64_t chunk_alloc_bytes() const { return (chunk_bytes() + 4095) & ~uint64_t{4095}; }
  uint64_t row_bytes() const { return row_bytes_; }
  // Resident chunk bytes.
  uint64_t layer_bytes(int64_t layer) const { return n_resident_[layer].load() * chunk_alloc_bytes(); }
  uint64_t total_bytes() const;

  // Elastic memory: a chunk's storage can be taken out (eviction) and put
  // back (restore). While out, its table entry is null and meta() says where
  // it went. Positions of chunk c: [c * chunk_size, (c + 1) * chunk_size).
  bool chunk_resident(int64_t layer, int64_t chunk) const { return !storage_[layer][chunk].empty(); }
  Buffer take_chunk(int64_t layer, int64_t chunk);
  // n chunk buffers in one mapping (huge pages when it is large enough); each
  // is freed on its own. Restoration allocates a layer's chunks this way.
  std::vector<Buffer> new_chunk_buffers(size_t n) const;
  void put_chunk(int64_t layer, int64_t chunk, Buffer b);
  KvChunkMeta& meta(int64_t layer, int64_t chunk) { return meta_[layer][chunk]; }
  const KvChunkMeta& meta(int64_t layer, int64_t chunk) const { return meta_[layer][chunk]; }
  bool all_resident() const;
  // Valid rows of chunk c.
  int64_t chunk_tokens(int64_t chunk) const;

  // The first position whose KV could not be restored (n_tokens() when all
  // is well). The session recomputes from there.
  int64_t lost_from() const { return lost_from_; }
  void mark_lost(int64_t pos) { lost_from_ = std::min(lost_from_, pos); }
  void clear_lost() { lost_from_ = INT64_MAX; }

  // Raw storage of one chunk: K rows then V rows, chunk_bytes() in total.
  uint8_t* chunk_data(int64_t layer, int64_t chunk) { return storage_[layer][chunk].as<uint8_t>(); }

 private:
  KvShape shape_;
  KvCacheOptions opts_;
  Allocator* alloc_;
  uint64_t row_bytes_ = 0;
  int64_t n_tokens_ = 0;
  std::vector<std::vector<Buffer>> storage_;     // [layer][chunk]
  std::vector<std::vector<KvChunkRef>> tables_;  // [layer][chunk], capacity for max_tokens
  std::vector<size_t> n_alloc_;                  // chunks in use per layer (resident or evicted)
  std::vector<std::vector<KvChunkMeta>> meta_;   // [layer][chunk]
  // Resident chunks per layer; atomic: restore paths put chunks of one layer concurrently.
  std::unique_ptr<std::atomic<uint64_t>[]> n_resident_;
  int64_t lost_from_ = INT64_MAX;
};

}  // namespace ebb
