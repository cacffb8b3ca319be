// ElasticMemory: construction, bookkeeping, footprint and the WeightSource
// face. Eviction is in elastic_evict.cpp, restoration in elastic_restore.cpp.
#include "memory/elastic.h"

#include <algorithm>

#include "platform/error.h"

namespace ebb {

OverlapMode parse_overlap_mode(std::string_view s) {
  if (s == "none") return OverlapMode::kNone;
  if (s == "alloc-reload") return OverlapMode::kAllocReload;
  if (s == "reload-prefill") return OverlapMode::kReloadPrefill;
  if (s == "full") return OverlapMode::kFull;
  throw Error("unknown overlap mode '" + std::string(s) + "' (choices: none, alloc-reload, reload-prefill, full)");
}

std::string_view overlap_mode_name(OverlapMode m) {
  switch (m) {
    case OverlapMode::kNone: return "none";
    case OverlapMode::kAllocReload: return "alloc-reload";
    case OverlapMode::kReloadPrefill: return "reload-prefill";
    case OverlapMode::kFull: return "full";
  }
  return "?";
}

IoOptions elastic_io_options(const DeviceProfile& p) {
  IoOptions o;
  o.max_request = std::max<uint64_t>(1ull << 20, p.best_request_bytes);
  // A restore shares the cores with the prefill it overlaps, and the thread
  // that refills the queue (io_uring's reaper) waits for a core behind the
  // prefill's threads; with only the profile's point in flight (measured on
  // idle cores: 32 MiB, 8 ms of a 4 GB/s disk) the disk then runs dry. At
  // least kRestoreInFlight bytes stay queued. Reads land in their final
  // buffers, so a deeper queue costs no memory. (qwen3-0.6b F16, 4k context,
  // 2 threads, medians of 5: TTFT after full eviction 1.24x its bound with
  // 16 x 4 MiB in flight against 1.30x with 8; docs/benchmarks.md.)
  constexpr uint64_t kRestoreInFlight = uint64_t{64} << 20;
  const auto deep = static_cast<int>((kRestoreInFlight + o.max_request - 1) / o.max_request);
  o.queue_depth = std::max({4, p.best_queue_depth, deep});
  return o;
}

ElasticMemory::ElasticMemory(Model& model, Allocator& alloc, ElasticOptions opts, KvPool* kv, ThreadPool* pool)
    : model_(model),
      globals_(model),
      alloc_(alloc),
      opts_(std::move(opts)),
      pool_(pool),
      io_(std::make_unique<IoEngine>(elastic_io_options(opts_.profile))),
      gguf_(DirectFile::open_read(model.file().path())),
      weight_crc_(model),
      stack_(alloc),
      kv_(kv) {}
// The destructor is in elastic_restore.cpp, where Latches is complete.

void ElasticMemory::on_release(KvChunk& c) {
  if (restoring_.load()) {
    try {
      wait_restored();
    } catch (const Error&) {
      // The weights' error is reported to whoever asks next; the chunk goes.
    }
  }
  if (c.resident()) return;
  // A write still in flight for this chunk finishes first.
  for (const PendingWrite& w : pending_)
    if (w.id == &c) {
      flush_writes();
      break;
    }
  KvChunkMeta& m = c.meta;
  if (m.state == UnitState::kCompressed && stack_.contains(m.handle)) {
    stack_.erase(m.handle);
    std::lock_guard lock(owner_mu_);
    blob_owner_.erase(m.handle);
  }
  if ((m.state == UnitState::kStored || m.state == UnitState::kStoredCompressed) && m.slot.valid() && swap_)
    swap_->free(m.slot);
  m = {};
}

bool ElasticMemory::fully_resident() const {
  if (restoring_.load() || streaming_) return false;
  for (int l = 0; l < model_.n_layers(); ++l)
    if (!model_.layer_unit(l).resident()) return false;
  for (const KvChunk* c : kv_->all_chunks())
    if (!c->resident()) return false;
  return true;
}

UnitTimes ElasticMemory::unit_times() const {
  uint64_t chunk = 0;
  for (const KvChunk* c : kv_->all_chunks()) chunk = std::max(chunk, c->chunk_bytes());
  if (chunk == 0) chunk = 1;
  const uint64_t layer = model_.n_layers() > 0 ? model_.layer_unit(0).bytes() : 1;
  try {
    return opts_.profile.unit_times(chunk, layer, kv_codec_name(opts_.codec));
  } catch (const Error&) {
    return DeviceProfile::defaults().unit_times(chunk, layer, kv_codec_name(opts_.codec));
  }
}

ElasticFootprint ElasticMemory::footprint() const {
  ElasticFootprint f;
  for (int l = 0; l < model_.n_layers(); ++l) {
    const WeightUnit& u = model_.layer_unit(l);
    (u.resident() ? f.weights_resident : f.weights_stored) += u.bytes();
  }
  f.kv_resident = kv_->total_bytes();
  f.kv_spare = kv_->spare_bytes();
  for (const KvChunk* c : kv_->all_chunks()) {
    const KvChunkMeta& m = c->meta;
    if (m.state == UnitState::kStored || m.state == UnitState::kStoredCompressed) f.kv_stored += m.slot.stored;
  }
  f.compressed = stack_.bytes_reserved();
  for (const StreamSlot& s : stream_) f.stream_window += s.buf.size();
  return f;
}

ResidencyMap ElasticMemory::residency() const {
  ResidencyMap r;
  const int nl = model_.n_layers();
  r.weights.resize(nl);
  r.kv.resize(nl);
  for (int l = 0; l < nl; ++l) {
    r.weights[l] = model_.layer_unit(l).resident() ? UnitState::kResident : UnitState::kStored;
    for (const KvChunk* c : kv_->layer_chunks(l)) r.kv[l].push_back(c->meta.state);
  }
  return r;
}

}  // namespace ebb
