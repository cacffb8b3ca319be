// Elastic memory (mzCache; DESIGN.md "Eviction and restoration"): evict(bytes)
// gives back at least `bytes` by moving weight layers and KV chunks out of
// RAM — KV into the in-memory compressed stack or a storage swap file, weight
// layers back to their GGUF — in the order and proportions of the hybrid-swap
// policy. Restoration runs forward-in on restore workers and opens a latch per
// layer, so a forward pass (through this class's WeightSource face) starts
// layer i as soon as layer i is whole, overlapping restore with prefill.
//
// Thread model: evict(), restore() and begin_restore() are called between
// requests by the thread that owns the engine; the restore workers only touch
// units of the restore plan, and the forward pass only touches a layer after
// its latch opened.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/kv_codec.h"
#include "memory/compressed_stack.h"
#include "memory/device_profile.h"
#include "memory/hybrid_policy.h"
#include "memory/kv_pool.h"
#include "memory/residency.h"
#include "memory/swap_file.h"
#include "memory/weight_verify.h"
#include "model/model.h"
#include "model/weight_source.h"
#include "platform/direct_io.h"
#include "platform/thread_pool.h"

namespace ebb {

// Which parts of a restore overlap (the paper's Figure 11a).
enum class OverlapMode : uint8_t {
  kNone,           // allocate all, then read all, then decompress, then prefill
  kAllocReload,    // allocation pipelined with reads; prefill waits for all
  kReloadPrefill,  // allocate all first; reads and prefill overlap per layer
  kFull,           // allocation, reads, decompression and prefill all overlap
};
OverlapMode parse_overlap_mode(std::string_view s);  // "none"|"alloc-reload"|"reload-prefill"|"full"
std::string_view overlap_mode_name(OverlapMode m);

// How eviction places units: mzCache's hybrid swap, or the partial-offload
// baseline (whole layers — weights and raw KV — to storage, rearmost first,
// restored sequentially before compute).
enum class EvictPolicyKind : uint8_t { kHybrid, kPartialOffload };

struct ElasticOptions {
  EvictPolicyKind policy = EvictPolicyKind::kHybrid;
  bool parallel_paths = true;    // false: the I/O path, then the decompression path
  std::string swap_dir;          // "": default_swap_dir()
  uint64_t swap_bytes = 0;       // swap file size; 0: the KV of the attached sessions at full context
  KvCodecId codec = KvCodecId::kInt8;
  // true: KV is never compressed (the codecs are lossy); evicted KV goes raw
  // to storage, so answers after a restore are exactly those without one.
  // Without storage KV then stays in RAM. (CLI: --kv-codec none.)
  bool lossless_kv = false;
  EvictOrder order = EvictOrder::kBackward;
  OverlapMode overlap = OverlapMode::kFull;
  bool allow_storage = true;     // false: KV only to the compressed stack
  DeviceProfile profile = DeviceProfile::defaults();
  Isa isa = Isa::kScalar;        // codec target
  uint64_t seed = 1;             // random order
  // Bytes of weights, KV, compressed KV and streaming buffers allowed in RAM
  // (0: no limit). A request that cannot restore everything within it
  // restores the KV and the first layers that fit and streams the rest.
  uint64_t memory_limit = 0;
};

// The I/O engine of eviction and restoration for a profile: its chosen
// request size (at least 1 MiB) and queue depth, deepened to keep at least
// 64 MiB in flight (a restore's reads compete with the prefill for the cores).
IoOptions elastic_io_options(const DeviceProfile& p);

// Bytes by state.
struct ElasticFootprint {
  uint64_t weights_resident = 0;   // layer units in RAM
  uint64_t weights_stored = 0;     // layer units dropped (backed by the GGUF)
  uint64_t kv_resident = 0;        // KV chunks in RAM
  uint64_t compressed = 0;         // compressed stack segments in RAM
  uint64_t kv_stored = 0;          // swap-file slot bytes (raw and compressed chunks)
  uint64_t stream_window = 0;      // weight streaming buffers (over the memory limit)
  uint64_t kv_spare = 0;           // spare KV chunk buffers (KvPool), given back first
  uint64_t in_ram() const { return weights_resident + kv_resident + kv_spare + compressed + stream_window; }
};

struct EvictReport {
  uint64_t requested = 0;
  uint64_t freed = 0;              // bytes the process gave back (ledger delta)
  int64_t kv_to_compressed = 0, kv_to_storage = 0, weights_dropped = 0, compressed_to_storage = 0;
  int64_t adapters_dropped = 0;    // adapter versions whose tensors were dropped (Engine::evict)
  EvictStage last_stage = EvictStage::kDone;
  double seconds = 0;
  std::string note;                // fallbacks and refusals, "" when none
  ElasticFootprint after;
};

struct RestoreReport {
  double seconds = 0;              // begin to last latch
  double alloc_s = 0, read_s = 0, decompress_s = 0;  // busy time of each path
  double stall_s = 0;              // time forward passes waited on layer latches
  uint64_t bytes_read = 0;         // from storage (weights and swap)
  int64_t weights_loaded = 0, chunks_read = 0, chunks_decompressed = 0, chunks_lost = 0;
};

class ElasticMemory final : public WeightSource, public KvPoolListener {
 public:
  // Thread-pool polls before a compute thread sleeps while a restore runs.
  static constexpr int kRestoreSpin = 1000;
  // kv: the engine's KV chunk pool, whose chunks take part in eviction.
  // pool (optional): the engine's compute threads, idle while evict() runs
  // between requests; eviction compresses each KV chunk on all of them.
  ElasticMemory(Model& model, Allocator& alloc, ElasticOptions opts, KvPool* kv, ThreadPool* pool = nullptr);
  ~ElasticMemory() override;
  ElasticMemory(const ElasticMemory&) = delete;
  ElasticMemory& operator=(const ElasticMemory&) = delete;

  // KvPoolListener: a chunk leaves the pool; what it has in swap spaces is
  // dropped (after a restore in flight is done with it).
  void on_release(KvChunk& c) override;

  EvictReport evict(uint64_t bytes);
  // Starts restoring everything evicted (no-op when nothing is); returns at
  // once. Forward passes then wait per layer through acquire_layer().
  void begin_restore();
  // Waits for the restore in flight (if any) and returns its report. Throws
  // the first weight-restore error (e.g. the GGUF changed on disk).
  RestoreReport wait_restored();
  RestoreReport restore() {
    begin_restore();
    return wait_restored();
  }
  bool fully_resident() const;
  // Something was evicted (or the limit changed) since the last restore
  // began: the next request must start one. Cheap, so it can be asked per token.
  bool restore_pending() const { return restore_pending_; }
  bool restoring() const { return restoring_.load(); }

  ElasticFootprint footprint() const;
  ResidencyMap residency() const;
  const ElasticOptions& options() const { return opts_; }
  void set_overlap(OverlapMode m) { opts_.overlap = m; }
  void set_order(EvictOrder o) { opts_.order = o; }
  void set_policy(EvictPolicyKind p) { opts_.policy = p; }
  void set_parallel_paths(bool on) { opts_.parallel_paths = on; }
  UnitTimes unit_times() const;
  // For fault-injection tests: the swap file (nullptr before first use).
  SwapFile* swap_file() { return swap_.get(); }

  // Two regimes in one engine (issue 5): sets the limit and evicts down to it
  // now when memory holds more. Raising it lets the next request restore all.
  EvictReport set_memory_limit(uint64_t bytes);
  uint64_t memory_limit() const { return opts_.memory_limit; }
  // KV the running sessions may still grow to in all (their prompts and
  // max_tokens; the scheduler's admission sets it). A restore under the
  // limit leaves room for what of it is not yet in RAM, so weights brought
  // back are not then pushed past the limit by KV growth.
  void set_kv_reserve(uint64_t bytes) { kv_reserve_ = bytes; }
  uint64_t kv_reserve() const { return kv_reserve_; }
  // Some weight layers are served by streaming (the limit did not let them back).
  bool streaming() const { return streaming_; }

  // WeightSource: globals stay resident; a layer waits for its latch, and a
  // layer left out by the limit is streamed through two window slots.
  void begin_pass(std::span<const int32_t> tokens) override;
  LayerWeights acquire_layer(int l) override;
  void release_layer(int l) override;
  MatrixRow embedding_row(int32_t t) override { return globals_.embedding_row(t); }
  GlobalWeights acquire_head() override { return globals_.acquire_head(); }

 private:
  using ChunkId = KvChunk*;
  struct LayerPlan;  // elastic_restore.cpp
  // One latch per layer: open when both restore paths are done with it.
  struct Latches {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int> pending;         // [layer] paths still working on it
    std::vector<std::string> error;   // [layer] why its weights could not be restored
    std::string first_error;
  
    void open(int layer, const std::string& err = {}) {
      std::lock_guard lock(mu);
      if (!err.empty() && error[layer].empty()) error[layer] = err;
      if (!err.empty() && first_error.empty()) first_error = err;
      --pending[layer];
      cv.notify_all();
    }
    void wait(int layer) {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return pending[layer] <= 0; });
    }
  };


  // eviction (elastic_evict.cpp)
  bool ensure_swap(std::string* why);
  std::string swap_full_text() const;  // why an allocation in the swap file failed
  void kv_to_compressed(const ChunkId& c);
  bool kv_to_storage(const ChunkId& c, std::string* why);
  void drop_weights(int layer);
  bool compressed_to_storage(std::string* why);
  std::vector<ChunkId> kv_order(bool resident) const;
  int next_weight_layer() const;
  static KvChunkShape chunk_shape(const KvChunk& c);  // its written rows
  static KvChunkShape chunk_shape_n(const KvChunk& c, int64_t n_tokens);
  int swap_fd() const;
  void flush_writes();
  void evict_partial_offload(uint64_t bytes, EvictReport& r, const std::function<int64_t()>& freed);

  // streaming under the memory limit (elastic_stream.cpp)
  struct StreamSlot {
    Buffer buf;
    int layer = -1;
    IoEngine::Ticket ticket = 0;
    bool pending = false;  // read in flight
    bool in_use = false;   // handed to the forward pass
  };
  StreamSlot stream_[2];
  std::vector<IoRequest> stream_reqs_;  // reused: no allocation per streamed layer
  bool streaming_ = false;
  uint64_t kv_reserve_ = 0;  // set_kv_reserve()
  uint64_t max_unit_bytes() const;
  int next_streamed_after(int layer) const;
  void stream_submit(StreamSlot& s, int layer);
  // Waits for a slot's read, converts and verifies it; a failed read or
  // check leaves the slot empty (never holding an unread buffer) and throws.
  void stream_wait(StreamSlot& s);
  void stream_forget(StreamSlot& s);  // waits (ignoring errors) and empties the slot
  void stream_prefetch();
  void stop_streaming();

  // restoration (elastic_restore.cpp)
  // Bytes of reads queued ahead of the layer being completed: about a tenth
  // of a second of a phone's or laptop's storage, so the disk never waits on
  // the restore thread, yet far layers' staging buffers do not all exist at once.
  static constexpr uint64_t kReadAhead = uint64_t{256} << 20;
  void run_restore(std::vector<LayerPlan> plan);
  void io_path(std::vector<LayerPlan>& plan, bool open_latches);
  void decompress_path(std::vector<LayerPlan>& plan, bool open_latches);
  // Puts a restored chunk back; when !ok it is zeroed and marked lost.
  bool put_restored(const ChunkId& c, Buffer b, bool ok);

  Model& model_;
  ResidentWeights globals_;  // the embedding and head always stay resident
  Allocator& alloc_;
  ElasticOptions opts_;
  ThreadPool* pool_;                 // may be null
  std::unique_ptr<IoEngine> io_;
  DirectFile gguf_;                  // the model file, for direct reads of weights
  WeightChecksums weight_crc_;       // of each layer as loaded: restored and streamed layers are checked
  std::unique_ptr<SwapFile> swap_;
  bool swap_failed_ = false;
  std::string swap_error_;
  CompressedStack stack_;
  KvPool* kv_;
  // Pending swap writes of this eviction: tickets and the chunks they read from.
  struct PendingWrite {
    IoEngine::Ticket ticket;
    Buffer src;               // the raw chunk, or the compressed blob's copy
    ChunkId id;
    bool compressed = false;  // a blob from the compressed stack
  };
  int64_t write_failures_ = 0;
  std::mutex owner_mu_;
  std::unordered_map<CompressedStack::Handle, ChunkId> blob_owner_;  // compressed blob -> its chunk
  std::vector<PendingWrite> pending_;
  uint64_t pending_bytes_ = 0;
  // Restore in flight.
  std::unique_ptr<Latches> latches_;
  std::thread restore_thread_;
  std::atomic<bool> restoring_{false};
  RestoreReport last_restore_;
  bool restore_pending_ = false;
};

}  // namespace ebb
