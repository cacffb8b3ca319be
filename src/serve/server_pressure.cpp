// Memory pressure watching (--pressure): each signal evicts a step of the
// footprint (mzCache §6.6: ~15 or ~25 percentage points per onTrimMemory).
//
// The watcher's thread (platform/pressure.h) only counts the signal and
// posts the eviction to the scheduler (sched.call), which runs it at the next
// step boundary through Engine::evict (the hybrid-swap policy); the next
// request restores, as sessions do after any eviction. While one eviction is
// queued or running, further signals are counted but post nothing (the
// memory they ask for is already on its way out).
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <memory>
#include <mutex>

#include "platform/error.h"
#include "platform/pressure.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "serve/server_impl.h"

namespace ebb::serve {
namespace {

// Shared by the watcher's callback and the evictions it posts (which may run
// after the watcher is gone).
struct PressureStats {
  std::mutex mu;
  std::map<std::string, int64_t> signals;  // by source
  int64_t evictions = 0;
  int64_t coalesced = 0;  // signals while an eviction was in flight
  int64_t failed = 0;     // evictions that threw (or could not be posted)
  uint64_t bytes_evicted = 0;
  double last_signal = 0;  // wall clock, seconds since the epoch
  bool in_flight = false;
};

std::string mb(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(b) / 1e6);
  return buf;
}

// The bytes one signal asks for: `step` of the full footprint, i.e. what is
// in RAM plus what earlier evictions moved to storage, so that steps are
// percentage points of the whole (four 25 pp steps evict everything), not a
// shrinking share of what is left.
uint64_t step_bytes(const Footprint& f, double step) {
  uint64_t full = f.total() + f.weights_stored + f.kv_stored;
  if (f.device) full += f.device->total() + f.device->weights_dropped;  // a device engine: its memory too
  return static_cast<uint64_t>(step * static_cast<double>(full));
}

}  // namespace

struct Server::Impl::PressureState {
  std::shared_ptr<PressureStats> stats = std::make_shared<PressureStats>();
  mutable std::mutex mu;  // the watcher pointer: stop() against /metrics
  std::unique_ptr<PressureWatcher> watcher;
  std::string source;  // the concrete source, for the metrics
};

void Server::Impl::start_pressure() {
  if (opts.pressure == "off" || opts.pressure.empty()) return;
  if (pressure_state && pressure_state->watcher) return;
  if (!engine.elastic() && !engine.device())  // a device engine evicts its layers and KV (Engine::evict)
    throw Error("--pressure " + opts.pressure + ": elastic memory is off (budget mode), so nothing could be evicted");
  auto st = std::make_shared<PressureState>();
  PressureWatcherOptions wo;
  wo.min_interval_s = opts.pressure_interval_s;
  try {
    wo.source = parse_pressure_source(opts.pressure);
  } catch (const Error& e) {
    throw Error("--pressure: " + std::string(e.what()));
  }
  std::shared_ptr<PressureStats> stats = st->stats;
  Scheduler* s = &sched;
  const double step = opts.pressure_step;
  auto on_signal = [stats, s, step](const PressureEvent& ev) {
    const std::string src(pressure_source_name(ev.source));
    {
      std::lock_guard lock(stats->mu);
      ++stats->signals[src];
      stats->last_signal = ev.time;
      if (stats->in_flight) {
        ++stats->coalesced;
        std::fprintf(stderr, "ebb serve: memory pressure (%s: %s, %" PRId64 " notifications): an eviction is in flight\n",
                     src.c_str(), ev.what.c_str(), ev.folded);
        return;
      }
      stats->in_flight = true;
    }
    const std::string what = src + ": " + ev.what + ", " + std::to_string(ev.folded) + " notifications";
    try {
      s->call([stats, step, what](Engine& e) {
        try {
          const Footprint before = e.footprint();
          const uint64_t want = step_bytes(before, step);
          const EvictReport r = e.evict(want);
          std::lock_guard lock(stats->mu);
          ++stats->evictions;
          stats->bytes_evicted += r.freed;
          stats->in_flight = false;
          std::fprintf(stderr, "ebb serve: memory pressure (%s): evicted %s of %s asked (%.0f%%) in %.0f ms, %s left in RAM%s%s\n",
                       what.c_str(), mb(r.freed).c_str(), mb(want).c_str(), 100 * step, 1e3 * r.seconds,
                       mb(e.footprint().total()).c_str(), r.note.empty() ? "" : "; ", r.note.c_str());
        } catch (const std::exception& x) {
          std::lock_guard lock(stats->mu);
          ++stats->failed;
          stats->in_flight = false;
          std::fprintf(stderr, "ebb serve: memory pressure (%s): eviction failed: %s\n", what.c_str(), x.what());
        }
      });
    } catch (const std::exception& x) {  // the scheduler is shutting down
      std::lock_guard lock(stats->mu);
      ++stats->failed;
      stats->in_flight = false;
      std::fprintf(stderr, "ebb serve: memory pressure (%s): not evicted: %s\n", what.c_str(), x.what());
    }
  };
  try {
    st->watcher = std::make_unique<PressureWatcher>(wo, on_signal);
  } catch (const Error& e) {
    throw Error("--pressure " + opts.pressure + ": " + e.what());
  }
  st->source = std::string(pressure_source_name(st->watcher->source()));
  std::fprintf(stderr, "ebb serve: watching memory pressure: %s; each signal evicts %.0f pp of the footprint\n",
               st->watcher->description().c_str(), 100 * step);
  pressure_state = std::move(st);
}

void Server::Impl::stop_pressure() {
  // Joins the watcher's thread; evictions already posted still run (they
  // hold the stats). Idempotent: the state and its counters stay for /metrics.
  if (!pressure_state) return;
  std::unique_ptr<PressureWatcher> w;
  {
    std::lock_guard lock(pressure_state->mu);
    w = std::move(pressure_state->watcher);
  }
  w.reset();
}

void Server::Impl::pressure_metrics(std::string& o) const {
  if (!pressure_state) return;
  const PressureState& ps = *pressure_state;
  PressureStats& st = *ps.stats;
  std::lock_guard lock(st.mu);
  metric(o, "ebb_pressure_signals_total", "counter", "Memory pressure signals (debounced) by source");
  if (st.signals.empty()) sample(o, "ebb_pressure_signals_total" + label("source", ps.source), 0);
  for (const auto& [src, n] : st.signals)
    sample(o, "ebb_pressure_signals_total" + label("source", src), static_cast<double>(n));
  metric(o, "ebb_pressure_evictions_total", "counter", "Evictions made on memory pressure signals");
  sample(o, "ebb_pressure_evictions_total", static_cast<double>(st.evictions));
  metric(o, "ebb_pressure_evicted_bytes_total", "counter", "Bytes given back by evictions on memory pressure");
  sample(o, "ebb_pressure_evicted_bytes_total", static_cast<double>(st.bytes_evicted));
  metric(o, "ebb_pressure_coalesced_total", "counter", "Signals that came while an eviction was in flight");
  sample(o, "ebb_pressure_coalesced_total", static_cast<double>(st.coalesced));
  metric(o, "ebb_pressure_eviction_failures_total", "counter", "Evictions on pressure that failed");
  sample(o, "ebb_pressure_eviction_failures_total", static_cast<double>(st.failed));
  metric(o, "ebb_pressure_last_signal_timestamp_seconds", "gauge",
         "Wall-clock time of the last memory pressure signal (0: none yet)");
  sample(o, "ebb_pressure_last_signal_timestamp_seconds", st.last_signal);
  std::lock_guard wlock(ps.mu);
  if (ps.watcher) {
    metric(o, "ebb_pressure_notifications_total", "counter", "Raw kernel notifications (before the debounce)");
    sample(o, "ebb_pressure_notifications_total", static_cast<double>(ps.watcher->notifications()));
  }
}

}  // namespace ebb::serve
