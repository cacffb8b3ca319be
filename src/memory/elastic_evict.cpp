// ElasticMemory::evict: the hybrid-swap policy (mzCache Algorithm 1) decides
// the kind of each move; the order (backward-out by default) decides which
// unit. Moves: KV chunk -> compressed stack, KV chunk -> swap slot (raw),
// weight layer -> dropped (the GGUF backs it), compressed chunk -> swap slot.
#include <algorithm>
#include <cstring>
#include <unistd.h>

#include "memory/elastic.h"
#include "platform/error.h"
#include "platform/timer.h"

namespace ebb {

namespace {

uint64_t held_bytes(const Ledger& l) {
  return static_cast<uint64_t>(l.bytes(MemCategory::kWeights) + l.bytes(MemCategory::kKvCache) +
                               l.bytes(MemCategory::kCompressed) + l.bytes(MemCategory::kIoBuffer));
}

}  // namespace

KvChunkShape ElasticMemory::chunk_shape(const KvChunk& c) {
  KvChunkShape s;
  s.chunk_tokens = c.chunk_size;
  s.n_tokens = c.rows;
  s.row_dim = static_cast<int64_t>(c.row_bytes / (c.type == DType::kF16 ? 2 : 4));
  s.type = c.type;
  return s;
}

KvChunkShape ElasticMemory::chunk_shape_n(const KvChunk& c, int64_t n_tokens) {
  KvChunkShape s = chunk_shape(c);
  s.n_tokens = n_tokens;
  return s;
}

int ElasticMemory::swap_fd() const { return swap_ ? swap_->fd() : -1; }

std::vector<ElasticMemory::ChunkId> ElasticMemory::kv_order(bool resident) const {
  std::vector<ChunkId> all;
  // Forward order: layer, then the pool's creation order (a session's
  // chunks by position). Backward is its reverse.
  for (KvChunk* c : kv_->all_chunks())
    if (c->resident() == resident) all.push_back(c);
  if (opts_.order == EvictOrder::kForward) return all;
  if (opts_.order == EvictOrder::kBackward) {
    std::reverse(all.begin(), all.end());
    return all;
  }
  std::vector<ChunkId> out;
  for (int64_t i : eviction_sequence(EvictOrder::kRandom, static_cast<int64_t>(all.size()), opts_.seed))
    out.push_back(all[static_cast<size_t>(i)]);
  return out;
}

int ElasticMemory::next_weight_layer() const {
  const int nl = model_.n_layers();
  for (int64_t i : eviction_sequence(opts_.order, nl, opts_.seed + 1))
    if (model_.layer_unit(static_cast<int>(i)).resident()) return static_cast<int>(i);
  return -1;
}

bool ElasticMemory::ensure_swap(std::string* why) {
  if (swap_) return true;
  if (swap_failed_ || !opts_.allow_storage) {
    *why = swap_failed_ ? swap_error_ : "storage swap is off";
    return false;
  }
  uint64_t cap = opts_.swap_bytes;
  // Never more than the machine's memory: no more KV than that can be
  // evicted at once.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const uint64_t ram = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : UINT64_MAX;
  if (cap == 0) {
    // The KV of the sessions attached now at their full context; the file
    // grows when more come (a server attaches its sessions later).
    cap = std::min(kv_->capacity_bytes(), ram);
  }
  try {
    SwapFileOptions so;
    so.dir = opts_.swap_dir;
    so.capacity = std::max<uint64_t>(cap, 1 << 20);
    so.max_capacity = opts_.swap_bytes != 0 ? opts_.swap_bytes : ram;
    so.io = io_.get();
    swap_ = std::make_unique<SwapFile>(so);
    return true;
  } catch (const Error& e) {
    swap_failed_ = true;
    swap_error_ = e.what();
    *why = swap_error_;
    return false;
  }
}

std::string ElasticMemory::swap_full_text() const {
  const std::string grow = swap_->growth_error();
  return swap_->path() + ": swap file full (" + std::to_string(swap_->capacity() >> 20) + " MiB" +
         (grow.empty() ? ", its maximum" : "; " + grow) + ")";
}

void ElasticMemory::kv_to_compressed(const ChunkId& id) {
  KvChunk& kv = *id;
  const KvChunkShape shape = chunk_shape(kv);
  const KvCodec& codec = kv_codec(opts_.codec, opts_.isa);
  const uint64_t max_bytes = codec.max_compressed_bytes(shape);
  if (stack_.empty()) {
    // Segments of a few whole blobs: big enough to amortise allocation, small
    // enough that a fresh segment does not swallow what eviction frees.
    stack_.set_segment_bytes(CompressedStack::segment_bytes_for(max_bytes));
  }
  auto [handle, dst] = stack_.push(max_bytes);
  const size_t n = codec.compress(shape, kv.storage.data(), dst, nullptr, pool_);
  stack_.shrink_top(handle, n);
  KvChunkMeta& m = kv.meta;
  (void)kv_->take(kv);  // the chunk's pages go back here
  m.state = UnitState::kCompressed;
  m.handle = handle;
  m.compressed_bytes = n;
  m.n_tokens = shape.n_tokens;
}

bool ElasticMemory::kv_to_storage(const ChunkId& id, std::string* why) {
  if (!ensure_swap(why)) return false;
  KvChunk& kv = *id;
  KvChunkMeta& m = kv.meta;
  SwapSlot slot = swap_->allocate(kv.chunk_bytes());
  if (!slot.valid()) {
    *why = swap_full_text();
    return false;
  }
  m.slot = slot;
  m.n_tokens = kv.rows;
  Buffer src = kv_->take(kv);
  m.state = UnitState::kStored;
  PendingWrite w{swap_->write_async(m.slot, src.data()), std::move(src), id};
  pending_bytes_ += w.src.size();
  pending_.push_back(std::move(w));
  if (static_cast<int>(pending_.size()) >= io_->options().queue_depth) flush_writes();
  return true;
}

void ElasticMemory::flush_writes() {
  for (PendingWrite& w : pending_) {
    try {
      io_->wait(w.ticket);
    } catch (const Error&) {
      // The write failed: the chunk is still in w.src, so it stays in RAM,
      // raw, or as a blob back on the compressed stack.
      KvChunk& kv = *w.id;
      KvChunkMeta& m = kv.meta;
      if (m.slot.valid()) swap_->free(m.slot);
      m.slot = {};
      if (w.compressed) {
        auto [handle, dst] = stack_.push(m.compressed_bytes);
        std::memcpy(dst, w.src.data(), m.compressed_bytes);
        m.state = UnitState::kCompressed;
        m.handle = handle;
        std::lock_guard lock(owner_mu_);
        blob_owner_[handle] = w.id;
      } else {
        m = {};
        kv_->put(kv, std::move(w.src));
      }
      write_failures_++;
    }
  }
  pending_.clear();
  pending_bytes_ = 0;
}

void ElasticMemory::drop_weights(int layer) { model_.layer_unit(layer).release(); }

bool ElasticMemory::compressed_to_storage(std::string* why) {
  if (stack_.empty()) {
    *why = "no compressed KV left";
    return false;
  }
  if (!ensure_swap(why)) return false;
  const CompressedStack::Handle h = stack_.bottom();
  ChunkId id = nullptr;
  {
    std::lock_guard lock(owner_mu_);
    auto owner = blob_owner_.find(h);
    EBB_CHECK(owner != blob_owner_.end());
    id = owner->second;
  }
  const uint64_t n = stack_.size(h);
  SwapSlot slot = swap_->allocate(n);
  if (!slot.valid()) {
    *why = swap_full_text();
    return false;
  }
  Buffer staging = alloc_.allocate(slot.stored, MemCategory::kIoBuffer, kDirectAlign);
  std::memcpy(staging.data(), stack_.data(h), n);
  std::memset(staging.as<uint8_t>() + n, 0, slot.stored - n);
  KvChunkMeta& m = id->meta;
  m.slot = slot;
  // The blob leaves the stack now; its copy in `staging` is written behind
  // (batched with the other writes, see flush_writes) and put back on the
  // stack if the write fails.
  PendingWrite w{swap_->write_async(m.slot, staging.data()), std::move(staging), id, true};
  stack_.erase(h);
  {
    std::lock_guard lock(owner_mu_);
    blob_owner_.erase(h);
  }
  m.state = UnitState::kStoredCompressed;
  pending_bytes_ += w.src.size();
  pending_.push_back(std::move(w));
  if (static_cast<int>(pending_.size()) >= io_->options().queue_depth) flush_writes();
  return true;
}

EvictReport ElasticMemory::evict(uint64_t bytes) {
  Stopwatch timer;
  if (restoring_.load()) {
    try {
      wait_restored();
    } catch (const Error&) {
      // Units that failed to restore stay evicted; eviction goes on.
    }
  }
  restore_pending_ = true;
  EvictReport r;
  r.requested = bytes;
  const Ledger& ledger = *alloc_.ledger();
  const uint64_t start = held_bytes(ledger);
  auto freed = [&]() -> int64_t {
    return static_cast<int64_t>(start) - static_cast<int64_t>(held_bytes(ledger)) + static_cast<int64_t>(pending_bytes_);
  };

  auto note = [&](const std::string& s) { r.note += (r.note.empty() ? "" : "; ") + s; };
  // Writes in flight finish; failed ones left their chunks in RAM.
  auto finish = [&] {
    flush_writes();
    r.freed = static_cast<uint64_t>(std::max<int64_t>(0, freed()));
    if (write_failures_ > 0) {
      note(std::to_string(write_failures_) + " swap writes failed; those chunks stayed in RAM");
      write_failures_ = 0;
    }
    r.seconds = timer.seconds();
    r.after = footprint();
    return r;
  };

  // Spare KV buffers hold nothing anyone needs: they go first.
  kv_->release_spare();
  if (freed() >= static_cast<int64_t>(bytes)) return finish();

  if (opts_.policy == EvictPolicyKind::kPartialOffload) {
    evict_partial_offload(bytes, r, freed);
    return finish();
  }

  PolicyCounts counts;
  int64_t n_kv_total = 0;
  for (const KvChunk* c : kv_->all_chunks()) {
    ++n_kv_total;
    if (c->resident()) ++counts.kv_resident;
    if (c->meta.state == UnitState::kCompressed) ++counts.kv_compressed_mem;
  }
  for (int l = 0; l < model_.n_layers(); ++l) counts.w_resident += model_.layer_unit(l).resident() ? 1 : 0;

  HybridSwapPolicy::Options po;
  po.allow_storage = opts_.allow_storage && !swap_failed_;
  auto policy = std::make_unique<HybridSwapPolicy>(unit_times(), n_kv_total, model_.n_layers(), po);
  std::vector<ChunkId> order = kv_order(true);
  size_t next_kv = 0;
  auto take_kv = [&]() -> const ChunkId* {
    while (next_kv < order.size() && !order[next_kv]->resident())
      ++next_kv;
    return next_kv < order.size() ? &order[next_kv] : nullptr;
  };

  while (freed() < static_cast<int64_t>(bytes)) {
    r.last_stage = policy->stage(counts);
    const EvictAction a = policy->next(counts);
    if (a == EvictAction::kNone) {
      note("nothing left to evict");
      break;
    }
    if (a == EvictAction::kKvToCompressed || a == EvictAction::kKvToStorage) {
      const ChunkId* id = take_kv();
      if (!id) break;  // counts said otherwise: the policy and the caches disagree
      const ChunkId c = *id;
      ++next_kv;
      std::string why;
      if (opts_.lossless_kv) {  // raw to storage or not at all
        if (!kv_to_storage(c, &why)) {
          note("lossless KV needs storage, the KV stays in RAM: " + why);
          break;
        }
        ++r.kv_to_storage;
        --counts.kv_resident;
        continue;
      }
      if (a == EvictAction::kKvToStorage && !kv_to_storage(c, &why)) {
        note("storage swap unavailable, KV goes to the compressed stack only: " + why);
        po.allow_storage = false;
        policy = std::make_unique<HybridSwapPolicy>(unit_times(), n_kv_total, model_.n_layers(), po);
        kv_to_compressed(c);
        ++r.kv_to_compressed;
        ++counts.kv_compressed_mem;
      } else if (a == EvictAction::kKvToStorage) {
        ++r.kv_to_storage;
      } else {
        kv_to_compressed(c);
        ++r.kv_to_compressed;
        ++counts.kv_compressed_mem;
      }
      if (c->meta.state == UnitState::kCompressed) {
        std::lock_guard lock(owner_mu_);
        blob_owner_[c->meta.handle] = c;
      }
      --counts.kv_resident;
    } else if (a == EvictAction::kDropWeightLayer) {
      const int l = next_weight_layer();
      if (l < 0) break;
      drop_weights(l);
      ++r.weights_dropped;
      --counts.w_resident;
    } else {  // kCompressedToStorage
      std::string why;
      if (!compressed_to_storage(&why)) {
        note("cannot move compressed KV to storage, nothing more can be given back: " + why);
        break;
      }
      ++r.compressed_to_storage;
      --counts.kv_compressed_mem;
    }
  }
  return finish();
}

void ElasticMemory::evict_partial_offload(uint64_t bytes, EvictReport& r, const std::function<int64_t()>& freed) {
  // Layer-granular, rearmost layer first: its KV raw to storage, then its weights.
  for (int l = model_.n_layers() - 1; l >= 0 && freed() < static_cast<int64_t>(bytes); --l) {
    const std::vector<KvChunk*> chunks = kv_->layer_chunks(l);
    for (auto it = chunks.rbegin(); it != chunks.rend() && freed() < static_cast<int64_t>(bytes); ++it) {
        if (!(*it)->resident()) continue;
        std::string why;
        if (!kv_to_storage(*it, &why)) {
          r.note = "partial offload needs storage: " + why;
          return;
        }
        ++r.kv_to_storage;
      }
    if (freed() < static_cast<int64_t>(bytes) && model_.layer_unit(l).resident()) {
      drop_weights(l);
      ++r.weights_dropped;
    }
  }
}

}  // namespace ebb
