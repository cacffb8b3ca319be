// The prefix cache's persistent tier (DESIGN.md "Prefix cache"): whole
// cached chunks written to storage, one file per radix node, so a new
// process resumes a conversation by reading its KV back instead of
// recomputing it.
//
// A node's file (NODE_ID.kv, NODE_ID = hash of the cache key and every token
// up to the node's end):
//   header   [align_up(sizeof(Header) + chunk_size * 4 + n_layer * 4)]
//            magic, version, the model's fingerprint, the key's hash and
//            adapter digests, geometry, the node's tokens, a CRC-32C per layer
//            and a CRC-32C of the header itself
//   payload  [n_layer][alloc_bytes]: each layer's chunk as it lies in RAM
//            (K rows, then V rows, padded to 4 KiB)
// Reads and writes are direct I/O straight from and into the pool's chunk
// buffers. A file is written under a temporary name and renamed into place,
// so a crash (kill -9) leaves either the whole node or none. A file that is
// truncated, corrupt (any checksum), foreign (another model, key or
// geometry) or holds non-finite KV is deleted and reported, and that KV is
// recomputed: the answer is never wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memory/kv_pool.h"
#include "platform/direct_io.h"

namespace ebb {

struct CacheStoreOptions {
  std::string dir;                 // created when missing
  uint64_t max_bytes = 0;          // files' bytes at most (0: no limit); least recently used go first
  uint64_t model_fingerprint = 0;  // Engine::model_fingerprint()
};

struct CacheStoreStats {
  int64_t written = 0, read = 0;
  int64_t rejected = 0;        // files found invalid and deleted
  int64_t write_failures = 0;  // e.g. a full disk: the node stays in RAM only
  int64_t evicted = 0;         // files deleted for the size limit
  uint64_t bytes_read = 0, bytes_written = 0;
  std::string last_error;      // why the last rejected or failed file was
};

class CacheStore {
 public:
  CacheStore(CacheStoreOptions opts, KvShape shape);
  ~CacheStore();
  CacheStore(const CacheStore&) = delete;
  CacheStore& operator=(const CacheStore&) = delete;

  // The id of the node that ends after `chunk` under a key whose hash is
  // key_hash; chain(): the id after one more chunk of tokens.
  static uint64_t chain(uint64_t prev, std::span<const int32_t> chunk_tokens) ;

  // Writes a node (its chunks, one per layer, all resident and full).
  // Failures (a full disk) are counted and the node stays in RAM only.
  void write(uint64_t node_id, uint64_t key_hash, std::span<const uint64_t> adapter_digests,
             std::span<const int32_t> chunk_tokens, std::span<const KvChunkHandle> kv);
  // Reads a node back into new chunks of `pool`, or nothing when there is
  // no valid file for it.
  std::optional<std::vector<KvChunkHandle>> read(uint64_t node_id, uint64_t key_hash,
                                                 std::span<const int32_t> chunk_tokens, int64_t chunk_size,
                                                 DType type, bool f16_accumulator, KvPool& pool);
  bool contains(uint64_t node_id) const;

  uint64_t bytes() const { return bytes_; }
  const CacheStoreStats& stats() const { return stats_; }
  const std::string& dir() const { return opts_.dir; }

 private:
  std::string path_of(uint64_t node_id) const;
  void reject(const std::string& path, const std::string& why);
  void enforce_limit();

  CacheStoreOptions opts_;
  KvShape shape_;
  std::unique_ptr<IoEngine> io_;
  uint64_t bytes_ = 0;  // of the node files in dir
  CacheStoreStats stats_;
};

}  // namespace ebb
