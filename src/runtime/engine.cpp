#include "runtime/engine.h"

#include <algorithm>
#include <cstring>

#include "kernels/matmul.h"
#include "platform/error.h"
#include "platform/hash.h"
#include "platform/timer.h"
#include "runtime/budget_mode.h"
#include "runtime/session.h"

namespace ebb {
namespace {

Isa choose_isa(const std::optional<Isa>& requested) {
  if (!requested) return best_isa();
  if (!isa_supported(*requested)) {
    throw Error("kernel target '" + std::string(isa_name(*requested)) +
                "' is not supported on this CPU or build (best here: " + std::string(isa_name(best_isa())) + ")");
  }
  return *requested;
}

// Hash of the tensor table and the first bytes of every tensor: different
// models, quantizations or seeds give different fingerprints.
uint64_t fingerprint(const Model& m) {
  uint64_t h = kFnv1a64Offset;
  const ModelConfig& c = m.config();
  h = fnv1a64(c.arch_name.data(), c.arch_name.size(), h);
  for (const GgufTensorInfo& t : m.file().tensors()) {
    h = fnv1a64(t.name.data(), t.name.size(), h);
    h = fnv1a64(t.dims.data(), t.dims.size() * sizeof(int64_t), h);
    h = fnv1a64(&t.type, sizeof(t.type), h);
    uint8_t head[64] = {};
    const uint64_t n = std::min<uint64_t>(sizeof(head), t.n_bytes);
    m.file().read(t.file_offset, head, n);
    h = fnv1a64(head, n, h);
  }
  return h;
}

}  // namespace

int64_t default_kv_chunk_size(int64_t n_ctx) {
  int64_t chunk = 256;
  if (n_ctx <= 0) return chunk;  // unknown context
  while (chunk > 16 && chunk > n_ctx / 4) chunk /= 2;
  return chunk;
}

uint64_t Footprint::weights() const {
  uint64_t t = 0;
  for (uint64_t b : weights_per_layer) t += b;
  return t;
}

uint64_t Footprint::kv() const {
  uint64_t t = 0;
  for (uint64_t b : kv_per_layer) t += b;
  return t;
}

Engine::Engine(const EngineOptions& opts)
    : opts_(opts),
      pool_(ThreadPoolOptions{.n_threads = opts.n_threads, .name = "ebb-compute"}),
      isa_(choose_isa(opts.isa)) {
  const bool budget_mode = opts_.budget.budget > 0;  // budget mode reads only what its plan keeps
  if (opts_.backend) opts_.device = opts_.backend->info().id;
  const bool on_device = !opts_.device.empty() && opts_.device != "cpu";
  if (on_device) {
    // What does not run on a device yet is refused, never run on the CPU silently.
    if (budget_mode) throw Error("--memory-budget runs on the CPU only for now, not with --device " + opts_.device);
    if (opts_.n_gpu_layers == 0)
      throw Error("-ngl 0 puts no layer on the device, but --device " + opts_.device + " asks for it");
    if (!opts_.backend) {
      std::string why;
      if (list_gpu_devices(&why).empty()) {
        throw Error("--device " + opts_.device + ": no Vulkan device here (" + why +
                    "); install a Vulkan driver (the GPU vendor's, or mesa-vulkan-drivers) or run on the CPU");
      }
      backend_ = open_backend(opts_.device);  // throws naming the id and what was found instead
    }
  }
  const KernelSet& ks = kernel_set(isa_);
  // Packed units when the target has packed kernels for every format that
  // packs (on a device: GGUF's own rows, as the shaders read them).
  bool target_packs = true;
  for (DType t : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K})
    target_packs = target_packs && ks.format(t) && ks.format(t)->x8_gemm;
  const bool pack = target_packs && !on_device;
  model_ = Model::load(opts_.model_path, alloc_,
                       {.load_weights = !budget_mode, .pack_weights = pack, .progress = opts_.load_progress});
  opts_.load_progress = nullptr;  // it may capture the caller's state, which need not outlive the load
  const ModelConfig& c = model_->config();
  // Every weight format must have kernels on the chosen target.
  for (int l = 0; l < model_->n_layers(); ++l) {
    for (const TensorSlot& s : model_->layer_unit(l).slots()) {
      if (s.dims.size() == 2 && !ks.format(s.type)) {
        throw Error(opts_.model_path + ": tensor '" + s.name + "' has type " + std::string(dtype_name(s.type)) +
                    " with no kernels on target " + std::string(isa_name(isa_)));
      }
    }
  }
  // A chunk for sessions of the default context; each session's adapts to its own.
  adaptive_chunk_ = opts_.kv_chunk_size <= 0;
  if (adaptive_chunk_) {
    const int64_t n_ctx = opts_.budget.n_ctx > 0 ? opts_.budget.n_ctx : std::min<int64_t>(c.n_ctx_train, 4096);
    opts_.kv_chunk_size = default_kv_chunk_size(n_ctx);
  }
  ForwardOptions fo;
  fo.max_batch = opts_.prefill_batch;
  fo.max_chunk_size = opts_.kv_chunk_size;
  forward_ = std::make_unique<Forward>(*model_, isa_, pool_, alloc_, fo);
  if (on_device) {
    const int nl = model_->n_layers();
    Backend& be = opts_.backend ? *opts_.backend : *backend_;
    const int64_t ctx = opts_.device_context > 0 ? opts_.device_context : std::min<int64_t>(c.n_ctx_train, 4096);
    device_plan_ = plan_device_layers(be, *model_,
                                      {.n_gpu_layers = opts_.n_gpu_layers, .budget = opts_.device_memory,
                                       .n_ctx = ctx > 0 ? ctx : 4096, .max_batch = fo.max_batch});
    device_ = std::make_unique<DeviceForward>(
        be, *model_, alloc_,
        DeviceForwardOptions{.max_batch = fo.max_batch, .isa = isa_, .first_layer = device_plan_.first_layer});
    forward_->set_device(device_.get());
    // The device holds its layers now; the host keeps the globals (the
    // embedding lookup runs here) and, in a split, the CPU's layers.
    for (int l = device_plan_.first_layer; l < nl; ++l) model_->layer_unit(l).release();
    // A split's CPU layers run with the CPU's kernels: packed as a CPU engine's.
    if (target_packs)
      for (int l = 0; l < device_plan_.first_layer; ++l) model_->layer_unit(l).pack_in_place();
    opts_.elastic = false;  // the host's elastic memory: the device evicts layers on both sides (evict())
    // Training (train/) runs on the host's kernels and reads the base
    // weights there: with every layer on the device, from a read-only
    // mapping of the GGUF (the page cache, nothing copied but the 1-D
    // tensors), since the host let its copies go. The device's steps never
    // read it. A split's steps read the CPU's layers from their resident
    // units, so it has no weight source (and trains nothing: Trainer says so).
    if (!opts_.os_paging && device_plan_.first_layer == 0) {
      mmap_weights_ = std::make_unique<MmapWeights>(*model_, alloc_);
      weight_source_ = mmap_weights_.get();
    }
  }
  adapters_ = std::make_unique<AdapterRegistry>(model_->config(), alloc_);
  // A version the registry drops leaves the device too, once nobody holds it.
  if (device_) adapters_->set_on_drop([d = device_.get()] { d->collect_adapters(); });
  kv_pool_ = std::make_unique<KvPool>(KvShape{c.n_layer, c.n_head_kv, c.head_dim}, &alloc_);
  fingerprint_ = fingerprint(*model_);
  if (budget_mode) {
    budget_source_ = make_budget_source(*model_, *forward_, alloc_, opts_.budget, opts_.kv_chunk_size);
    weight_source_ = budget_source_.get();
  } else if (opts_.elastic) {
    ElasticOptions eo = opts_.elastic_opts;
    eo.isa = isa_;
    elastic_ = std::make_unique<ElasticMemory>(*model_, alloc_, std::move(eo), kv_pool_.get(), &pool_);
    kv_pool_->set_listener(elastic_.get());
    weight_source_ = elastic_.get();
  }
  if (opts_.os_paging) {
    if (budget_mode || opts_.elastic) {
      throw Error("os_paging serves the weights from a mapping of the GGUF: it needs elastic memory off and "
                  "no weight budget");
    }
    mmap_weights_ = std::make_unique<MmapWeights>(*model_, alloc_);
    weight_source_ = mmap_weights_.get();
  }
  if (!opts_.cache_dir.empty() && !opts_.prefix_cache) {
    throw Error("a KV cache directory needs the prefix cache (it is the cache's persistent tier)");
  }
  if (!opts_.cache_dir.empty()) {
    cache_store_ = std::make_unique<CacheStore>(
        CacheStoreOptions{opts_.cache_dir, opts_.cache_dir_bytes, fingerprint_},
        KvShape{c.n_layer, c.n_head_kv, c.head_dim});
  }
  if (opts_.prefix_cache) {
    prefix_cache_ = std::make_unique<PrefixCache>(c.n_layer, opts_.prefix_cache_opts, cache_store_.get(),
                                                  kv_pool_.get());
  }
}

EvictReport Engine::evict(uint64_t bytes) {
  if (device_) {
    // On a device: whole layers' weights leave device memory, then the
    // sessions' device KV (parked on the host), then a split's CPU layers
    // leave the host (a split's CPU layers' KV stays in the host cache); the
    // next step or restore() brings them back.
    const Stopwatch sw;
    const DeviceForward::Evicted d = device_->evict(bytes);
    EvictReport r;
    r.requested = bytes;
    r.freed = d.freed + d.host_freed;
    r.weights_dropped = d.layers + d.host_layers;
    r.seconds = sw.seconds();
    r.note = device_->device().id + ": " + std::to_string(d.layers) + " weight layers, the device KV of " +
             std::to_string(d.kv_sessions) + " sessions read back to the host (" + std::to_string(d.kv_freed) +
             " device bytes)";
    return r;
  }
  if (!elastic_) throw Error("elastic memory is off (budget mode); nothing can be evicted");
  {
    std::lock_guard lock(sessions_mu_);
    for (Session* s : sessions_) s->release_adapters();
  }
  const AdapterEvictReport a = adapters_->evict_unused(bytes);
  EvictReport r;
  if (a.bytes < bytes) {
    r = elastic_->evict(bytes - a.bytes);
  } else {
    r.after = elastic_->footprint();
  }
  r.requested = bytes;
  r.freed += a.bytes;
  r.adapters_dropped = a.versions;
  return r;
}

EvictReport Engine::set_memory_limit(uint64_t bytes) {
  if (device_) {
    // On a device: the limit caps device and host memory together
    // (DeviceForward::set_memory_limit); the host KV pool holds a split's
    // CPU layers' KV, and keeps no spare chunks under a limit.
    const Stopwatch sw;
    kv_pool_->set_spare_limit(bytes > 0 ? 0 : kv_spare_wanted_);
    KvPool* pool = kv_pool_.get();
    const int nl = model_->n_layers();
    const DeviceForward::Evicted d = device_->set_memory_limit(bytes, [pool, nl] {
      uint64_t b = pool->spare_bytes();
      for (int l = 0; l < nl; ++l) b += pool->layer_bytes(l);
      return b;
    });
    EvictReport r;
    r.requested = bytes > 0 ? bytes : 0;
    r.freed = d.freed;
    r.weights_dropped = d.layers;
    r.seconds = sw.seconds();
    if (d.layers > 0)
      r.note = device_->device().id + ": " + std::to_string(d.layers) + " weight layers dropped to the limit";
    return r;
  }
  if (!elastic_)
    throw Error("elastic memory is off (budget mode): the memory budget already bounds the weights");
  kv_pool_->set_spare_limit(bytes > 0 ? 0 : kv_spare_wanted_);
  return elastic_->set_memory_limit(bytes);
}

uint64_t Engine::memory_limit() const {
  if (device_) return device_->memory_limit();
  return elastic_ ? elastic_->memory_limit() : 0;
}

void Engine::set_kv_spare_limit(uint64_t bytes) {
  kv_spare_wanted_ = bytes;
  const bool capped = device_ ? device_->memory_limit() > 0 : !elastic_ || elastic_->memory_limit() > 0;
  kv_pool_->set_spare_limit(capped ? 0 : bytes);
}

RestoreReport Engine::restore() {
  if (device_) {
    const Stopwatch sw;
    RestoreReport r;
    r.weights_loaded = device_->restore();
    r.seconds = sw.seconds();
    return r;
  }
  if (!elastic_) return {};
  RestoreReport r = elastic_->restore();
  return r;
}

Engine::~Engine() {
  prefix_cache_.reset();  // its chunks go back to the pool while elastic memory can free their swap space
  if (kv_pool_) kv_pool_->set_listener(nullptr);
  elastic_.reset();  // joins a restore in flight before the model goes
}

void Engine::attach(Session* s) {
  std::lock_guard lock(sessions_mu_);
  sessions_.push_back(s);
}

void Engine::detach(Session* s) {
  if (device_) device_->release(&s->kv());
  std::lock_guard lock(sessions_mu_);
  sessions_.erase(std::remove(sessions_.begin(), sessions_.end(), s), sessions_.end());
}

Footprint Engine::footprint() const {
  Footprint f;
  const int nl = model_->n_layers();
  f.weights_per_layer.resize(nl);
  f.kv_per_layer.assign(nl, 0);
  for (int l = 0; l < nl; ++l) {
    const WeightUnit& u = model_->layer_unit(l);
    f.weights_per_layer[l] = u.resident() ? u.bytes() : 0;
  }
  f.globals = model_->globals_unit().resident() ? model_->globals_unit().bytes() : 0;
  {
    std::lock_guard lock(sessions_mu_);
    for (const Session* s : sessions_) f.scratch += s->scratch_bytes();
  }
  for (int l = 0; l < nl; ++l) f.kv_per_layer[l] = kv_pool_->layer_bytes(l);
  f.kv_spare = kv_pool_->spare_bytes();
  f.scratch += forward_->scratch_bytes();
  f.io_buffers = static_cast<uint64_t>(ledger_.bytes(MemCategory::kIoBuffer));
  f.adapters = static_cast<uint64_t>(ledger_.bytes(MemCategory::kAdapter));
  f.adapters_stored = adapters_->evicted_bytes();
  f.training = static_cast<uint64_t>(ledger_.bytes(MemCategory::kTrainActivations) +
                                     ledger_.bytes(MemCategory::kTrainGrads) +
                                     ledger_.bytes(MemCategory::kTrainOptimizer));
  if (elastic_) {
    const ElasticFootprint e = elastic_->footprint();
    f.compressed = e.compressed;
    f.kv_stored = e.kv_stored;
    f.weights_stored = e.weights_stored;
  }
  if (device_) {
    f.device = device_->footprint();
    f.kv_parked = f.device->kv_parked;
    // A split's CPU layers that evict() dropped: the GGUF backs them.
    for (int l = 0; l < device_->first_layer(); ++l)
      if (!model_->layer_unit(l).resident()) f.weights_stored += model_->layer_unit(l).bytes();
  }
  return f;
}

}  // namespace ebb
