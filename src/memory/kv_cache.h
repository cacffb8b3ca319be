// The KV cache of one session: per layer, a table of chunk handles into the
// engine's KV pool (DESIGN.md "KV chunks", "Many sessions"), plus how many
// positions are filled. Chunks are taken from the pool as the context grows;
// attention streams a layer's chunks in order. Bookkeeping (positions) is
// kept apart from chunk storage (the pool). Full chunks may be shared with
// other sessions and the prefix cache; a chunk is copied before this session
// writes into it while someone else holds it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "kernels/tensor.h"
#include "memory/kv_pool.h"
#include "platform/allocator.h"

namespace ebb {

struct KvCacheOptions {
  int64_t chunk_size = 256;    // tokens per chunk
  DType type = DType::kF16;    // kF16 or kF32
  int64_t max_tokens = 4096;   // context limit of the session
  // kF16 only: attention over this cache in the reference engine's half
  // precision (AttentionArgs::f16_accumulator) instead of F32.
  bool f16_accumulator = false;
  // Where each layer's rows live. Layers [0, host_layers) keep them here, in
  // chunks from the pool; the rows of layers [host_layers, n_layer) live on
  // a compute device (runtime/device_forward.h), and for them this cache
  // keeps only the positions (no chunk is taken from the pool). -1: every
  // layer here (the CPU); 0: every layer on the device; between: a split of
  // the layers (-ngl N: the first layers on the CPU, the last N on the GPU).
  int64_t host_layers = -1;
};

class KvCache {
 public:
  KvCache(KvPool& pool, KvCacheOptions opts);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvShape& shape() const { return pool_.shape(); }
  const KvCacheOptions& options() const { return opts_; }
  KvPool& pool() const { return pool_; }
  // Layers [0, n_host_layers()) hold their rows here (KvCacheOptions::host_layers).
  int64_t n_host_layers() const { return n_host_; }
  bool on_host(int64_t layer) const { return layer < n_host_; }
  // Every layer's rows are here (the KV can be shared, adopted, saved).
  bool all_on_host() const { return n_host_ == shape().n_layer; }

  // Positions [0, n_tokens()) hold valid K and V in every layer.
  int64_t n_tokens() const { return n_tokens_; }
  void set_n_tokens(int64_t n);

  // Makes positions [n_tokens(), n) writable in every layer: chunks are
  // taken from the pool where missing, and a chunk someone else also holds
  // is replaced by a private copy. Throws when n exceeds max_tokens or
  // memory runs out (the cache is then unchanged in what it holds).
  void reserve(int64_t n);
  // Drops positions >= n; lets go of chunks that become empty.
  void truncate(int64_t n);

  // Row of one position: [n_kv_heads, head_dim] elements of type().
  void* k_row(int64_t layer, int64_t pos);
  void* v_row(int64_t layer, int64_t pos);
  // The layer's chunk table for attention (n_chunks(layer) entries; null
  // pointers for evicted chunks). Valid until the table changes.
  const KvChunkRef* chunks(int64_t layer) const;
  int64_t n_chunks(int64_t layer) const { return static_cast<int64_t>(tables_[layer].size()); }
  KvChunk& chunk(int64_t layer, int64_t c) const { return *tables_[layer][c]; }
  const KvChunkHandle& handle(int64_t layer, int64_t c) const { return tables_[layer][c]; }

  // Bytes of one chunk (K and V) and of one token row (K or V).
  uint64_t chunk_bytes() const { return 2 * row_bytes_ * opts_.chunk_size; }
  // A chunk's allocation: whole 4 KiB pages, page aligned (direct I/O).
  uint64_t chunk_alloc_bytes() const { return (chunk_bytes() + 4095) & ~uint64_t{4095}; }
  uint64_t row_bytes() const { return row_bytes_; }
  // Resident bytes of the chunks this cache holds (shared ones included).
  uint64_t layer_bytes(int64_t layer) const;
  uint64_t total_bytes() const;

  bool chunk_resident(int64_t layer, int64_t c) const { return tables_[layer][c]->resident(); }
  KvChunkMeta& meta(int64_t layer, int64_t c) { return tables_[layer][c]->meta; }
  const KvChunkMeta& meta(int64_t layer, int64_t c) const { return tables_[layer][c]->meta; }
  bool all_resident() const;
  // Valid rows of chunk c for this cache.
  int64_t chunk_tokens(int64_t c) const;
  // Raw storage of one chunk: K rows then V rows, chunk_bytes() in total.
  uint8_t* chunk_data(int64_t layer, int64_t c) { return tables_[layer][c]->storage.as<uint8_t>(); }

  // The first position whose KV could not be restored (n_tokens() when all
  // is well): a chunk held here was marked lost. The session recomputes
  // from there.
  int64_t lost_from() const;

  // Sharing. Takes the chunks of `other` that hold positions [0, n) (every
  // host layer; no data is copied) in place of what this cache held;
  // n_tokens() becomes n. Same chunk size, type and host layers (the device
  // layers' rows are the device's to copy: DeviceForward::copy_kv).
  void share_from(const KvCache& other, int64_t n);
  // Takes whole chunks: chunks[c][layer] for c < chunks.size(), positions
  // [0, chunks.size() * chunk_size); n_tokens() becomes that. Only the host
  // layers' chunks are taken (every layer's on the CPU; a split's device
  // layers go up through upload_kv_chunks, runtime/device_kv.h).
  void adopt(std::span<const std::vector<KvChunkHandle>> chunks);

 private:
  KvPool& pool_;
  KvCacheOptions opts_;
  uint64_t row_bytes_ = 0;
  int64_t n_host_ = 0;  // layers whose rows are here; tables_ of the others stay empty
  int64_t n_tokens_ = 0;
  int64_t capacity_share_ = 0;                         // registered with the pool
  std::vector<std::vector<KvChunkHandle>> tables_;     // [layer][chunk]
  mutable std::vector<std::vector<KvChunkRef>> refs_;  // [layer][chunk], refreshed by chunks()
};

}  // namespace ebb
