// ElasticMemory restoration: forward-in, on two paths that run at once —
// the I/O path (allocate, direct-read weight segments and swap slots, verify)
// and the decompression path (allocate, decompress from the compressed
// stack) — each opening its half of a per-layer latch. The forward pass waits
// on layer i's latch only (acquire_layer), so prefill overlaps restoration.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <system_error>
#include <thread>

#include "memory/elastic.h"
#include "platform/checksum.h"
#include "platform/error.h"
#include "platform/thread_name.h"
#include "platform/timer.h"

namespace ebb {

struct ElasticMemory::LayerPlan {
  int layer = 0;
  bool weights = false;
  std::vector<ChunkId> stored;       // raw chunks in swap slots, by slot offset
  std::vector<ChunkId> stored_comp;  // compressed chunks in swap slots, by slot offset
  std::vector<ChunkId> compressed;   // compressed chunks in the stack
  // I/O path state
  std::vector<Buffer> chunk_bufs;    // [stored] read targets, one mapping
  Buffer staging;                    // stored_comp slots back to back, in slot order
  std::vector<uint64_t> staging_at;  // [stored_comp] where each slot lands in staging
  uint64_t read_bytes = 0;           // bytes this layer reads
  IoEngine::Ticket weights_ticket = 0, swap_ticket = 0;
  bool have_weights_ticket = false, have_swap_ticket = false;
  bool allocated = false;
};


namespace {

// A restored layer's checks are split into tasks over the restore thread and
// a helper: weight images in pieces of this size, and a helper only for a
// layer with at least kVerifySplit bytes to check.
constexpr uint64_t kVerifyPiece = uint64_t{1} << 20;
constexpr uint64_t kVerifySplit = uint64_t{4} << 20;

// Buffers for `chunks` (in that order), one mapping per allocation size
// among them, so a layer's chunks fault in by huge pages and neighbouring
// slots can be read into neighbouring buffers with one request.
std::vector<Buffer> chunk_buffers(const KvPool& pool, const std::vector<KvChunk*>& chunks) {
  std::vector<Buffer> out(chunks.size());
  std::vector<bool> done(chunks.size(), false);
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (done[i]) continue;
    const uint64_t bytes = chunks[i]->alloc_bytes();
    std::vector<size_t> mine;
    for (size_t j = i; j < chunks.size(); ++j)
      if (chunks[j]->alloc_bytes() == bytes) mine.push_back(j);
    std::vector<Buffer> group = pool.new_buffers(mine.size(), bytes);
    for (size_t k = 0; k < mine.size(); ++k) {
      out[mine[k]] = std::move(group[k]);
      done[mine[k]] = true;
    }
  }
  return out;
}

}  // namespace

ElasticMemory::~ElasticMemory() {
  if (restore_thread_.joinable()) restore_thread_.join();
  flush_writes();
}

void ElasticMemory::begin_restore() {
  if (restoring_.load()) return;
  restore_pending_ = false;
  flush_writes();
  std::vector<LayerPlan> plan(static_cast<size_t>(model_.n_layers()));
  bool any = false;
  for (int l = 0; l < model_.n_layers(); ++l) {
    LayerPlan& p = plan[l];
    p.layer = l;
    p.weights = !model_.layer_unit(l).resident();
    for (KvChunk* c : kv_->layer_chunks(l)) {
      switch (c->meta.state) {
        case UnitState::kStored: p.stored.push_back(c); break;
        case UnitState::kStoredCompressed: p.stored_comp.push_back(c); break;
        case UnitState::kCompressed: p.compressed.push_back(c); break;
        default: break;
      }
    }
    // Slot order: neighbouring slots then read as one request.
    for (std::vector<ChunkId>* list : {&p.stored, &p.stored_comp})
      std::sort(list->begin(), list->end(), [](const ChunkId& a, const ChunkId& b) {
        return a->meta.slot.offset < b->meta.slot.offset;
      });
    any = any || p.weights || !p.stored.empty() || !p.stored_comp.empty() || !p.compressed.empty();
  }
  // Under a memory limit: the KV comes back first (attention needs all of
  // it), then weight layers forward-in while they fit; the rest is streamed.
  bool stream = false;
  if (opts_.memory_limit > 0) {
    uint64_t kv_need = 0, w_need = 0;
    for (const LayerPlan& p : plan) {
      for (const auto* list : {&p.stored, &p.stored_comp, &p.compressed})
        for (const ChunkId& c : *list) kv_need += c->alloc_bytes();
      if (p.weights) w_need += model_.layer_unit(p.layer).bytes();
    }
    const ElasticFootprint f = footprint();
    const uint64_t in_ram = f.in_ram() - f.compressed;  // the stack empties as chunks come back
    // KV the running sessions may still add (set_kv_reserve) is room taken.
    const uint64_t growth = kv_reserve_ > f.kv_resident + kv_need ? kv_reserve_ - f.kv_resident - kv_need : 0;
    const uint64_t taken = in_ram + kv_need + growth;
    const uint64_t room = opts_.memory_limit > taken ? opts_.memory_limit - taken : 0;
    if (w_need > room) {
      stream = true;
      const uint64_t window = 2 * max_unit_bytes();
      uint64_t left = room > window ? room - window : 0;
      // Not even the window fits: resident layers make way, rearmost first.
      uint64_t excess = window > room ? window - room : 0;
      for (int l = model_.n_layers() - 1; l >= 0 && excess > 0; --l) {
        WeightUnit& u = model_.layer_unit(l);
        if (!u.resident()) continue;
        excess -= std::min(excess, u.bytes());
        u.release();
      }
      for (LayerPlan& p : plan) {
        if (!p.weights) continue;
        const uint64_t b = model_.layer_unit(p.layer).bytes();
        if (b <= left) {
          left -= b;
        } else {
          p.weights = false;  // streamed
          left = 0;           // forward-in: later layers stay out too
        }
      }
    }
  }
  if (stream) {
    streaming_ = true;
  } else if (streaming_) {
    stop_streaming();
  }
  any = false;
  for (const LayerPlan& p : plan)
    any = any || p.weights || !p.stored.empty() || !p.stored_comp.empty() || !p.compressed.empty();
  if (!any) return;
  latches_ = std::make_unique<Latches>();
  latches_->pending.assign(plan.size(), 2);
  latches_->error.assign(plan.size(), {});
  last_restore_ = {};
  // The prefill that overlaps this restore shares the cores with it: its
  // threads spin only briefly at joins, so a restore thread that needs the
  // core gets it (TTFT at 0% and 2k context 0.27 s instead of 0.31 s on 2
  // cores; wait_restored() gives decode its long spins back).
  if (pool_) pool_->set_spin_iterations(kRestoreSpin);
  restoring_.store(true);
  restore_thread_ = std::thread([this, p = std::move(plan)]() mutable {
    set_current_thread_name("ebb-restore");
    run_restore(std::move(p));
  });
}

void ElasticMemory::run_restore(std::vector<LayerPlan> plan) {
  Stopwatch sw;
  // The partial-offload baseline restores everything, one step after the
  // other, before compute starts.
  const OverlapMode mode = opts_.policy == EvictPolicyKind::kPartialOffload ? OverlapMode::kNone : opts_.overlap;
  // Latches open per layer only when prefill may overlap the restore.
  const bool per_layer = mode == OverlapMode::kReloadPrefill || mode == OverlapMode::kFull;
  if (mode == OverlapMode::kNone || !opts_.parallel_paths) {
    // Sequential paths still open the latches per layer when prefill may
    // overlap (each path opens its half), else every latch stayed shut.
    io_path(plan, per_layer);
    decompress_path(plan, per_layer);
  } else {
    std::thread decomp([&] {
      set_current_thread_name("ebb-decompress");
      decompress_path(plan, per_layer);
    });
    io_path(plan, per_layer);
    decomp.join();
  }
  if (!per_layer)
    for (size_t l = 0; l < plan.size(); ++l) {
      latches_->open(static_cast<int>(l));
      latches_->open(static_cast<int>(l));
    }
  last_restore_.seconds = sw.seconds();
}

void ElasticMemory::io_path(std::vector<LayerPlan>& plan, bool open_latches) {
  // Weights are read through the descriptor opened at load: a file renamed
  // over or deleted since is still the original there. Each layer read is
  // then checked against its checksum at load (weight_crc_), unless the
  // inode's ctime shows it was not written since (bytes_unchanged).
  const bool file_ok = descriptor_unchanged(gguf_.fd(), model_.file());
  // The layers' CRC only when the inode may have been written since load.
  const bool check_bytes = !bytes_unchanged(gguf_.fd(), model_.file());
  const std::string file_error = model_.file().path() +
                                 ": the model file changed on disk since it was loaded; its weights cannot be "
                                 "restored (reload the model; the session's tokens are kept)";
  const int fd = gguf_.fd();
  auto allocate = [&](LayerPlan& p) {
    if (p.allocated) return;
    Stopwatch sw;
    if (p.weights && file_ok) model_.layer_unit(p.layer).allocate(alloc_);
    p.chunk_bufs = chunk_buffers(*kv_, p.stored);
    uint64_t staged = 0;
    for (const ChunkId& c : p.stored_comp) {
      p.staging_at.push_back(staged);
      staged += c->meta.slot.stored;
    }
    if (staged > 0) p.staging = alloc_.allocate(staged, MemCategory::kIoBuffer, kDirectAlign);
    p.allocated = true;
    last_restore_.alloc_s += sw.seconds();
  };
  auto submit = [&](LayerPlan& p) {
    allocate(p);
    if (p.weights && file_ok) {
      WeightUnit& u = model_.layer_unit(p.layer);
      std::vector<IoRequest> reqs;
      for (const UnitSegment& g : u.segments()) {
        reqs.push_back({fd, g.file_offset, u.base() + g.unit_offset, g.bytes, false});
        p.read_bytes += g.bytes;
      }
      coalesce_requests(reqs);
      p.weights_ticket = io_->submit(reqs, model_.file().path());
      p.have_weights_ticket = true;
    }
    std::vector<IoRequest> reqs;
    for (size_t i = 0; i < p.stored.size(); ++i) {
      const SwapSlot& s = p.stored[i]->meta.slot;
      reqs.push_back({swap_fd(), s.offset, p.chunk_bufs[i].data(), s.stored, false});
      p.read_bytes += s.stored;
    }
    for (size_t i = 0; i < p.stored_comp.size(); ++i) {
      const ChunkId& c = p.stored_comp[i];
      const SwapSlot& s = c->meta.slot;
      reqs.push_back({swap_fd(), s.offset, p.staging.as<uint8_t>() + p.staging_at[i], s.stored, false});
      p.read_bytes += s.stored;
    }
    if (!reqs.empty()) {
      // All slots live in the one swap file; neighbours in it are read at once.
      coalesce_requests(reqs);
      p.swap_ticket = io_->submit(reqs, swap_->path());
      p.have_swap_ticket = true;
    }
    last_restore_.bytes_read += p.read_bytes;
  };
  auto complete = [&](LayerPlan& p) {
    Stopwatch sw;
    std::string err;
    WeightUnit* read_weights = nullptr;  // read and converted, not yet checked
    if (p.weights) {
      WeightUnit& u = model_.layer_unit(p.layer);
      if (!file_ok) {
        err = file_error;
      } else {
        try {
          io_->wait(p.weights_ticket);
          u.finish_load();
          read_weights = &u;
        } catch (const Error& e) {
          u.release();
          err = e.what();
        }
      }
    }
    bool swap_ok = true;
    if (p.have_swap_ticket) {
      try {
        io_->wait(p.swap_ticket);
      } catch (const Error&) {
        swap_ok = false;  // every chunk of this read is recomputed
      }
    }
    // The checks (CRC-32C of the weight image against its checksum at load,
    // of every swap slot) and the decompression of compressed slots, as
    // independent tasks: the weight image in pieces of kVerifyPiece, joined
    // by crc32c_combine, then one task per chunk.
    const bool check_weights = read_weights && check_bytes && weight_crc_.has(p.layer);
    struct Piece {
      const uint8_t* data;
      uint64_t len;
    };
    std::vector<Piece> pieces;
    uint64_t work_bytes = 0;
    if (check_weights) {
      for (const TensorSlot& s : read_weights->slots())
        for (uint64_t at = 0; at < s.unit_bytes; at += kVerifyPiece)
          pieces.push_back({read_weights->base() + s.unit_offset + at, std::min(kVerifyPiece, s.unit_bytes - at)});
      work_bytes += read_weights->bytes();
    }
    std::vector<uint32_t> piece_crc(pieces.size());
    std::vector<char> ok_raw(p.stored.size()), ok_comp(p.stored_comp.size());
    std::vector<Buffer> out = chunk_buffers(*kv_, p.stored_comp);
    for (const ChunkId& c : p.stored) work_bytes += c->meta.slot.stored;
    for (const ChunkId& c : p.stored_comp) work_bytes += c->alloc_bytes();
    const size_t n_tasks = pieces.size() + p.stored.size() + p.stored_comp.size();
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n_tasks;) {
        if (i < pieces.size()) {
          piece_crc[i] = crc32c(pieces[i].data, pieces[i].len);
          continue;
        }
        i -= pieces.size();
        if (i < p.stored.size()) {
          ok_raw[i] = swap_ok && swap_->verify(p.stored[i]->meta.slot, p.chunk_bufs[i].data());
          continue;
        }
        i -= p.stored.size();
        const ChunkId& c = p.stored_comp[i];
        const KvChunkMeta& m = c->meta;
        const uint8_t* src = p.staging.as<uint8_t>() + p.staging_at[i];
        bool ok = swap_ok && swap_->verify(m.slot, src);
        if (ok) {
          try {
            kv_codec(opts_.codec, opts_.isa).decompress(chunk_shape_n(*c, m.n_tokens), src, m.compressed_bytes,
                                                        out[i].data());
          } catch (const Error&) {
            ok = false;
          }
        }
        ok_comp[i] = ok;
      }
    };
    // A helper thread takes half of a layer's tasks. While the prefill keeps
    // the cores busy, a restore thread checking alone gets a third of the CPU
    // (two compute threads beside it on two cores), and the checks, not the
    // disk, pace the restore; two threads get twice that share, and on idle
    // cores half the latency.
    std::thread helper;
    if (n_tasks > 1 && work_bytes >= kVerifySplit) {
      try {
        helper = std::thread([&] {
          set_current_thread_name("ebb-verify");
          work();
        });
      } catch (const std::system_error&) {
        // No thread to be had: this one does all of it.
      }
    }
    work();
    if (helper.joinable()) helper.join();
    if (check_weights) {
      uint32_t crc = 0;
      for (size_t i = 0; i < pieces.size(); ++i) crc = crc32c_combine(crc, piece_crc[i], pieces[i].len);
      if (crc != weight_crc_.crc(p.layer)) {
        read_weights->release();
        read_weights = nullptr;
        err = weights_changed_message(model_.file().path(), "layer " + std::to_string(p.layer), crc,
                                      weight_crc_.crc(p.layer));
      }
    }
    if (read_weights) ++last_restore_.weights_loaded;
    for (size_t i = 0; i < p.stored.size(); ++i) {
      const ChunkId& c = p.stored[i];
      swap_->free(c->meta.slot);
      ++(put_restored(c, std::move(p.chunk_bufs[i]), ok_raw[i]) ? last_restore_.chunks_read
                                                                   : last_restore_.chunks_lost);
    }
    for (size_t i = 0; i < p.stored_comp.size(); ++i) {
      const ChunkId& c = p.stored_comp[i];
      swap_->free(c->meta.slot);
      ++(put_restored(c, std::move(out[i]), ok_comp[i]) ? last_restore_.chunks_read : last_restore_.chunks_lost);
    }
    p.chunk_bufs.clear();
    p.staging.reset();
    last_restore_.read_s += sw.seconds();
    if (open_latches) latches_->open(p.layer, err);
    else if (!err.empty()) {
      std::lock_guard lock(latches_->mu);
      if (latches_->error[p.layer].empty()) latches_->error[p.layer] = err;
      if (latches_->first_error.empty()) latches_->first_error = err;
    }
  };

  // No overlap of allocation with reads: allocate every layer first.
  if (opts_.overlap == OverlapMode::kNone || opts_.overlap == OverlapMode::kReloadPrefill ||
      opts_.policy == EvictPolicyKind::kPartialOffload)
    for (LayerPlan& p : plan) allocate(p);
  // Layers are submitted ahead of the one completing while less than
  // kReadAhead bytes are queued, so the disk stays busy while this thread
  // verifies and decompresses a layer or is preempted by the forward pass.
  // The partial-offload baseline reads one layer at a time.
  const uint64_t read_ahead = opts_.policy == EvictPolicyKind::kPartialOffload ? 0 : kReadAhead;
  std::deque<LayerPlan*> inflight;
  uint64_t queued = 0;
  for (LayerPlan& p : plan) {
    while (!inflight.empty() && queued >= read_ahead) {
      complete(*inflight.front());
      queued -= inflight.front()->read_bytes;
      inflight.pop_front();
    }
    submit(p);
    inflight.push_back(&p);
    queued += p.read_bytes;
  }
  while (!inflight.empty()) {
    complete(*inflight.front());
    inflight.pop_front();
  }
}

void ElasticMemory::decompress_path(std::vector<LayerPlan>& plan, bool open_latches) {
  const KvCodec& codec = kv_codec(opts_.codec, opts_.isa);
  for (LayerPlan& p : plan) {
    Stopwatch sw;
    std::vector<Buffer> out = chunk_buffers(*kv_, p.compressed);
    for (size_t i = 0; i < p.compressed.size(); ++i) {
      const ChunkId& c = p.compressed[i];
      KvChunkMeta& m = c->meta;
      Buffer b = std::move(out[i]);
      bool ok = true;
      try {
        codec.decompress(chunk_shape_n(*c, m.n_tokens), stack_.data(m.handle), stack_.size(m.handle), b.data());
      } catch (const Error&) {
        ok = false;
      }
      stack_.erase(m.handle);
      {
        std::lock_guard lock(owner_mu_);
        blob_owner_.erase(m.handle);
      }
      // A blob that does not decode is recomputed too (its lost count is
      // left to the I/O path, which owns that counter).
      if (put_restored(c, std::move(b), ok)) ++last_restore_.chunks_decompressed;
    }
    last_restore_.decompress_s += sw.seconds();
    if (open_latches) latches_->open(p.layer);
  }
}

bool ElasticMemory::put_restored(const ChunkId& c, Buffer b, bool ok) {
  if (!ok) {
    // Never used as it is: zeros in place, and the session recomputes from here.
    std::memset(b.data(), 0, b.size());
    c->lost.store(true);
  }
  c->meta = {};
  kv_->put(*c, std::move(b));
  return ok;
}

RestoreReport ElasticMemory::wait_restored() {
  if (restore_thread_.joinable()) restore_thread_.join();
  if (!latches_) return last_restore_;
  const std::string err = latches_->first_error;
  latches_.reset();
  restoring_.store(false);
  if (pool_) pool_->set_spin_iterations(pool_->default_spin_iterations());
  if (!err.empty()) {
    restore_pending_ = true;  // the failed units are still out: the next request tries again
    throw Error(err);
  }
  return last_restore_;
}

LayerWeights ElasticMemory::acquire_layer(int l) {
  if (Latches* lt = latches_.get()) {
    Stopwatch sw;
    lt->wait(l);
    last_restore_.stall_s += sw.seconds();
    std::lock_guard lock(lt->mu);
    if (!lt->error[l].empty()) throw Error(lt->error[l]);
  }
  if (model_.layer_unit(l).resident()) return model_.layer(l);
  if (!streaming_) {
    throw Error("layer " + std::to_string(l) + " of " + model_.file().path() + " is evicted and was not restored");
  }
  // Over the memory limit: this layer comes through a window slot.
  StreamSlot* slot = nullptr;
  for (StreamSlot& s : stream_)
    if (s.layer == l && (s.pending || !s.in_use)) slot = &s;
  if (!slot) {
    for (StreamSlot& s : stream_)
      if (!s.in_use) {
        stream_forget(s);
        stream_submit(s, l);
        slot = &s;
        break;
      }
  }
  EBB_CHECK_MSG(slot, "both streaming slots are in use");
  if (slot->pending) {
    Stopwatch sw;
    stream_wait(*slot);  // throws with the slot emptied when the read or its check failed
    last_restore_.stall_s += sw.seconds();
  }
  slot->in_use = true;
  stream_prefetch();
  return model_.layer_at(l, slot->buf.as<uint8_t>());
}

}  // namespace ebb
