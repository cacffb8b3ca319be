// The engine: a model, its memory (allocator + ledger), the thread pool, the
// chosen kernel target and the planned forward pass. Sessions run on it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "memory/budget_plan.h"
#include "memory/elastic.h"
#include "memory/kv_pool.h"
#include "memory/mmap_weights.h"
#include "memory/cache_store.h"
#include "memory/prefix_cache.h"
#include "model/model.h"
#include "platform/allocator.h"
#include "platform/thread_pool.h"
#include "backend/backend.h"
#include "runtime/adapters.h"
#include "runtime/device_forward.h"
#include "runtime/device_plan.h"
#include "runtime/forward.h"

namespace ebb {

class Session;

// The KV chunk a context of n_ctx tokens gets by default: 256 tokens, or
// less for a small context — the largest power of two <= n_ctx / 4, at
// least 16 — so the prefix cache (whose granularity is the chunk) can reuse
// a shared prefix there too.
int64_t default_kv_chunk_size(int64_t n_ctx);

struct EngineOptions {
  std::string model_path;
  int n_threads = 0;            // 0: all hardware threads
  // Where the forward pass runs: "cpu", "vulkan" (the first Vulkan device)
  // or "vulkan:N". On a device, the weights and every session's KV live in
  // its memory (runtime/device_forward.h); evict()/restore() move its weight
  // layers; a memory limit caps device and host memory together
  // (set_memory_limit); LoRA adapters apply there (uploaded per version);
  // budget mode stays CPU-only for now (refused with a message). The prefix cache keeps its chunks on the
  // host: a device session reads the chunks it publishes back and uploads
  // the ones it reuses (runtime/device_kv.h); not on a split yet.
  // "" is "cpu".
  std::string device = "cpu";
  // Layers on the device (llama.cpp's -ngl; runtime/device_plan.h): -1
  // auto, the most that fit device_memory; N >= n_layers all; 0 < N <
  // n_layers a split: the first n_layers - N layers (weights and KV) on the
  // CPU, the last N and the output head on the device.
  int n_gpu_layers = -1;
  // The device memory -ngl auto fills (0: what the device reports).
  uint64_t device_memory = 0;
  // Tokens of KV per layer -ngl auto keeps room for (0: min(training context, 4096)).
  int64_t device_context = 0;
  // A device the caller opened (must outlive the engine; its id is used in
  // place of `device`): tests read its ledger after the engine has gone.
  Backend* backend = nullptr;
  std::optional<Isa> isa;       // force a (lower) kernel target; default: best supported
  int64_t prefill_batch = 64;   // tokens per prefill micro-batch
  // Default KV chunk size of sessions (tokens); 0: each session's adapts to
  // its context (default_kv_chunk_size), so a small context still has
  // several chunks for the prefix cache to share. options() reports the
  // chunk of a session with the default context.
  int64_t kv_chunk_size = 0;
  BudgetOptions budget;         // budget mode (FlexInfer) when budget.budget > 0
  bool elastic = true;          // elastic memory (evict/restore); off in budget mode
  // The OS-paging baseline (DESIGN.md, "Eviction and restoration"): layer
  // weights are served from a read-only mapping of the GGUF (MmapWeights),
  // whose pages the kernel reclaims and faults back in. Needs elastic off and
  // no budget; `ebb bench ttft` compares elastic memory with it.
  bool os_paging = false;
  ElasticOptions elastic_opts;  // its isa is set to the engine's target
  // The prefix cache: sessions reuse the KV of cached prefixes (same
  // namespace, adapters and tokens) instead of recomputing it.
  bool prefix_cache = false;
  PrefixCacheOptions prefix_cache_opts;
  // The prefix cache's persistent tier ("": none): full chunks are written
  // there and read back by a later process (needs prefix_cache).
  std::string cache_dir;
  uint64_t cache_dir_bytes = 0;  // 0: no limit
  // Called while the weights are read, with bytes read and the total (see
  // ModelOptions::progress); a command line shows it.
  std::function<void(uint64_t done, uint64_t total)> load_progress;
};

// Bytes by category, equal to what went through the engine's allocator.
struct Footprint {
  std::vector<uint64_t> weights_per_layer;  // resident bytes of each layer unit
  uint64_t globals = 0;                     // embedding, output norm, output head
  std::vector<uint64_t> kv_per_layer;       // resident KV chunk bytes per layer (the pool: shared chunks once)
  uint64_t kv_spare = 0;                    // spare KV chunk buffers, kept for the next sessions (KvPool)
  uint64_t scratch = 0;                     // planned work buffers
  uint64_t compressed = 0;                  // compressed KV stack (elastic memory)
  uint64_t io_buffers = 0;                  // direct-I/O staging and streaming windows
  uint64_t kv_stored = 0;                   // KV in swap files (not in RAM)
  uint64_t weights_stored = 0;              // dropped weight layers (backed by the GGUF, not in RAM)
  uint64_t adapters = 0;                    // LoRA adapter tensors (every version still held)
  uint64_t adapters_stored = 0;             // evicted adapter versions (backed by their files, not in RAM)
  uint64_t training = 0;                    // a trainer's activations, gradients and optimizer state
  uint64_t kv_parked = 0;                   // a device's session KV that evict() read back to the host (RAM)
  // What a compute device holds (the engine runs there): its weights, KV and
  // scratch, apart from the host bytes above. Empty on the CPU.
  std::optional<DeviceFootprint> device;
  uint64_t weights() const;
  uint64_t kv() const;
  uint64_t total() const {
    return weights() + globals + kv() + kv_spare + scratch + compressed + io_buffers + adapters + training +
           kv_parked;
  }
};

class Engine {
 public:
  explicit Engine(const EngineOptions& opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineOptions& options() const { return opts_; }
  // The KV chunk of a session of n_ctx tokens that asks for none: the
  // engine's kv_chunk_size when one was given, else default_kv_chunk_size.
  int64_t session_chunk_size(int64_t n_ctx) const {
    return adaptive_chunk_ ? default_kv_chunk_size(n_ctx) : opts_.kv_chunk_size;
  }
  Model& model() { return *model_; }
  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return model_->tokenizer(); }
  const ModelConfig& config() const { return model_->config(); }
  ThreadPool& pool() { return pool_; }
  Allocator& allocator() { return alloc_; }
  const Ledger& ledger() const { return ledger_; }
  Forward& forward() { return *forward_; }
  // Every session's KV chunks (and the prefix cache's) live here.
  KvPool& kv_pool() { return *kv_pool_; }
  // nullptr when off.
  PrefixCache* prefix_cache() { return prefix_cache_.get(); }
  CacheStore* cache_store() { return cache_store_.get(); }
  // LoRA adapters: load, stage, publish, unload; sessions bind them.
  AdapterRegistry& adapters() { return *adapters_; }
  const AdapterRegistry& adapters() const { return *adapters_; }
  Isa isa() const { return isa_; }
  // The device the forward pass runs on (nullptr: the CPU).
  DeviceForward* device() const { return device_.get(); }
  // Which layers run on the device (nullptr on the CPU).
  const DevicePlan* device_plan() const { return device_ ? &device_plan_ : nullptr; }
  // "cpu" or the device's id ("vulkan:0").
  std::string device_id() const { return device_ ? device_->device().id : "cpu"; }

  // Where forward passes take their weights: nullptr while every unit is
  // resident, else elastic restore's latches or budget mode's streamer (on
  // a device: the GGUF's mapping, for training; the device's steps ignore it).
  WeightSource* weight_source() const { return weight_source_; }
  // The OS-paging baseline's mapping (options().os_paging), or on a device
  // the mapping training reads the base weights from; else nullptr.
  MmapWeights* mmap_weights() { return mmap_weights_.get(); }

  // Budget mode: the source that streams weights (nullptr when off).
  WeightSource* budget_source() const { return budget_source_.get(); }

  Footprint footprint() const;

  // Elastic memory (nullptr in budget mode or when off).
  ElasticMemory* elastic() { return elastic_.get(); }
  // Gives back at least `bytes`: first the tensors of adapter versions no
  // turn holds (sessions between turns unpin theirs; AdapterRegistry::
  // evict_unused), then KV and weights (ElasticMemory::evict) for the rest.
  // Adapters go first: dropping one writes nothing (its file backs it), and
  // it is read back (a few MB, like one weight layer) only when a turn binds
  // it, while every later step needs the weights and its session's KV.
  // Between requests only, as ElasticMemory::evict. restore() leaves evicted
  // adapters to be restored on use (the next turn that binds them).
  EvictReport evict(uint64_t bytes);
  // Restores everything evicted, waiting for it.
  RestoreReport restore();
  // Caps weights + KV + compressed KV + streaming buffers in RAM (0: no cap),
  // evicting down to it now; requests over it stream weight layers. On a
  // device it caps what the engine holds on the device and the host
  // together (DeviceForward::set_memory_limit: weights, KV, parked KV,
  // output head, scratch), dropping device layers now; steps restore the
  // layers that fit and stream the rest; a limit no step could run under
  // is refused naming the sizes.
  EvictReport set_memory_limit(uint64_t bytes);
  uint64_t memory_limit() const;  // 0: none
  // Keeps up to `bytes` of released KV chunk buffers for the next sessions
  // (KvPool::set_spare_limit; 0: none). None while a memory limit is set (a
  // limit bounds what is held) or in budget mode.
  void set_kv_spare_limit(uint64_t bytes);
  // A short identity of the model (architecture, shapes, types and sampled
  // weight bytes), recorded in saved sessions.
  uint64_t model_fingerprint() const { return fingerprint_; }

 private:
  friend class Session;
  void attach(Session* s);
  void detach(Session* s);

  EngineOptions opts_;
  bool adaptive_chunk_ = false;  // opts.kv_chunk_size was 0: sessions' chunks follow their contexts
  Ledger ledger_;
  Allocator alloc_{&ledger_};
  ThreadPool pool_;
  Isa isa_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Forward> forward_;
  std::unique_ptr<Backend> backend_;        // the device (nullptr: CPU); outlives device_
  std::unique_ptr<DeviceForward> device_;   // its weights, KV and step
  DevicePlan device_plan_;
  std::unique_ptr<AdapterRegistry> adapters_;
  uint64_t fingerprint_ = 0;
  WeightSource* weight_source_ = nullptr;
  std::unique_ptr<WeightSource> budget_source_;  // budget mode
  std::unique_ptr<MmapWeights> mmap_weights_;    // the OS-paging baseline
  uint64_t kv_spare_wanted_ = 0;
  std::unique_ptr<KvPool> kv_pool_;               // outlives every holder of its chunks
  std::unique_ptr<ElasticMemory> elastic_;        // declared after model_ and kv_pool_: destroyed first
  std::unique_ptr<CacheStore> cache_store_;       // the prefix cache's persistent tier
  std::unique_ptr<PrefixCache> prefix_cache_;     // holds pool chunks: destroyed before the pool and elastic
  mutable std::mutex sessions_mu_;
  std::vector<Session*> sessions_;
};

}  // namespace ebb
