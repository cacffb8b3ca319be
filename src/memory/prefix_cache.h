// The prefix cache (LOCAL §5.1-§5.4; DESIGN.md "Many sessions"): a radix
// tree over the KV pool whose nodes are whole KV chunks, keyed by
//   (context namespace, adapter set with versions, KV geometry, token ids).
// A lookup returns the longest cached prefix under exactly that key: an
// entry made under another namespace, another adapter, another adapter
// version or another KV chunk size/type is never returned (stale coverage
// is rejected at lookup, not by invalidation sweeps). Reuse shares the
// chunks (no copy), so a hit is bit-exact: the KV is what the producer
// computed.
//
// Retention follows LOCAL §5.2/§5.4. Each node keeps a prefix heat H_P,
// decayed per access (λ = 0.998647, a half-life of 512 accesses) and
// refreshed along matched paths only; each adapter state keeps a heat H_A
// the same way; H_KV = (ε + H_P)(ε + H_A)(1 + α_L min(L, L_max)/L_max) with
// L the prefix length in tokens, and the keep priority
//   Π_keep = H_KV · Ĉ_recompute / max(1, B)
// where Ĉ_recompute is the measured prefill cost of the node's tokens and B
// its bytes (MiB). Over the cache's byte limit, leaves go in ascending
// (Π_keep, -B) order. Chunks that live sessions also hold cost the cache
// nothing and are not counted.
//
// Thread model: used by the thread that owns the engine (between steps).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/tensor.h"
#include "memory/kv_pool.h"

namespace ebb {

class CacheStore;
class KvCache;

// One adapter of a key: name, version, and the digest of that version's
// tensors (so a reload under the same name and version with other bytes is
// another key), and the scale it is applied with.
struct AdapterKey {
  std::string name;
  uint64_t version = 0;
  uint64_t digest = 0;
  float scale = 1.0f;
  bool operator==(const AdapterKey&) const = default;
};

struct CacheKey {
  std::string ns;                    // context namespace ("" by default)
  std::vector<AdapterKey> adapters;  // sorted by name; empty: the base model alone
  int64_t chunk_size = 256;          // KV geometry: only equal geometry shares chunks
  DType kv_type = DType::kF16;
  bool f16_accumulator = false;
  bool operator==(const CacheKey&) const = default;
  uint64_t hash() const;
  // The adapter part alone ("base" when empty), for H_A.
  std::string adapter_state() const;
};

struct PrefixCacheOptions {
  // Bytes of chunks only the cache holds (0: no limit). Entries over it are
  // dropped in ascending keep priority.
  uint64_t max_bytes = 0;
  // LOCAL §7.1's constants.
  double lambda = 0.998647;     // heat decay per access (half-life 512)
  int64_t l_max = 8192;         // cap of the prefix and missing-token terms
  double beta = 0.5;            // weight of the missing-token term d_P
  double chi = 2.0;             // weight of the shared-context term s_P
  double alpha_l = 1.0;         // length bonus of H_KV
  double epsilon = 0.01;
};

struct PrefixHit {
  int64_t n_tokens = 0;                            // matched, whole chunks
  std::vector<std::vector<KvChunkHandle>> chunks;  // [chunk][layer]
};

struct PrefixCacheStats {
  int64_t lookups = 0, hits = 0;
  int64_t hit_tokens = 0;      // tokens served from the cache
  int64_t inserted_chunks = 0;
  int64_t dropped_chunks = 0;  // nodes dropped over the limit
  int64_t rejected_lost = 0;   // nodes dropped because a restore lost their KV
  int64_t read_from_store = 0; // nodes brought back from the persistent tier
};

class PrefixCache {
 public:
  // store (optional): the persistent tier. New full chunks are written to
  // it, and a lookup continues there where RAM ends; chunks read back are
  // taken from `pool`.
  PrefixCache(int64_t n_layer, PrefixCacheOptions opts = {}, CacheStore* store = nullptr, KvPool* pool = nullptr);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The longest cached prefix of `tokens` under `key`, at most max_tokens
  // long (whole chunks). Refreshes heat along the matched path. Nodes whose
  // KV a restore lost are dropped and never returned.
  PrefixHit lookup(const CacheKey& key, std::span<const int32_t> tokens, int64_t max_tokens = INT64_MAX);
  // Records the full chunks of kv that hold tokens[0, n) (n <= kv.n_tokens())
  // under key; chunks already cached stay as they are. Then trims to the
  // byte limit.
  void insert(const CacheKey& key, std::span<const int32_t> tokens, const KvCache& kv);
  // As insert(), for KV that lives elsewhere (a compute device,
  // runtime/device_kv.h): host copies of chunks [first, first +
  // chunks.size()) of tokens, [chunk][layer]. The chunks before `first` must
  // be cached in RAM already (covered()); where one is not, nothing from
  // there on is recorded.
  void insert_chunks(const CacheKey& key, std::span<const int32_t> tokens, int64_t first,
                     std::span<const std::vector<KvChunkHandle>> chunks);

  // Measured prefill cost, seconds per token (an EMA with α = 0.2), the
  // basis of Ĉ_recompute.
  void note_prefill_cost(double seconds_per_token);
  double prefill_cost() const { return sec_per_token_; }

  // Drops leaves in ascending keep priority until the chunks only the cache
  // holds take at most `bytes`. Returns the bytes given back.
  uint64_t trim(uint64_t bytes);
  void set_max_bytes(uint64_t b) { opts_.max_bytes = b; }
  // Forgets every entry of one key (e.g. an adapter version that is gone).
  void drop(const CacheKey& key);
  void clear();

  // Resident bytes of chunks only the cache holds; nodes; all chunk bytes.
  uint64_t private_bytes() const;
  int64_t n_nodes() const;
  const PrefixCacheStats& stats() const { return stats_; }
  const PrefixCacheOptions& options() const { return opts_; }

  // The keep priority of every node, ascending (for tests and the bench).
  struct NodeInfo {
    int64_t depth_tokens;  // prefix length at the node's end
    double heat_prefix, heat_kv, keep;
    uint64_t bytes;
  };
  std::vector<NodeInfo> nodes() const;

  // Hot prefixes, for cache maintenance (stale-coverage prefill, LOCAL
  // §5.3). Reads heat without refreshing it and touches no statistics.
  struct HotPrefix {
    CacheKey key;
    std::vector<int32_t> tokens;  // [n_chunks * chunk_size] from the start of the context
    double heat_kv = 0;           // H_KV of its hottest node (the ranking)
  };
  // Up to k prefixes under the keys `want` accepts, hottest first by H_KV.
  // Only nodes that were reused at least once (H_P > 0) count as hot. The
  // nodes are taken in descending H_KV and a node on the path of a prefix
  // already taken folds into it (the deeper one covers both), so the k
  // prefixes are disjoint paths covering the hottest nodes.
  std::vector<HotPrefix> hot_prefixes(const std::function<bool(const CacheKey&)>& want, size_t k) const;
  // Tokens of `tokens` cached in RAM under `key` (whole chunks), without
  // refreshing heat or reading the persistent tier.
  int64_t covered(const CacheKey& key, std::span<const int32_t> tokens) const;
  // Forgets every entry whose key holds adapter `name` at `version` (0: at
  // any version), whatever its namespace, scale, other adapters or
  // geometry. Returns how many keys were dropped.
  size_t drop_adapter(const std::string& name, uint64_t version = 0);

 private:
  struct Node;
  struct Root;
  double decay(double h, uint64_t last) const;
  double adapter_heat(const std::string& state, bool touch);
  double heat_kv(const Node& n) const;  // H_KV
  double keep_priority(const Node& n) const;
  static Node* find_child(Node& at, std::span<const int32_t> chunk, uint64_t h);
  void remove_leaf(Node* n);
  // insert()'s walk over chunks [0, n_chunks): a missing (or lost) node
  // below `first` ends it; from `first` on, chunk c's handle of layer l is
  // handle(l, c).
  void insert_walk(const CacheKey& key, std::span<const int32_t> tokens, int64_t n_chunks, int64_t first,
                   const std::function<KvChunkHandle(int64_t, int64_t)>& handle);
  Root& root_for(const CacheKey& key);

  int64_t n_layer_;
  PrefixCacheOptions opts_;
  CacheStore* store_ = nullptr;
  KvPool* pool_ = nullptr;
  std::vector<std::unique_ptr<Root>> roots_;
  struct AdapterHeat {
    double heat = 0;
    uint64_t last = 0;
  };
  std::unordered_map<std::string, AdapterHeat> adapter_heat_;
  uint64_t clock_ = 0;  // accesses so far
  double sec_per_token_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace ebb
