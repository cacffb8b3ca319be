#include "runtime/scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <set>

#include "memory/prefix_cache.h"
#include "platform/cgroup.h"
#include "platform/thread_name.h"
#include "platform/timer.h"
#include "runtime/batch.h"
#include "runtime/device_forward.h"
#include "runtime/grammar/constraint.h"

namespace ebb {

namespace {

// The foreground class's slot in round-robin's rotation, and the kind
// generation rounds are attributed to.
constexpr const char* kForegroundSlot = "\x01foreground";
constexpr const char* kInferenceKind = "inference";
constexpr size_t kRecentWaits = 4096;

uint64_t meminfo_available() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return std::numeric_limits<uint64_t>::max();
  char line[256];
  uint64_t kib = 0;
  bool found = false;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long v = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
      kib = v;
      found = true;
      break;
    }
  }
  std::fclose(f);
  return found ? kib * 1024 : std::numeric_limits<uint64_t>::max();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

std::string_view sched_policy_name(SchedPolicy p) {
  switch (p) {
    case SchedPolicy::kForegroundFirst: return "foreground-first";
    case SchedPolicy::kRoundRobin: return "round-robin";
    case SchedPolicy::kFifo: return "fifo";
  }
  return "?";
}

std::optional<SchedPolicy> parse_sched_policy(std::string_view name) {
  for (SchedPolicy p : {SchedPolicy::kForegroundFirst, SchedPolicy::kRoundRobin, SchedPolicy::kFifo})
    if (name == sched_policy_name(p)) return p;
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// GenerationStream

std::optional<GenerationEvent> GenerationStream::next(double timeout_s) {
  std::unique_lock lock(mu_);
  const auto ready = [this] { return !events_.empty(); };
  if (timeout_s <= 0) {
    if (!ready()) return std::nullopt;
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready)) {
    return std::nullopt;
  }
  GenerationEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void GenerationStream::push(GenerationEvent e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------
// Work items

// A foreground submission waiting for admission: a generation or a task.
struct Scheduler::FgItem {
  uint64_t seq = 0;
  double submitted = 0;
  int priority = 0;
  std::string kind;
  // A generation request...
  std::optional<GenerationRequest> gen;
  std::shared_ptr<GenerationStream> stream;
  // ... or a generic task.
  std::optional<Task> task;
  TaskId id = 0;
  bool cancelled = false;  // cancel(id) while waiting
  bool deferred_memory = false;  // held back by the memory limit (counted once)
};

struct Scheduler::BgItem {
  uint64_t seq = 0;
  TaskId id = 0;
  double submitted = 0;
  Task task;
  Ema step_s, memory;
  double run_s = 0;
  bool cancelled = false;
  bool deferred_memory = false, deferred_window = false;  // counted once per episode
  double window_since = 0;  // when the window rule began holding it back on an idle engine (0: not)
  bool over_window = false;  // admissible now only by window_starvation_s
  double offload_at = -1e9;  // when it last asked for an offload
  bool offloaded = false;    // admitted only after an offload made room (counted once)
  bool admissible = false;   // at the last pick
  double passed_over_s = 0;  // background seconds others ran while it was admissible, since its own last step
};

// An admitted foreground item (scheduler thread only).
struct Scheduler::Running {
  uint64_t seq = 0;
  std::string kind;
  std::shared_ptr<GenerationStream> stream;
  std::unique_ptr<Session> session;
  std::unique_ptr<Generation> gen;  // destroyed before session
  int64_t counted_tokens = 0;       // generated tokens already in the metrics
  uint64_t kv_reserved = 0;         // KV bytes this generation may grow to (under a memory limit)
  std::optional<Task> task;
  TaskId id = 0;
  // Choices: which one this is; the leader (choice 0) keeps the request
  // until its prompt is in and it has forked the others.
  int choice = 0;
  int forks_left = 0;
  std::optional<GenerationRequest> fork_req;
  std::vector<StepLogprobs> tokens;  // sampled since the last event
  ~Running() { gen.reset(); }
};

struct Scheduler::Unit {
  enum class Type { kNone, kForeground, kBackground };
  Type type = Type::kNone;
  std::vector<std::unique_ptr<FgItem>> admit;  // kForeground: joining this round
  BgItem* bg = nullptr;                        // kBackground
};

// ---------------------------------------------------------------------------
// Scheduler

Scheduler::Scheduler(Engine* engine, SchedulerOptions opts)
    : engine_(engine),
      opts_(std::move(opts)),
      window_s_(opts_.background_window_s),
      decode_rate_(opts_.ema_alpha) {
  if (opts_.max_batch < 1) throw Error("scheduler: max_batch must be >= 1");
  if (opts_.max_queue < 0 || opts_.max_background < 0) throw Error("scheduler: queue bounds must be >= 0");
  recent_waits_.reserve(kRecentWaits);
  if (!opts_.free_memory) {
    const std::optional<CgroupMemoryLimit> cg = cgroup_memory_limit();
    const uint64_t limit = cg ? cg->bytes : 0;
    opts_.free_memory = [limit] {
      uint64_t free = meminfo_available();
      if (limit > 0) {
        const uint64_t rss = resident_bytes();
        free = std::min(free, limit > rss ? limit - rss : 0);
      }
      return free;
    };
  }
  if (!opts_.used_memory && engine_) {
    opts_.used_memory = [e = engine_] { return static_cast<uint64_t>(std::max<int64_t>(0, e->ledger().total())); };
  }
  m_.has_engine = engine_ != nullptr;
  if (engine_) {
    m_.prefix_cache_on = engine_->prefix_cache() != nullptr;
    engine_->set_kv_spare_limit(opts_.kv_spare_bytes);
    m_.footprint = engine_->footprint();
  }
  last_work_ = now_seconds();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(0); }

void Scheduler::shutdown(double grace_s) {
  {
    std::lock_guard lock(mu_);
    const double deadline = now_seconds() + std::max(0.0, grace_s);
    if (!stopping_) {
      stopping_ = true;
      stop_deadline_ = deadline;
    } else {
      stop_deadline_ = std::min(stop_deadline_, deadline);
    }
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

std::shared_ptr<GenerationStream> Scheduler::submit_generation(GenerationRequest req) {
  if (!engine_) throw Error("scheduler: generation requests need an engine");
  auto stream = std::make_shared<GenerationStream>();
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      ++m_.fg_rejected;
      throw SchedulerBusy("the server is shutting down");
    }
    if (static_cast<int>(fg_queue_.size()) >= opts_.max_queue) {
      ++m_.fg_rejected;
      throw SchedulerBusy("the request queue is full (" + std::to_string(opts_.max_queue) +
                          " requests wait); retry later");
    }
    auto item = std::make_unique<FgItem>();
    item->seq = next_seq_++;
    stream->id_ = item->seq;
    item->submitted = now_seconds();
    item->priority = req.priority;
    item->kind = kInferenceKind;
    item->gen = std::move(req);
    item->stream = stream;
    fg_queue_.push_back(std::move(item));
    ++m_.fg_submitted;
    fg_waiting_.store(static_cast<int64_t>(fg_queue_.size()), std::memory_order_relaxed);
  }
  cv_.notify_all();
  return stream;
}

TaskId Scheduler::submit(Task task) {
  if (!task.step) throw Error("scheduler: a task needs a step callback");
  TaskId id = 0;
  {
    std::lock_guard lock(mu_);
    const bool fg = task.desc.cls == TaskClass::kForeground;
    if (stopping_) {
      ++(fg ? m_.fg_rejected : m_.bg_rejected);
      throw SchedulerBusy("the scheduler is shutting down");
    }
    if (fg ? static_cast<int>(fg_queue_.size()) >= opts_.max_queue
           : static_cast<int>(bg_queue_.size()) >= opts_.max_background) {
      ++(fg ? m_.fg_rejected : m_.bg_rejected);
      throw SchedulerBusy(std::string("the ") + (fg ? "foreground" : "background") + " queue is full");
    }
    if (task.desc.kind.empty()) task.desc.kind = fg ? "foreground" : "background";
    apply_kind_estimates_locked(task.desc);
    id = next_seq_++;
    if (fg) {
      auto item = std::make_unique<FgItem>();
      item->seq = id;
      item->id = id;
      item->submitted = now_seconds();
      item->priority = task.desc.priority;
      item->kind = task.desc.kind;
      item->task = std::move(task);
      fg_queue_.push_back(std::move(item));
      ++m_.fg_submitted;
      fg_waiting_.store(static_cast<int64_t>(fg_queue_.size()), std::memory_order_relaxed);
    } else {
      auto item = std::make_unique<BgItem>();
      item->seq = id;
      item->id = id;
      item->submitted = now_seconds();
      item->step_s = Ema(opts_.ema_alpha);
      item->memory = Ema(opts_.ema_alpha);
      // Declared estimates seed the averages that measured steps then move.
      if (task.desc.next_yield_s > 0) item->step_s.add(task.desc.next_yield_s);
      if (task.desc.est_memory > 0) item->memory.add(static_cast<double>(task.desc.est_memory));
      item->task = std::move(task);
      bg_queue_.push_back(std::move(item));
      ++m_.bg_submitted;
      m_.bg_waiting = static_cast<int64_t>(bg_queue_.size());
    }
  }
  cv_.notify_all();
  return id;
}

void Scheduler::cancel(TaskId id) {
  {
    std::lock_guard lock(mu_);
    bool waiting = false;
    for (auto& f : fg_queue_)
      if (f->task && f->id == id) waiting = f->cancelled = true;
    for (auto& b : bg_queue_)
      if (b->id == id) waiting = b->cancelled = true;
    // Else it may be a running foreground task: it ends before its next step.
    if (!waiting && id > 0 && id < next_seq_) cancelled_running_.insert(id);
  }
  cv_.notify_all();
}

void Scheduler::set_background_window(double seconds) {
  {
    std::lock_guard lock(mu_);
    window_s_ = seconds;
  }
  cv_.notify_all();
}

std::optional<TaskDescriptor> Scheduler::descriptor(TaskId id) const {
  std::lock_guard lock(mu_);
  for (const auto& b : bg_queue_)
    if (b->id == id) return b->task.desc;
  for (const auto& f : fg_queue_)
    if (f->task && f->id == id) return f->task->desc;
  return std::nullopt;
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard lock(mu_);
  SchedulerMetrics m = m_;
  m.fg_waiting = static_cast<int64_t>(fg_queue_.size());
  m.bg_waiting = static_cast<int64_t>(bg_queue_.size());
  m.wait_p50_s = percentile(recent_waits_, 0.50);
  m.wait_p95_s = percentile(recent_waits_, 0.95);
  m.wait_p99_s = percentile(recent_waits_, 0.99);
  m.bg_pending_memory = m.bg_pending_window = 0;
  for (const auto& b : bg_queue_) {
    m.bg_pending_memory += b->deferred_memory ? 1 : 0;
    m.bg_pending_window += b->deferred_window ? 1 : 0;
  }
  return m;
}

uint64_t Scheduler::memory_headroom() const {
  const uint64_t free = free_memory();
  return free > opts_.memory_reserve ? free - opts_.memory_reserve : 0;
}

uint64_t Scheduler::free_memory() const { return opts_.free_memory ? opts_.free_memory() : 0; }
uint64_t Scheduler::used_memory() const { return opts_.used_memory ? opts_.used_memory() : 0; }

Scheduler::KindCost& Scheduler::kind_cost_locked(const std::string& kind) {
  auto it = kind_costs_.find(kind);
  if (it == kind_costs_.end())
    it = kind_costs_.emplace(kind, KindCost{Ema(opts_.ema_alpha), Ema(opts_.ema_alpha), Ema(opts_.ema_alpha)}).first;
  return it->second;
}

void Scheduler::apply_kind_estimates_locked(TaskDescriptor& d) {
  const auto it = kind_costs_.find(d.kind);
  if (it == kind_costs_.end()) return;
  const KindCost& k = it->second;
  if (d.next_yield_s <= 0 && k.step_s.set()) d.next_yield_s = k.step_s.value();
  if (d.est_memory == 0 && k.memory.set()) d.est_memory = static_cast<uint64_t>(k.memory.value());
  if (d.est_duration_s <= 0 && k.duration_s.set()) d.est_duration_s = k.duration_s.value();
}

uint64_t Scheduler::engine_memory_limit() const { return engine_ ? engine_->memory_limit() : 0; }

uint64_t Scheduler::in_ram_under_limit() const {
  // On a device the limit bounds what both sides hold (DeviceForward::held).
  if (const DeviceForward* d = engine_->device()) return d->held();
  const Footprint f = engine_->footprint();
  return f.weights() + f.kv() + f.compressed + f.io_buffers;
}

uint64_t Scheduler::make_room(uint64_t bytes) {
  PrefixCache* pc = engine_->prefix_cache();
  if (!pc || bytes == 0) return 0;
  const uint64_t held = pc->private_bytes();
  return pc->trim(held > bytes ? held - bytes : 0);
}

uint64_t Scheduler::kv_projection(const GenerationRequest& g) const {
  const ModelConfig& c = engine_->config();
  const uint64_t elem = g.session.kv_type == DType::kF32 ? 4 : 2;
  const uint64_t per_token = static_cast<uint64_t>(c.n_layer * c.kv_dim()) * 2 * elem;
  int64_t n_ctx = g.session.n_ctx > 0 ? g.session.n_ctx : std::min<int64_t>(c.n_ctx_train > 0 ? c.n_ctx_train : 4096, 4096);
  const int64_t prompt = static_cast<int64_t>(g.prompt.size());
  const int64_t gen = g.options.max_tokens > 0 ? g.options.max_tokens : n_ctx;
  const int64_t per_choice = std::min(n_ctx, prompt + gen);
  const int64_t chunk = g.session.kv_chunk_size > 0 ? g.session.kv_chunk_size : 256;
  const auto whole = [chunk](int64_t t) { return (t + chunk - 1) / chunk * chunk; };
  // Choices beyond the first share the prompt's full chunks and grow their
  // own from the prompt's last (partial, copied) chunk on.
  const int64_t own = whole(per_choice) - prompt / chunk * chunk;
  const int64_t tokens = whole(per_choice) + std::max(0, g.n_choices - 1) * own;
  return per_token * static_cast<uint64_t>(tokens);
}

bool Scheduler::no_foreground_locked() const { return fg_queue_.empty() && running_.empty(); }

bool Scheduler::admissible_locked(BgItem& b, uint64_t free_mem, bool count) {
  const TaskDescriptor& d = b.task.desc;
  // m̂ + M_reserve <= M_free, without overflow.
  const auto fits = [&](uint64_t free) { return d.est_memory <= free && opts_.memory_reserve <= free - d.est_memory; };
  bool mem_ok = fits(free_mem);
  // Offload before admission: only when the task could run now (count),
  // and not again before offload_retry_s.
  if (!mem_ok && count && opts_.offload &&
      std::find(opts_.offload_kinds.begin(), opts_.offload_kinds.end(), d.kind) != opts_.offload_kinds.end() &&
      now_seconds() - b.offload_at >= opts_.offload_retry_s) {
    b.offload_at = now_seconds();
    const uint64_t need = d.est_memory + opts_.memory_reserve;
    const uint64_t shortfall = need > free_mem ? need - free_mem : 1;
    ++m_.offload_requests;
    m_.offload_freed_bytes += opts_.offload(shortfall);
    mem_ok = fits(free_memory());
    if (mem_ok && !b.offloaded) {
      b.offloaded = true;
      ++m_.offload_admitted;
    }
    if (!mem_ok) ++m_.offload_short;
  }
  // ŷ + δ <= W_bg.
  bool win_ok = d.next_yield_s + opts_.margin_s <= window_s_;
  if (count) {
    if (!mem_ok && !b.deferred_memory) ++m_.bg_deferred_memory;
    if (!win_ok && !b.deferred_window) ++m_.bg_deferred_window;
    b.deferred_memory = !mem_ok;
    b.deferred_window = !win_ok;
  }
  // Starvation: held back by the window alone on an idle engine for
  // window_starvation_s, it runs past the window until foreground work
  // comes (the episode ends then, and the window rule holds again).
  // The episode is the kind's: a new task of the kind continues it.
  b.over_window = false;
  if (!no_foreground_locked()) {
    b.window_since = 0;
  } else if (win_ok) {
    b.window_since = 0;
  } else {
    if (b.window_since == 0) {
      const auto k = window_since_kind_.try_emplace(d.kind, now_seconds()).first;
      b.window_since = k->second;
    }
    if (mem_ok && opts_.window_starvation_s > 0 && now_seconds() - b.window_since >= opts_.window_starvation_s) {
      win_ok = true;
      b.over_window = true;
    }
  }
  return mem_ok && win_ok;
}

void Scheduler::reap_cancelled_locked(std::vector<std::function<void()>>& after) {
  const bool all = stopping_;
  for (auto it = fg_queue_.begin(); it != fg_queue_.end();) {
    FgItem& f = **it;
    const bool gone = all || f.cancelled || (f.stream && f.stream->cancelled());
    if (!gone) {
      ++it;
      continue;
    }
    ++m_.fg_cancelled;
    if (f.task) cancelled_running_.erase(f.id);
    if (f.stream) {
      GenerationEvent e;
      e.kind = GenerationEvent::Kind::kDone;
      e.stats.stop = StopReason::kCancelled;
      f.stream->push(std::move(e));
    } else if (f.task && f.task->on_done) {
      after.push_back([cb = std::move(f.task->on_done)] { cb(TaskOutcome::kCancelled, ""); });
    }
    it = fg_queue_.erase(it);
  }
  for (auto it = bg_queue_.begin(); it != bg_queue_.end();) {
    BgItem& b = **it;
    if (!(all || b.cancelled)) {
      ++it;
      continue;
    }
    ++m_.bg_cancelled;
    cancelled_running_.erase(b.id);
    if (b.task.on_done) after.push_back([cb = std::move(b.task.on_done)] { cb(TaskOutcome::kCancelled, ""); });
    if (fifo_active_ == &b) fifo_active_ = nullptr;
    it = bg_queue_.erase(it);
  }
  fg_waiting_.store(static_cast<int64_t>(fg_queue_.size()), std::memory_order_relaxed);
  m_.bg_waiting = static_cast<int64_t>(bg_queue_.size());
}

Scheduler::Unit Scheduler::pick_locked(uint64_t free_mem) {
  Unit u;
  const bool fg_ready = !fg_queue_.empty() || !running_.empty();
  if (fg_ready) window_since_kind_.clear();  // foreground work ends every starvation episode
  // Admissible background tasks (counting deferrals only when background
  // work could run now, so a task held back while foreground runs is not
  // counted as deferred by memory or window).
  const bool bg_could_run = opts_.policy != SchedPolicy::kForegroundFirst || !fg_ready;
  std::vector<BgItem*> ok;
  for (auto& b : bg_queue_) {
    b->admissible = admissible_locked(*b, free_mem, bg_could_run);
    if (b->admissible) ok.push_back(b.get());
  }
  const double aging = opts_.background_aging_s;
  const auto aged = [aging](const BgItem* b) { return aging > 0 && b->passed_over_s >= aging; };
  const auto better = [&aged](const BgItem* a, const BgItem* b) {
    if (a->task.desc.priority != b->task.desc.priority) return a->task.desc.priority > b->task.desc.priority;
    if (aged(a) != aged(b)) return aged(a);
    if (aged(a) && a->passed_over_s != b->passed_over_s) return a->passed_over_s > b->passed_over_s;
    if (a->task.desc.utility != b->task.desc.utility) return a->task.desc.utility > b->task.desc.utility;
    return a->seq < b->seq;
  };
  const auto best_of = [&](const std::string* kind) {
    BgItem* best = nullptr;
    for (BgItem* b : ok)
      if ((!kind || b->task.desc.kind == *kind) && (!best || better(b, best))) best = b;
    if (kind || !best || opts_.background_shares.empty()) return best;
    // Guaranteed shares: among the tasks of the best one's priority, a kind
    // below its share of recent background time goes first (the one
    // furthest below its share).
    BgItem* owed = nullptr;
    double deficit = 0;
    for (BgItem* b : ok) {
      if (b->task.desc.priority != best->task.desc.priority) continue;
      const auto sh = opts_.background_shares.find(b->task.desc.kind);
      if (sh == opts_.background_shares.end()) continue;
      const auto r = bg_recent_s_.find(b->task.desc.kind);
      const double d = sh->second * bg_recent_total_s_ - (r == bg_recent_s_.end() ? 0.0 : r->second);
      if (d <= 0) continue;
      if (!owed || d > deficit || (b->task.desc.kind == owed->task.desc.kind && better(b, owed))) {
        owed = b;
        deficit = d;
      }
    }
    if (owed && owed != best && owed->task.desc.kind != best->task.desc.kind) {
      ++m_.bg_share;
      return owed;
    }
    return best;
  };
  // Moves waiting foreground items into this round, up to the batch limit:
  // by priority then arrival, or (fifo) by arrival up to `before`.
  // Under a memory limit, a generation joins only while what is in RAM,
  // the KV the running ones may still grow to and its own fit the limit;
  // otherwise it waits for them to finish (alone, it is admitted and
  // start_generation() evicts to make room, or refuses it).
  const uint64_t limit = engine_memory_limit();
  uint64_t committed = 0;
  if (limit > 0) {
    committed = in_ram_under_limit();
    for (const auto& r : running_) committed += r->kv_reserved;
  }
  const auto fits = [&](FgItem& f) {
    if (limit == 0 || !f.gen) return true;
    const uint64_t need = kv_projection(*f.gen);
    if (running_.empty() && u.admit.empty()) {  // alone: start_generation() makes room or refuses it
      committed += need;
      return true;
    }
    if (committed + need > limit) committed -= make_room(committed + need - limit);
    if (committed + need <= limit) {
      committed += need;
      return true;
    }
    if (!f.deferred_memory) ++m_.fg_deferred_memory;
    f.deferred_memory = true;
    return false;
  };
  const auto admit = [&](uint64_t before) {
    size_t used = 0;  // a generation's choices still to fork hold their slots
    for (const auto& r : running_) used += 1 + static_cast<size_t>(r->forks_left);
    size_t room = static_cast<size_t>(opts_.max_batch) - std::min(used, static_cast<size_t>(opts_.max_batch));
    const auto slots = [](const FgItem& f) { return f.gen ? static_cast<size_t>(std::max(1, f.gen->n_choices)) : 1; };
    if (opts_.policy != SchedPolicy::kFifo) {
      std::stable_sort(fg_queue_.begin(), fg_queue_.end(), [](const auto& a, const auto& b) {
        return a->priority != b->priority ? a->priority > b->priority : a->seq < b->seq;
      });
    }
    // A request of more choices than max_batch runs alone.
    while (room > 0 && !fg_queue_.empty() && fg_queue_.front()->seq < before &&
           (slots(*fg_queue_.front()) <= room || (running_.empty() && u.admit.empty())) &&
           fits(*fg_queue_.front())) {
      room -= std::min(room, slots(*fg_queue_.front()));
      u.admit.push_back(std::move(fg_queue_.front()));
      fg_queue_.pop_front();
    }
    fg_waiting_.store(static_cast<int64_t>(fg_queue_.size()), std::memory_order_relaxed);
    u.type = Unit::Type::kForeground;
  };
  const uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

  switch (opts_.policy) {
    case SchedPolicy::kForegroundFirst: {
      if (fg_ready) {
        // A kind below its guaranteed share takes one bounded step first,
        // at most one between two foreground rounds.
        BgItem* b = owed_ran_last_ || !opts_.shares_over_foreground ? nullptr : owed_over_foreground_locked(ok);
        if (b) {
          ++m_.bg_share_fg;
          owed_ran_last_ = true;
          u.type = Unit::Type::kBackground;
          u.bg = b;
        } else {
          owed_ran_last_ = false;
          admit(kNoLimit);
        }
      } else if (BgItem* b = best_of(nullptr)) {
        u.type = Unit::Type::kBackground;
        u.bg = b;
      }
      break;
    }
    case SchedPolicy::kRoundRobin: {
      std::vector<std::string> ready;
      if (fg_ready) ready.push_back(kForegroundSlot);
      for (BgItem* b : ok)
        if (std::find(ready.begin(), ready.end(), b->task.desc.kind) == ready.end()) ready.push_back(b->task.desc.kind);
      for (const std::string& k : ready)
        if (std::find(rr_kinds_.begin(), rr_kinds_.end(), k) == rr_kinds_.end()) rr_kinds_.push_back(k);
      if (ready.empty()) break;
      for (size_t i = 0; i < rr_kinds_.size(); ++i) {
        const size_t at = (rr_next_ + i) % rr_kinds_.size();
        const std::string& k = rr_kinds_[at];
        if (std::find(ready.begin(), ready.end(), k) == ready.end()) continue;
        rr_next_ = at + 1;
        if (k == kForegroundSlot) {
          admit(kNoLimit);
        } else {
          u.type = Unit::Type::kBackground;
          u.bg = best_of(&k);
        }
        break;
      }
      break;
    }
    case SchedPolicy::kFifo: {
      if (fifo_active_) {  // admitted: runs to its end
        u.type = Unit::Type::kBackground;
        u.bg = fifo_active_;
        break;
      }
      BgItem* oldest_bg = nullptr;
      for (BgItem* b : ok)
        if (!oldest_bg || b->seq < oldest_bg->seq) oldest_bg = b;
      const uint64_t bg_seq = oldest_bg ? oldest_bg->seq : kNoLimit;
      uint64_t fg_seq = kNoLimit;
      for (const auto& r : running_) fg_seq = std::min(fg_seq, r->seq);
      if (!fg_queue_.empty()) fg_seq = std::min(fg_seq, fg_queue_.front()->seq);
      if (fg_seq < bg_seq) {
        admit(bg_seq);
      } else if (oldest_bg) {
        fifo_active_ = oldest_bg;
        u.type = Unit::Type::kBackground;
        u.bg = oldest_bg;
      }
      break;
    }
  }
  return u;
}

void Scheduler::post_control(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (ended_) throw SchedulerBusy("the scheduler has shut down");
    control_.push_back(std::move(fn));
  }
  cv_.notify_all();
}

bool Scheduler::run_control() {
  std::deque<std::function<void()>> work;
  {
    std::lock_guard lock(mu_);
    work.swap(control_);
  }
  for (auto& fn : work) fn();  // packaged tasks: exceptions go to their futures
  if (!work.empty()) {
    std::lock_guard lock(mu_);
    snapshot_dirty_ = true;
  }
  return !work.empty();
}

void Scheduler::loop() {
  set_current_thread_name("ebb-sched");
  for (;;) {
    if (run_control()) {
      refresh_snapshot(true);
      last_work_ = now_seconds();
    }
    std::vector<std::function<void()>> after;  // completion callbacks, run without the lock
    Unit u;
    bool quit = false;
    {
      std::unique_lock lock(mu_);
      reap_cancelled_locked(after);
      if (stopping_ && now_seconds() >= stop_deadline_) {
        for (auto& r : running_) {
          if (r->gen) r->gen->cancel();
          if (r->task) cancelled_running_.insert(r->id);
        }
      }
      if (stopping_ && fg_queue_.empty() && bg_queue_.empty() && running_.empty()) {
        quit = true;
      } else {
        u = pick_locked(free_memory());
        if (u.type == Unit::Type::kNone && after.empty() && control_.empty()) {
          lock.unlock();
          // Idle: spare KV buffers kept for the next request go back after
          // a while (a burst reuses them; a quiet server holds nothing).
          if (engine_ && engine_->kv_pool().spare_bytes() > 0 && now_seconds() - last_work_ >= opts_.kv_spare_idle_s) {
            engine_->kv_pool().release_spare();
            snapshot_dirty_ = true;
          }
          refresh_snapshot(true);
          lock.lock();
          // Woken by a submission, a cancellation or shutdown; the timeout
          // rechecks what changes without notice (free memory, streams that
          // were cancelled while waiting).
          const bool bg_waiting = !bg_queue_.empty();
          const double idle0 = now_seconds();
          cv_.wait_for(lock, std::chrono::milliseconds(100));
          const double idle = now_seconds() - idle0;
          m_.idle_s += idle;
          if (bg_waiting) m_.idle_bg_waiting_s += idle;
          continue;
        }
      }
    }
    for (auto& f : after) f();
    if (quit) {
      {
        std::lock_guard lock(mu_);
        ended_ = true;  // no call() is taken from now on
      }
      run_control();  // those posted while shutting down still get their answer
      break;
    }
    if (u.type == Unit::Type::kForeground) {
      run_foreground_round(std::move(u.admit));
    } else if (u.type == Unit::Type::kBackground) {
      run_background_step(*u.bg);
    }
    last_work_ = now_seconds();
    refresh_snapshot(false);
  }
  if (engine_) engine_->set_kv_spare_limit(0);  // the engine's next owner starts without spare buffers
  refresh_snapshot(true);
}

void Scheduler::record_wait_locked(double seconds) {
  ++m_.wait_count;
  m_.wait_sum_s += seconds;
  m_.wait_max_s = std::max(m_.wait_max_s, seconds);
  if (recent_waits_.size() < kRecentWaits) {
    recent_waits_.push_back(seconds);
  } else {
    recent_waits_[recent_next_] = seconds;
    recent_next_ = (recent_next_ + 1) % kRecentWaits;
  }
}

void Scheduler::attribute_wait_locked(const std::string& kind, double seconds) {
  const double end = now_seconds();
  double total = 0;
  for (const auto& f : fg_queue_) total += std::min(seconds, std::max(0.0, end - f->submitted));
  if (total > 0) m_.wait_behind_s[kind] += total;
}

void Scheduler::start_generation(FgItem& item) {
  auto r = std::make_unique<Running>();
  r->seq = item.seq;
  r->kind = item.kind;
  r->stream = item.stream;
  GenerationRequest& req = *item.gen;
  try {
    if (const uint64_t limit = engine_memory_limit(); limit > 0) {
      r->kv_reserved = kv_projection(req);
      uint64_t committed = in_ram_under_limit();
      for (const auto& x : running_) committed += x->kv_reserved;
      if (committed + r->kv_reserved > limit) committed -= make_room(committed + r->kv_reserved - limit);
      if (running_.empty() && committed + r->kv_reserved > limit) {
        engine_->evict(committed + r->kv_reserved - limit);  // between requests: weights go to streaming
        committed = in_ram_under_limit();
        if (r->kv_reserved > limit || committed + r->kv_reserved > limit + limit / 8) {
          throw Error("the request needs up to " + std::to_string(r->kv_reserved >> 20) +
                      " MiB of KV (its prompt and max_tokens), more than the memory limit (" +
                      std::to_string(limit >> 20) + " MiB for weights and KV) leaves: lower max_tokens");
        }
      }
    }
    if (r->kv_reserved > 0) {
      uint64_t reserve = r->kv_reserved;
      for (const auto& x : running_) reserve += x->kv_reserved;
      if (ElasticMemory* el = engine_->elastic()) el->set_kv_reserve(reserve);
    }
    r->session = std::make_unique<Session>(*engine_, req.session);
    if (!req.adapters.empty()) r->session->set_adapters(req.adapters);
    make_generation(*r, req, 0);
    if (req.n_choices > 1) {
      r->forks_left = req.n_choices - 1;
      r->fork_req = std::move(req);
      r->fork_req->prompt.clear();  // the forks take it from the leader's session
    }
  } catch (const std::exception& e) {
    GenerationEvent ev;
    ev.kind = GenerationEvent::Kind::kError;
    ev.error = e.what();
    ev.invalid_request = dynamic_cast<const Error*>(&e) != nullptr;
    r->stream->push(std::move(ev));
    std::lock_guard lock(mu_);
    ++m_.fg_failed;
    return;
  }
  running_.push_back(std::move(r));
}

void Scheduler::make_generation(Running& r, const GenerationRequest& req, int choice) {
  GenerateOptions o = req.options;
  if (choice > 0 && o.sampling.seed != 0) o.sampling.seed += static_cast<uint64_t>(choice);
  // Each choice its own grammar state; the request's stays at its start
  // for the choices forked later.
  if (req.n_choices > 1 && o.constraint)
    o.constraint = std::make_shared<grammar::GrammarConstraint>(o.constraint->copy());
  Running* rp = &r;  // Running is held by a unique_ptr: the address stays
  GenerationStream* s = r.stream.get();
  r.choice = choice;
  o.on_token = [rp](const StepLogprobs& t) { rp->tokens.push_back(t); };
  const std::span<const TokenId> prompt = choice == 0 ? std::span<const TokenId>(req.prompt) : std::span<const TokenId>();
  r.gen = std::make_unique<Generation>(*r.session, prompt, o, [s, rp, choice](std::string_view text) {
    s->mark_first_token();  // text means a token: timed before the client can see it
    GenerationEvent e;
    e.kind = GenerationEvent::Kind::kText;
    e.choice = choice;
    e.text = std::string(text);
    e.tokens = std::move(rp->tokens);
    rp->tokens.clear();
    s->push(std::move(e));
    return !s->cancelled();
  });
}

void Scheduler::fork_choices(Running& leader) {
  const GenerationRequest& req = *leader.fork_req;
  const int n = req.n_choices;
  for (int c = n - leader.forks_left; c < n; ++c) {
    auto r = std::make_unique<Running>();
    r->seq = leader.seq;
    r->kind = leader.kind;
    r->stream = leader.stream;
    r->session = std::make_unique<Session>(*engine_, req.session);
    if (!req.adapters.empty()) r->session->set_adapters(req.adapters);
    r->session->fork_from(*leader.session, leader.session->n_processed());
    make_generation(*r, req, c);
    running_.push_back(std::move(r));
  }
  leader.forks_left = 0;
  leader.fork_req.reset();
}

void Scheduler::finish_running(size_t i, TaskOutcome outcome, const std::string& error) {
  std::unique_ptr<Running> r = std::move(running_[i]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  if (r->kv_reserved > 0 && engine_->elastic()) {
    uint64_t reserve = 0;
    for (const auto& x : running_) reserve += x->kv_reserved;
    engine_->elastic()->set_kv_reserve(reserve);
  }
  if (r->gen) {
    const GenerateStats& st = r->gen->stats();
    {
      std::lock_guard lock(mu_);
      m_.generated_tokens += st.generated_tokens - r->counted_tokens;
      // A request counts once, at its choice 0's end (its prompt with it).
      if (r->choice == 0 && outcome == TaskOutcome::kFailed) {
        ++m_.fg_failed;
      } else if (r->choice == 0) {
        ++(st.stop == StopReason::kCancelled ? m_.fg_cancelled : m_.fg_completed);
        m_.prompt_tokens += static_cast<int64_t>(r->session->tokens().size()) - st.generated_tokens;
        m_.cached_tokens += st.cached_tokens;
      }
    }
    GenerationEvent e;
    if (outcome == TaskOutcome::kFailed) {
      e.kind = GenerationEvent::Kind::kError;
      e.error = error;
    } else {
      e.kind = GenerationEvent::Kind::kDone;
      e.stats = st;
      e.choice = r->choice;
      e.tokens = std::move(r->tokens);
    }
    // Choices never forked (the leader ended before its prompt was in, or
    // without a token): each ends as the leader did, with nothing generated.
    std::vector<GenerationEvent> unforked;
    if (outcome != TaskOutcome::kFailed) {
      for (int c = r->fork_req ? r->fork_req->n_choices - r->forks_left : 0; r->fork_req && c < r->fork_req->n_choices;
           ++c) {
        GenerationEvent u;
        u.kind = GenerationEvent::Kind::kDone;
        u.choice = c;
        u.stats.stop = st.stop;
        u.stats.prompt_tokens = st.prompt_tokens;
        unforked.push_back(std::move(u));
      }
    }
    r->gen.reset();
    r->session.reset();  // before the client hears the end: its KV is in the prefix cache by then
    r->stream->push(std::move(e));
    for (GenerationEvent& u : unforked) r->stream->push(std::move(u));
  } else if (r->task) {
    {
      std::lock_guard lock(mu_);
      ++(outcome == TaskOutcome::kCompleted ? m_.fg_completed
                                            : outcome == TaskOutcome::kCancelled ? m_.fg_cancelled : m_.fg_failed);
      cancelled_running_.erase(r->id);
    }
    if (r->task->on_done) r->task->on_done(outcome, error);
  }
}

void Scheduler::run_foreground_round(std::vector<std::unique_ptr<FgItem>> admitted) {
  const double t0 = now_seconds();
  {
    std::lock_guard lock(mu_);
    for (const auto& f : admitted) record_wait_locked(t0 - f->submitted);
  }
  for (auto& f : admitted) {
    if (f->gen) {
      start_generation(*f);
    } else {
      auto r = std::make_unique<Running>();
      r->seq = f->seq;
      r->kind = f->kind;
      r->id = f->id;
      r->task = std::move(f->task);
      running_.push_back(std::move(r));
    }
  }
  // Cancellations since the last round end before this step runs.
  std::set<TaskId> cancelled;
  {
    std::lock_guard lock(mu_);
    cancelled = cancelled_running_;
  }
  std::vector<Generation*> gens;
  for (auto& r : running_) {
    if (r->gen) {
      if (r->stream->cancelled()) r->gen->cancel();
      gens.push_back(r->gen.get());
    }
  }
  bool failed = false;
  std::string error;
  if (!gens.empty()) {
    try {
      step_generations(*engine_, gens);
    } catch (const std::exception& e) {
      failed = true;
      error = e.what();
    }
  }
  std::string round_kind = gens.empty() ? std::string() : std::string(kInferenceKind);
  for (size_t i = 0; i < running_.size();) {
    Running& r = *running_[i];
    if (r.gen) {
      if (failed) {
        finish_running(i, TaskOutcome::kFailed, error);
        continue;
      }
      if (r.forks_left > 0 && r.session->n_pending() <= 1 && r.gen->stats().generated_tokens > 0) {
        // The prompt is in (one token sampled, pending): the other choices
        // start from it. A failure here fails the whole request.
        try {
          fork_choices(r);
        } catch (const std::exception& e) {
          r.forks_left = 0;
          r.fork_req.reset();
          finish_running(i, TaskOutcome::kFailed, e.what());
          continue;
        }
      }
      const int64_t n = r.gen->stats().generated_tokens;
      if (n > 0) r.stream->mark_first_token();  // also a first token without text yet
      {
        std::lock_guard lock(mu_);
        m_.generated_tokens += n - r.counted_tokens;
      }
      r.counted_tokens = n;
      if (r.gen->done()) {
        finish_running(i, TaskOutcome::kCompleted, "");
        continue;
      }
      ++i;
      continue;
    }
    // A generic foreground task: one step.
    if (cancelled.count(r.id)) {
      finish_running(i, TaskOutcome::kCancelled, "");
      continue;
    }
    if (round_kind.empty()) round_kind = r.kind;
    bool more = false;
    std::string err;
    bool threw = false;
    try {
      more = r.task->step();
    } catch (const std::exception& e) {
      threw = true;
      err = e.what();
    }
    if (threw) {
      finish_running(i, TaskOutcome::kFailed, err);
    } else if (!more) {
      finish_running(i, TaskOutcome::kCompleted, "");
    } else {
      ++i;
    }
  }
  const double dt = now_seconds() - t0;
  int64_t made = 0;
  {
    std::lock_guard lock(mu_);
    ++m_.rounds;
    m_.fg_busy_s += dt;
    note_busy_locked("", dt);
    m_.fg_running = static_cast<int64_t>(running_.size());
    const std::string kind = round_kind.empty() ? std::string(kInferenceKind) : round_kind;
    attribute_wait_locked(kind, dt);
    kind_cost_locked(kind).step_s.add(dt);  // a round's cost: how long background work waits behind one
    made = m_.generated_tokens;
  }
  // Decode rate: tokens this round made per second of the round.
  const int64_t before = made_before_;
  made_before_ = made;
  if (made > before && dt > 0) {
    decode_rate_.add(static_cast<double>(made - before) / dt);
    std::lock_guard lock(mu_);
    m_.decode_tok_s = decode_rate_.value();
  }
  snapshot_dirty_ = true;
}

void Scheduler::run_background_step(BgItem& b) {
  const double t0 = now_seconds();
  const uint64_t m0 = used_memory();
  bool more = false, threw = false;
  std::string err;
  try {
    more = b.task.step();
  } catch (const std::exception& e) {
    threw = true;
    err = e.what();
  }
  const double dt = now_seconds() - t0;
  const uint64_t m1 = used_memory();
  const double grew = m1 > m0 ? static_cast<double>(m1 - m0) : 0.0;
  std::function<void()> done;
  {
    std::lock_guard lock(mu_);
    ++m_.bg_steps;
    m_.bg_busy_s += dt;
    m_.bg_busy_by_kind_s[b.task.desc.kind] += dt;
    note_busy_locked(b.task.desc.kind, dt);
    attribute_wait_locked(b.task.desc.kind, dt);
    KindCost& k = kind_cost_locked(b.task.desc.kind);
    k.step_s.add(dt);
    k.memory.add(grew);
    b.step_s.add(dt);
    b.memory.add(grew);
    b.run_s += dt;
    if (b.over_window) ++m_.bg_over_window;
    // Aging: the others that could have run instead were passed over for dt.
    if (opts_.background_aging_s > 0) {
      bool jumped = false;
      for (auto& o : bg_queue_) {
        if (o.get() == &b || !o->admissible || o->task.desc.priority != b.task.desc.priority) continue;
        if (b.passed_over_s >= opts_.background_aging_s && o->passed_over_s < opts_.background_aging_s &&
            o->task.desc.utility > b.task.desc.utility)
          jumped = true;
        o->passed_over_s += dt;
      }
      if (jumped) ++m_.bg_aged;
      b.passed_over_s = 0;
    }
    b.task.desc.next_yield_s = b.step_s.value();
    b.task.desc.est_memory = static_cast<uint64_t>(b.memory.value());
    b.deferred_memory = b.deferred_window = false;
    const bool cancelled = b.cancelled || cancelled_running_.count(b.id) > 0 || stopping_;
    if (threw || !more || cancelled) {
      const TaskOutcome outcome = threw ? TaskOutcome::kFailed : !more ? TaskOutcome::kCompleted : TaskOutcome::kCancelled;
      ++(outcome == TaskOutcome::kCompleted ? m_.bg_completed
                                            : outcome == TaskOutcome::kFailed ? m_.bg_failed : m_.bg_cancelled);
      if (outcome == TaskOutcome::kCompleted) k.duration_s.add(b.run_s);
      if (b.task.on_done) done = [cb = std::move(b.task.on_done), outcome, err] { cb(outcome, err); };
      cancelled_running_.erase(b.id);
      if (fifo_active_ == &b) fifo_active_ = nullptr;
      for (auto it = bg_queue_.begin(); it != bg_queue_.end(); ++it) {
        if (it->get() == &b) {
          bg_queue_.erase(it);
          break;
        }
      }
      m_.bg_waiting = static_cast<int64_t>(bg_queue_.size());
    }
  }
  if (done) done();
  snapshot_dirty_ = true;
}

void Scheduler::note_busy_locked(const std::string& kind, double dt) {
  if (opts_.background_shares.empty()) return;
  // Every kind's seconds decay by the same factor.
  const double keep = opts_.background_share_horizon_s > 0 ? std::exp(-dt / opts_.background_share_horizon_s) : 1.0;
  for (auto& [k, sec] : bg_recent_s_) sec *= keep;
  bg_recent_total_s_ = bg_recent_total_s_ * keep + dt;
  fg_recent_s_ = fg_recent_s_ * keep + (kind.empty() ? dt : 0.0);
  if (!kind.empty()) bg_recent_s_[kind] += dt;
  for (const auto& [k, share] : opts_.background_shares) {
    const auto r = bg_recent_s_.find(k);
    m_.share_recent[k] = bg_recent_total_s_ > 0 && r != bg_recent_s_.end() ? r->second / bg_recent_total_s_ : 0.0;
  }
}

Scheduler::BgItem* Scheduler::owed_over_foreground_locked(const std::vector<BgItem*>& ok) {
  if (opts_.background_shares.empty()) return nullptr;
  // A share ahead of the foreground is a share of the time the foreground
  // and the shared kinds used: background work of other kinds (pre-prefill,
  // stale prefill) ran in time the foreground left idle, and counting it
  // would make the foreground pay for it.
  double total = fg_recent_s_;
  for (const auto& [k, share] : opts_.background_shares) {
    const auto r = bg_recent_s_.find(k);
    if (r != bg_recent_s_.end()) total += r->second;
  }
  if (total <= 0) return nullptr;
  BgItem* owed = nullptr;
  double deficit = 0;
  for (BgItem* b : ok) {
    const auto sh = opts_.background_shares.find(b->task.desc.kind);
    if (sh == opts_.background_shares.end()) continue;
    const auto r = bg_recent_s_.find(b->task.desc.kind);
    const double d = sh->second * total - (r == bg_recent_s_.end() ? 0.0 : r->second);
    if (d <= 0) continue;
    // The kind furthest below its share; within it, priority then arrival.
    bool take = !owed;
    if (owed && owed->task.desc.kind != b->task.desc.kind) {
      take = d > deficit;
    } else if (owed) {
      take = b->task.desc.priority != owed->task.desc.priority ? b->task.desc.priority > owed->task.desc.priority
                                                               : b->seq < owed->seq;
    }
    if (take) {
      owed = b;
      deficit = d;
    }
  }
  return owed;
}

void Scheduler::refresh_snapshot(bool force) {
  if (!engine_) return;
  const double now = now_seconds();
  if (!snapshot_dirty_ || (!force && now - last_snapshot_ < opts_.snapshot_interval_s)) return;
  Footprint f = engine_->footprint();
  PrefixCacheStats pc;
  if (PrefixCache* c = engine_->prefix_cache()) pc = c->stats();
  last_snapshot_ = now;
  snapshot_dirty_ = false;
  std::lock_guard lock(mu_);
  m_.footprint = std::move(f);
  m_.prefix_cache = pc;
  m_.fg_running = static_cast<int64_t>(running_.size());
}

}  // namespace ebb
