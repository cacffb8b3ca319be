// DeviceForward's memory limit (declared in device_forward.h): what counts
// against it (held), what setting it evicts, and how a step fits under it:
// the dropped layers that fit come back, lowest first (the restore thread
// of device_restore.h), and the rest stream through one or two windows
// (stream_layer; the reader of device_stream.h reads the next streamed layer
// while the device runs this one), as ElasticMemory keeps its limit on the
// CPU (memory/elastic_stream.cpp).
#include <algorithm>
#include <cstdio>

#include "memory/kv_cache.h"
#include "platform/error.h"
#include "runtime/device_forward.h"

namespace ebb {
namespace {

std::string mib(uint64_t b) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.2f MiB (%llu bytes)", static_cast<double>(b) / (1024.0 * 1024.0),
                static_cast<unsigned long long>(b));
  return buf;
}

}  // namespace

uint64_t DeviceForward::held_locked() const {
  const DeviceFootprint f = footprint_locked();
  uint64_t h = f.total() + f.kv_parked + (staging_ ? staging_->size() : 0) + windows_bytes_locked();
  for (int l = 0; l < opts_.first_layer; ++l)
    if (model_.layer_unit(l).resident()) h += model_.layer_unit(l).bytes();
  if (host_kv_) h += host_kv_();
  return h;
}

uint64_t DeviceForward::windows_bytes_locked() const {
  uint64_t b = 0;
  for (const auto& w : windows_) b += w ? w->size() : 0;  // null only while stream_layer records from it
  return b;
}

void DeviceForward::size_windows_locked(int n) {
  windows_.resize(std::min(windows_.size(), static_cast<size_t>(n)));
  uint64_t dev = 0;
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l) dev = std::max(dev, layer_bytes_[l]);
  while (windows_.size() < static_cast<size_t>(n)) {
    windows_.push_back(be_.alloc(dev, MemoryPlace::kDevice));  // throws naming the device when it cannot
    ++n_window_allocs_;
  }
}

uint64_t DeviceForward::window_bytes() const {
  uint64_t dev = 0, host = 0;
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l) {
    dev = std::max(dev, layer_bytes_[l]);
    host = std::max(host, model_.layer_unit(l).bytes());  // the transient copy restore_layer reads into
  }
  return dev + host;
}

uint64_t DeviceForward::restore_room_locked(uint64_t extra) const {
  const uint64_t held = held_locked() + extra;
  const uint64_t room = limit_ > held ? limit_ - held : 0;
  uint64_t need = 0, copy = 0;
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l) {
    if (layers_[l].buf) continue;
    need += layer_bytes_[l];
    copy = std::max(copy, model_.layer_unit(l).bytes());
  }
  if (need + copy <= room) return UINT64_MAX;
  return room > window_bytes() ? room - window_bytes() : 0;
}

uint64_t DeviceForward::kv_growth(const KvCache& kv, int64_t n) const {
  const int64_t cs = kv.options().chunk_size, nd = n_device_layers(), kvd = cfg_.kv_dim();
  auto bytes_at = [&](int64_t cap) {
    return 2 * static_cast<uint64_t>(nd) * static_cast<uint64_t>(cap * cs * kvd) * 2 + 4 * static_cast<uint64_t>(cap);
  };
  int64_t cap = 0;
  uint64_t before = 0;
  if (auto it = kv_.find(&kv); it != kv_.end()) {
    before = it->second.bytes() + it->second.parked.size();  // a parked session comes back at its capacity
    if (it->second.chunk_size == cs) cap = it->second.cap_chunks;
  }
  // kv_for's growth: doubling, at least what is needed, at most the context.
  const int64_t need = (n + cs - 1) / cs;
  int64_t target = cap;
  if (need > cap) {
    const int64_t most = (kv.options().max_tokens + cs - 1) / cs;
    target = std::max(need, std::min(most, std::max<int64_t>(1, 2 * cap)));
  }
  const uint64_t after = bytes_at(target);
  return after > before ? after - before : 0;
}

void DeviceForward::mark_streamed_locked(uint64_t held, uint64_t windows) {
  // Forward-in: the dropped layers that fit beside the windows come back
  // (the restore thread); from the first that does not, the rest stream.
  std::fill(streamed_.begin(), streamed_.end(), 0);
  n_streamed_ = 0;
  uint64_t left = limit_ - held - windows;
  bool out = false;
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l) {
    if (layers_[l].buf) continue;
    if (!out && layer_bytes_[l] <= left) {
      left -= layer_bytes_[l];
      continue;
    }
    out = true;
    streamed_[l] = 1;
    ++n_streamed_;
  }
}

void DeviceForward::plan_step_locked(std::span<const StepSeq> seqs) {
  std::fill(streamed_.begin(), streamed_.end(), 0);
  n_streamed_ = 0;
  n_windows_ = 0;
  if (limit_ == 0) {
    size_windows_locked(0);
    return;
  }
  const int l0 = opts_.first_layer, nl = model_.n_layers();
  // What the step adds before any device layer comes back: its KV growth
  // and a split's CPU layers (they run from host memory; they do not stream).
  uint64_t kv_grow = 0, host_back = 0;
  for (const StepSeq& s : seqs) kv_grow += kv_growth(*s.kv, s.kv->n_tokens() + static_cast<int64_t>(s.tokens.size()));
  for (int l = 0; l < l0; ++l)
    if (!model_.layer_unit(l).resident()) host_back += model_.layer_unit(l).bytes();
  // The windows a past step left are this step's to size again.
  uint64_t held = held_locked() - windows_bytes_locked() + kv_grow + host_back;
  bool any = false;
  uint64_t need = 0, copy = 0;
  for (int l = l0; l < nl; ++l) {
    if (layers_[l].buf) continue;
    any = true;
    need += layer_bytes_[l];
    copy = std::max(copy, model_.layer_unit(l).bytes());
  }
  if (!any ? held <= limit_ : held + need + copy <= limit_) {  // everything fits: as without a limit
    size_windows_locked(0);
    return;
  }
  // Not everything: one layer streams at a time through the window; when
  // even that does not fit, resident layers make way, the last first.
  const uint64_t window = window_bytes();
  for (int l = nl - 1; l >= l0 && held + window > limit_; --l) {
    if (!layers_[l].buf) continue;
    layers_[l].buf.reset();
    held -= layer_bytes_[l];
  }
  if (held + window > limit_) {
    const DeviceFootprint f = footprint_locked();
    const uint64_t host_kv = host_kv_ ? host_kv_() : 0;
    uint64_t cpu_layers = 0;
    for (int l = 0; l < l0; ++l) cpu_layers += model_.layer_unit(l).bytes();
    throw Error(be_.info().id + ": the memory limit of " + mib(limit_) + " does not hold this step: without any device " +
                "layer it needs " + mib(held) + " (KV " + mib(f.kv + f.kv_parked + host_kv + kv_grow) +
                " with this step's growth; output head, scratch and adapters " +
                mib(f.globals + f.scratch + f.adapters + (staging_ ? staging_->size() : 0)) +
                (l0 > 0 ? "; the CPU's layers " + mib(cpu_layers) : std::string()) +
                "), and streaming one layer takes " + mib(window) +
                " more (its device buffer and its host copy); raise the limit or end sessions");
  }
  // One window, or two (the next streamed layer is read while the device
  // runs this one) when the limit holds two beside what is held without
  // weights and the resident layers that make way for the second (the last
  // first; they stream from then on) are fewer than the layers streaming
  // with one: k layers take about k * (read + compute) through one window
  // and (k + e) * max(read, compute) through two.
  mark_streamed_locked(held, window);
  n_windows_ = 1;
  if (n_streamed_ >= 2) {
    uint64_t held2 = held;
    std::vector<int> make_way;
    for (int l = nl - 1; l >= l0 && held2 + 2 * window > limit_; --l) {
      if (!layers_[l].buf) continue;
      held2 -= layer_bytes_[l];
      make_way.push_back(l);
    }
    if (held2 + 2 * window <= limit_ && static_cast<int64_t>(make_way.size()) < n_streamed_) {
      for (int l : make_way) layers_[l].buf.reset();
      held = held2;
      mark_streamed_locked(held, 2 * window);
      n_windows_ = 2;
    }
  }
  size_windows_locked(n_windows_);
}

void DeviceForward::start_stream(LayerStreamer& st, int l, int from, LayerRestorer* restorer) {
  if (st.started() || l < from) return;
  if (restorer) restorer->finish();  // with timelines its reads may still run: no two host copies at once
  stream_held_ = held_locked();  // nothing else changes it until the step ends but the reader's host copy
  st.start();
}

void DeviceForward::stream_read(int l, int window) {
  const uint64_t host = model_.layer_unit(l).bytes();
  if (stream_hooks_.before_read) stream_hooks_.before_read(l, stream_held_);
  stream_host_live_.store(host);
  struct Live {
    std::atomic<uint64_t>& b;
    ~Live() { b.store(0); }
  } live{stream_host_live_};
  restore_layer_into(l, *windows_[static_cast<size_t>(window)]);  // layers_[l]'s layout, computed at load
  if (stream_hooks_.after_read) stream_hooks_.after_read(l, stream_held_ + host);
}

void DeviceForward::stream_layer(BackendStream& s, LayerStreamer& st, int l, std::span<const StepSeq> seqs,
                                 int64_t n) {
  auto submitted = [&](int last) {
    if (stream_hooks_.after_submit) stream_hooks_.after_submit(last, held_locked() + stream_host_live_.load());
  };
  bool in_flight = false;
  if (!st.ready(l) && s.n_recorded() > 0) {  // the layers before l run while l is read
    s.submit();
    submitted(l - 1);
    in_flight = true;
  }
  const int w = st.acquire(l);  // throws naming l when its read failed (run_on waits the stream out)
  if (in_flight) s.wait();
  {  // recorded from the window, with the layout computed at load (layers_[l] keeps it while dropped)
    struct Lend {
      std::unique_ptr<BackendBuffer>& window;
      std::unique_ptr<BackendBuffer>& layer;
      ~Lend() { window = std::move(layer); }
    } lend{windows_[static_cast<size_t>(w)], layers_[l].buf};
    layers_[l].buf = std::move(windows_[static_cast<size_t>(w)]);
    record_layer(s, layers_[l], l, seqs, n);
  }
  s.submit();
  submitted(l);
  if (stream_hooks_.before_wait) stream_hooks_.before_wait(l);
  s.wait();
  st.release(l);  // the window is free for the layer after next
}

DeviceForward::Evicted DeviceForward::set_memory_limit(uint64_t bytes, std::function<uint64_t()> host_kv) {
  std::lock_guard lock(mu_);
  host_kv_ = std::move(host_kv);
  Evicted e;
  if (bytes == 0) {
    limit_ = 0;
    return e;
  }
  const int l0 = opts_.first_layer, nl = model_.n_layers();
  const uint64_t held = held_locked() - windows_bytes_locked();  // the windows go with a new limit
  uint64_t resident = 0, all = 0, host_dropped = 0;
  for (int l = l0; l < nl; ++l) {
    all += layer_bytes_[l];
    if (layers_[l].buf) resident += layer_bytes_[l];
  }
  for (int l = 0; l < l0; ++l)
    if (!model_.layer_unit(l).resident()) host_dropped += model_.layer_unit(l).bytes();
  const uint64_t base = held - resident + host_dropped;  // held with no device layer and every CPU layer back
  if (bytes < base + window_bytes() && bytes < base + all) {
    throw Error(be_.info().id + ": a memory limit of " + mib(bytes) + " is below what a step needs: " + mib(base) +
                " without any device layer (KV, output head, scratch" + (l0 > 0 ? ", the CPU's layers" : "") +
                ") and " + mib(window_bytes()) +
                " to stream one layer (its device buffer and its host copy); the smallest limit is " +
                mib(std::min(base + window_bytes(), base + all)));
  }
  limit_ = bytes;
  size_windows_locked(0);
  // Down to it now: weight layers, the last first (parking KV would move it
  // to the host, which the limit counts as well).
  const uint64_t before = be_.ledger(MemoryPlace::kDevice).buffer_bytes;
  for (int l = nl - 1; l >= l0 && held_locked() > limit_; --l) {
    if (!layers_[l].buf) continue;
    layers_[l].buf.reset();
    ++e.layers;
  }
  e.freed = before - be_.ledger(MemoryPlace::kDevice).buffer_bytes;
  return e;
}

uint64_t DeviceForward::memory_limit() const {
  std::lock_guard lock(mu_);
  return limit_;
}

uint64_t DeviceForward::held() const {
  std::lock_guard lock(mu_);
  return held_locked();
}

int64_t DeviceForward::n_streamed_last_step() const {
  std::lock_guard lock(mu_);
  return n_streamed_;
}

int DeviceForward::n_stream_windows() const {
  std::lock_guard lock(mu_);
  return n_windows_;
}

int64_t DeviceForward::n_stream_window_allocs() const {
  std::lock_guard lock(mu_);
  return n_window_allocs_;
}

void DeviceForward::set_stream_hooks(DeviceStreamHooks hooks) {
  std::lock_guard lock(mu_);
  stream_hooks_ = std::move(hooks);
}

}  // namespace ebb
