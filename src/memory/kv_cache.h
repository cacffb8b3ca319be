// The KV cache of one session, per layer, in chunks of chunk_size tokens
// (DESIGN.md "KV chunks"). Chunks are allocated as the context grows; each
// layer has a chunk table that attention streams in order. Bookkeeping (how
// many positions are filled) is kept apart from the chunk storage.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/tensor.h"
#include "platform/allocator.h"

namespace ebb {

struct KvCacheOptions {
  int64_t chunk_size = 256;    // tokens per chunk
  DType type = DType::kF16;    // kF16 or kF32
  int64_t max_tokens = 4096;   // context limit of the session
};

struct KvShape {
  int64_t n_layer = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
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
  uint64_t row_bytes() const { return row_bytes_; }
  uint64_t layer_bytes(int64_t layer) const { return n_alloc_[layer] * chunk_bytes(); }
  uint64_t total_bytes() const;

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
  std::vector<size_t> n_alloc_;                  // chunks allocated per layer
};

}  // namespace ebb
