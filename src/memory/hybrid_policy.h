// The hybrid-swap eviction policy of mzCache (paper section 4.3, Algorithm 1;
// DESIGN.md "Eviction and restoration"). Pure logic: it decides, step by
// step, what kind of move comes next; the eviction machinery picks the unit
// (backward-out, see eviction_sequence) and performs the move.
//
// Per-unit times from the device profile:
//   t_d   decompress one KV chunk,
//   t_rkv read one raw KV chunk from storage,
//   t_rw  read one weight layer from storage.
// While one weight layer is re-read, the decompression path can restore
// floor(t_rw / t_d) KV chunks, so T = N_W_total * floor(t_rw / t_d) chunks are
// set aside to balance the weight reload. Stages, from the current counts:
//   KVonly  while N_KV > T: KV chunks split between the compressed stack and
//           storage in inverse proportion to t_d and t_rkv;
//   KVandW  while N_KV > 0 and N_W > 0: floor(t_rw / t_d) chunks compressed,
//           then one weight layer dropped, repeating;
//   Wonly   while N_W > 0: drop weight layers;
//   CompKV  move compressed chunks from memory to storage;
//   Done    nothing left to release.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ebb {

enum class EvictStage : uint8_t { kKvOnly, kKvAndW, kWOnly, kCompKv, kDone };
std::string_view evict_stage_name(EvictStage s);  // "KVonly", "KVandW", "Wonly", "CompKV", "done"

// Which unit is taken next. Backward (rearmost layer first) is the paper's
// choice; forward and random exist for the ablation of its Figure 11b.
enum class EvictOrder : uint8_t { kBackward, kForward, kRandom };
std::string_view evict_order_name(EvictOrder o);
EvictOrder parse_evict_order(std::string_view name);  // "backward" | "forward" | "random"; Error otherwise

struct UnitTimes {  // seconds, from the device profile
  double t_d = 0;    // decompress one KV chunk
  double t_rkv = 0;  // read one raw KV chunk from storage
  double t_rw = 0;   // read one weight layer from storage
};

struct PolicyCounts {
  int64_t kv_resident = 0;        // N_KV: KV chunks not yet evicted
  int64_t w_resident = 0;         // N_W: weight layers not yet dropped
  int64_t kv_compressed_mem = 0;  // compressed chunks in the in-memory stack
};

enum class EvictAction : uint8_t {
  kKvToCompressed,       // compress the next KV chunk into the in-memory stack
  kKvToStorage,          // write the next KV chunk raw to the storage swap file
  kDropWeightLayer,      // drop the next weight layer (its backing store is the model file)
  kCompressedToStorage,  // move the oldest compressed chunk from memory to storage
  kNone,                 // nothing left to release
};
std::string_view evict_action_name(EvictAction a);

class HybridSwapPolicy {
 public:
  struct Options {
    // false: no usable swap directory. KV goes only to the compressed stack
    // (compressed_share() == 1) and there is no CompKV stage.
    bool allow_storage = true;
  };

  // Throws ebb::Error when a time is negative or not finite, or a total is negative.
  HybridSwapPolicy(UnitTimes t, int64_t n_kv_total, int64_t n_w_total, Options o);
  HybridSwapPolicy(UnitTimes t, int64_t n_kv_total, int64_t n_w_total)
      : HybridSwapPolicy(t, n_kv_total, n_w_total, Options{}) {}

  // T = N_W_total * chunks_per_layer() (saturating).
  int64_t threshold() const { return threshold_; }
  // floor(t_rw / t_d), at least 1. When t_d == 0 (free decompression) it is
  // capped at kMaxChunksPerLayer, i.e. every KV chunk goes before any layer.
  int64_t chunks_per_layer() const { return chunks_per_layer_; }
  // Fraction of KVonly chunks sent to the compressed stack:
  // t_rkv / (t_d + t_rkv) (0.5 when both are 0; 1 without storage).
  double compressed_share() const { return share_; }
  const UnitTimes& times() const { return times_; }
  const Options& options() const { return opts_; }
  int64_t n_kv_total() const { return n_kv_total_; }
  int64_t n_w_total() const { return n_w_total_; }

  // Algorithm 1's stage for these counts (and a KVandW cycle in progress:
  // its chunks compressed, its layer not yet dropped). One case the paper leaves open,
  // KV left but no weight layer (N_W_total == 0, or counts the caller changed),
  // is treated as KVonly: the split still balances the two KV paths.
  EvictStage stage(const PolicyCounts& c) const;

  // The next move for the current counts. The caller performs it, updates
  // the counts and asks again until it has released enough bytes. KVonly
  // uses error diffusion: after k KVonly moves, the number sent to the
  // compressed stack is round(k * compressed_share()), so the split is within
  // half a chunk of the share at every prefix.
  EvictAction next(const PolicyCounts& c);

  // Restarts from new totals (after a restore, or after the KV grew).
  void reset(int64_t n_kv_total, int64_t n_w_total);

  static constexpr int64_t kMaxChunksPerLayer = int64_t{1} << 40;

 private:
  UnitTimes times_;
  Options opts_;
  double share_ = 0.5;
  int64_t chunks_per_layer_ = 1;
  int64_t n_kv_total_ = 0;
  int64_t n_w_total_ = 0;
  int64_t threshold_ = 0;
  int64_t kvonly_moves_ = 0;       // KVonly moves handed out since reset
  int64_t kvonly_compressed_ = 0;  // ... of which to the compressed stack
  int64_t cycle_compressed_ = 0;   // KVandW chunks compressed since the last layer drop
};

// Unit order for the ablation: a permutation of [0, n) in which units are
// taken. kBackward: n-1, n-2, ..., 0; kForward: 0, 1, ...; kRandom: a
// Fisher-Yates shuffle driven by splitmix64(seed), identical on every
// platform and standard library.
std::vector<int64_t> eviction_sequence(EvictOrder order, int64_t n, uint64_t seed = 1);

}  // namespace ebb
