#include "runtime/handoff.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <mutex>

#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/session.h"
#include "runtime/warm_task.h"

namespace ebb {

double preprefill_priority(double rho, int64_t pending_consumers, int64_t missing_tokens, double beta_s,
                           int64_t m_max) {
  if (m_max <= 0 || missing_tokens <= 0) return 0;
  const double s = static_cast<double>(std::max<int64_t>(0, pending_consumers));
  const double delta = static_cast<double>(std::min(missing_tokens, m_max));
  return rho * (1.0 + beta_s * std::log1p(s)) * delta / static_cast<double>(m_max);
}

namespace {

constexpr size_t kEndedLog = 256;

// KV bytes one token takes in a session of `key`'s geometry.
uint64_t kv_bytes_per_token(const ModelConfig& c, const CacheKey& key) {
  return static_cast<uint64_t>(c.n_layer) * 2 * static_cast<uint64_t>(c.kv_dim()) *
         (key.kv_type == DType::kF32 ? 4 : 2);
}

}  // namespace

struct PrePrefill::Shared {
  Shared(Engine& e, Scheduler& s, PrePrefillOptions o) : engine(e), sched(s), opts(std::move(o)) {}
  Engine& engine;
  Scheduler& sched;
  PrePrefillOptions opts;
  // A target of a pending handoff, as planned.
  struct Target {
    bool consumed = false;
    bool planned = false;     // a key was resolved and coverage asked for
    CacheKey key;             // the key it was (last) planned under
    double d_ma = 0;
    std::shared_ptr<Job> job;  // the unfinished task, if any
    TaskId task = 0;
  };

  struct Pending {
    uint64_t id = 0;
    Handoff h;
    std::vector<Target> t;  // [targets]
  };
  mutable std::mutex mu;  // everything below; taken before the scheduler's
  PrePrefillStats stats;
  uint64_t next_id = 1;
  std::deque<Pending> pending;
  std::deque<std::pair<uint64_t, std::string>> ended;

  Pending* find_locked(uint64_t id) {
    for (Pending& p : pending)
      if (p.id == id) return &p;
    return nullptr;
  }
  static size_t plan_on(const std::shared_ptr<Shared>& sh, uint64_t id);
};

// One target's prefix, pre-prefilled under its key; the Session lives from
// the first step to the end (on the scheduler thread).
struct PrePrefill::Job {
  std::shared_ptr<Shared> sh;
  uint64_t handoff = 0;
  std::string agent;
  CacheKey key;
  std::vector<TokenId> tokens;           // [n] whole KV chunks
  std::vector<AdapterBinding> bindings;  // the key's adapters, versions pinned
  std::unique_ptr<Session> session;
  std::atomic<bool> gone{false};         // consumed, stale or unloaded: ends without inserting more

  bool step();
  void done(TaskOutcome outcome);
};

bool PrePrefill::Job::step() {
  Engine& e = sh->engine;
  PrefixCache* pc = e.prefix_cache();
  if (!pc || gone.load()) return false;
  try {
    e.adapters().resolve(bindings);  // the pinned versions still there?
  } catch (const Error&) {
    gone = true;
    return false;
  }
  // A foreground request that came first prefilled it (its chunks are in
  // the cache under the same key): nothing is missing any more.
  if (pc->covered(key, tokens) >= static_cast<int64_t>(tokens.size())) {
    if (!session) {
      std::lock_guard lock(sh->mu);
      ++sh->stats.nothing_missing;
    }
    return false;
  }
  const double t0 = now_seconds();
  if (!session) session = open_warm_session(e, key, tokens, bindings, "pre-prefill for agent '" + agent + "'");
  // The chunk: chunk_tokens, less under memory pressure (the KV that fits
  // the headroom), whole micro-batches from position 0 (as a recompute runs
  // them: the KV is bit for bit what a request computes), at least one.
  const int64_t mb = e.forward().max_batch();
  int64_t chunk = std::max(mb, sh->opts.chunk_tokens / mb * mb);
  bool shrunk = false;
  if (sh->opts.headroom) {
    const uint64_t per_token = kv_bytes_per_token(e.config(), key);
    const uint64_t fit_tokens = sh->opts.headroom() / std::max<uint64_t>(1, per_token);
    if (fit_tokens < static_cast<uint64_t>(chunk)) {
      chunk = std::max(mb, static_cast<int64_t>(fit_tokens) / mb * mb);
      shrunk = chunk < sh->opts.chunk_tokens;
    }
  }
  const WarmStep ws = run_warm_step(*session, mb, chunk, sh->opts.step_seconds, t0);
  const int64_t ran = ws.tokens;
  const int64_t inserted0 = pc->stats().inserted_chunks;
  session->insert_into(*pc, key, tokens);
  const int64_t inserted = pc->stats().inserted_chunks - inserted0;
  const double dt = now_seconds() - t0;
  {
    std::lock_guard lock(sh->mu);
    PrePrefillStats& s = sh->stats;
    s.tokens_prefilled += ran;
    s.chunks_inserted += inserted;
    ++s.steps;
    if (shrunk) ++s.shrunk_steps;
    if (ws.timed) ++s.timed_steps;
    if (ran > 0) s.min_chunk_tokens = s.min_chunk_tokens == 0 ? ran : std::min(s.min_chunk_tokens, ran);
    s.busy_s += dt;
  }
  return session->n_pending() > 0;
}

void PrePrefill::Job::done(TaskOutcome outcome) {
  session.reset();  // the KV stays in the prefix cache
  std::lock_guard lock(sh->mu);
  count_task_end(sh->stats, outcome, gone.load());
  sh->ended.emplace_back(handoff, agent);
  while (sh->ended.size() > kEndedLog) sh->ended.pop_front();
  if (Shared::Pending* p = sh->find_locked(handoff)) {
    for (Shared::Target& t : p->t)
      if (t.job.get() == this) t.job.reset();
  }
}

size_t PrePrefill::Shared::plan_on(const std::shared_ptr<Shared>& sh, uint64_t id) {
  Engine& e = sh->engine;
  PrefixCache* pc = e.prefix_cache();
  if (!sh->opts.enabled || !pc) return 0;
  Handoff h;
  std::vector<bool> want;
  int64_t consumers = 0;
  {
    std::lock_guard lock(sh->mu);
    Shared::Pending* p = sh->find_locked(id);
    if (!p) return 0;
    h = p->h;
    for (const Shared::Target& t : p->t) {
      want.push_back(!t.consumed && !t.job);
      consumers += t.consumed ? 0 : 1;
    }
  }
  const ModelConfig& c = e.config();
  size_t submitted = 0;
  for (size_t i = 0; i < h.targets.size(); ++i) {
    if (!want[i]) continue;
    const HandoffTarget& tg = h.targets[i];
    // The target's key now: a follow-published binding pins the published version.
    CacheKey key;
    key.ns = tg.ns;
    key.chunk_size = sh->opts.kv_chunk_size > 0 ? sh->opts.kv_chunk_size : e.options().kv_chunk_size;
    key.kv_type = sh->opts.kv_type;
    key.f16_accumulator = sh->opts.f16_accumulator;
    std::vector<AdapterBinding> pinned;
    try {
      key.adapters = adapter_keys(e.adapters().resolve(tg.adapters));
    } catch (const Error&) {
      continue;  // its adapter is gone: its request will fail or bind another
    }
    for (const AdapterKey& a : key.adapters) pinned.push_back({a.name, a.scale, a.version});
    std::vector<TokenId> tokens = tg.system_prompt;
    tokens.insert(tokens.end(), h.shared_context.begin(), h.shared_context.end());
    const int64_t cap = std::min<int64_t>(static_cast<int64_t>(tokens.size()), sh->opts.max_prefix_tokens) /
                        key.chunk_size * key.chunk_size;
    tokens.resize(static_cast<size_t>(std::max<int64_t>(0, cap)));
    const int64_t missing = static_cast<int64_t>(tokens.size()) - pc->covered(key, tokens);
    const double d = preprefill_priority(h.rho, consumers, missing, sh->opts.beta_s, sh->opts.m_max);

    std::lock_guard lock(sh->mu);  // lock order: this, then the scheduler's
    Shared::Pending* p = sh->find_locked(id);
    if (!p || p->t[i].consumed || p->t[i].job) continue;
    Shared::Target& ts = p->t[i];
    ts.planned = true;
    ts.key = key;
    ts.d_ma = d;
    if (missing <= 0) {
      ++sh->stats.nothing_missing;
      continue;
    }
    ++sh->stats.targets_planned;
    auto job = std::make_shared<Job>();
    job->sh = sh;
    job->handoff = id;
    job->agent = tg.agent;
    job->key = key;
    job->tokens = std::move(tokens);
    job->bindings = pinned;

    Task t;
    t.desc.cls = TaskClass::kBackground;
    t.desc.kind = "preprefill";
    t.desc.priority = sh->opts.priority;
    t.desc.utility = d;
    t.desc.adapter = pinned.empty() ? "" : pinned.front().name;
    const int64_t step_tokens = std::min<int64_t>(sh->opts.chunk_tokens, static_cast<int64_t>(job->tokens.size()));
    t.desc.est_memory = kv_bytes_per_token(c, key) * static_cast<uint64_t>(step_tokens);
    t.desc.next_yield_s = pc->prefill_cost() * static_cast<double>(step_tokens);
    t.desc.est_duration_s = pc->prefill_cost() * static_cast<double>(missing);
    t.step = [job] { return job->step(); };
    t.on_done = [job](TaskOutcome o, const std::string&) { job->done(o); };
    try {
      ts.task = sh->sched.submit_background(std::move(t));
    } catch (const SchedulerBusy&) {
      break;  // a full queue or a shutdown: the request prefills it itself
    }
    ts.job = job;
    ++sh->stats.tasks_submitted;
    ++sh->stats.tasks_running;
    ++submitted;
  }
  return submitted;
}

PrePrefill::PrePrefill(Engine& engine, Scheduler& sched, PrePrefillOptions opts)
    : opts_(std::move(opts)) {
  if (opts_.chunk_tokens < 1) throw Error("pre-prefill: the chunk must hold at least 1 token");
  if (!(opts_.step_seconds >= 0)) throw Error("pre-prefill: the step's seconds must be >= 0 (0: off)");
  if (opts_.m_max < 1) throw Error("pre-prefill: M_max must be at least 1 token");
  if (opts_.beta_s < 0) throw Error("pre-prefill: beta_s must be >= 0");
  if (opts_.max_pending < 1) throw Error("pre-prefill: max_pending must be at least 1");
  if (!opts_.headroom) opts_.headroom = [&sched] { return sched.memory_headroom(); };
  shared_ = std::make_shared<Shared>(engine, sched, opts_);
}

PrePrefill::~PrePrefill() {
  std::vector<TaskId> ids;
  {
    std::lock_guard lock(shared_->mu);
    for (Shared::Pending& p : shared_->pending)
      for (Shared::Target& t : p.t)
        if (t.job) {
          t.job->gone = true;
          ids.push_back(t.task);
        }
  }
  for (TaskId id : ids) shared_->sched.cancel(id);
}

namespace {

void check_handoff(const Handoff& h) {
  if (h.targets.empty()) throw Error("handoff from '" + h.source + "': it names no target");
  if (!(h.rho > 0) || !std::isfinite(h.rho))
    throw Error("handoff from '" + h.source + "': its priority rho must be a finite number > 0");
}

}  // namespace

uint64_t PrePrefill::post(Handoff h, std::future<size_t>* planned) {
  check_handoff(h);
  std::vector<TaskId> cancel;
  uint64_t id = 0;
  {
    std::lock_guard lock(shared_->mu);
    id = shared_->next_id++;
    Shared::Pending p;
    p.id = id;
    p.t.resize(h.targets.size());
    p.h = std::move(h);
    shared_->pending.push_back(std::move(p));
    ++shared_->stats.handoffs;
    while (shared_->pending.size() > opts_.max_pending) {
      for (Shared::Target& t : shared_->pending.front().t)
        if (t.job) {
          t.job->gone = true;
          cancel.push_back(t.task);
        }
      shared_->pending.pop_front();
    }
  }
  for (TaskId t : cancel) shared_->sched.cancel(t);
  std::future<size_t> f = shared_->sched.call([sh = shared_, id](Engine&) { return Shared::plan_on(sh, id); });
  if (planned) *planned = std::move(f);
  return id;
}

uint64_t PrePrefill::post_now(Handoff h, size_t* planned) {
  check_handoff(h);
  uint64_t id = 0;
  {
    std::lock_guard lock(shared_->mu);
    id = shared_->next_id++;
    Shared::Pending p;
    p.id = id;
    p.t.resize(h.targets.size());
    p.h = std::move(h);
    shared_->pending.push_back(std::move(p));
    ++shared_->stats.handoffs;
  }
  const size_t n = Shared::plan_on(shared_, id);
  if (planned) *planned = n;
  return id;
}

void PrePrefill::consume(uint64_t handoff, const std::string& agent) {
  TaskId cancel = 0;
  {
    std::lock_guard lock(shared_->mu);
    auto& pend = shared_->pending;
    auto it = std::find_if(pend.begin(), pend.end(), [&](const Shared::Pending& p) { return p.id == handoff; });
    if (it == pend.end()) return;
    bool all = true;
    for (size_t i = 0; i < it->t.size(); ++i) {
      Shared::Target& t = it->t[i];
      if (!t.consumed && it->h.targets[i].agent == agent) {
        t.consumed = true;
        ++shared_->stats.consumed;
        // The request prefills what is still missing itself.
        if (t.job) {
          t.job->gone = true;
          cancel = t.task;
        }
      }
      all = all && t.consumed;
    }
    if (all) pend.erase(it);
  }
  if (cancel) shared_->sched.cancel(cancel);
}

void PrePrefill::on_published(const std::string& name, uint64_t version) {
  std::vector<TaskId> cancel;
  std::vector<uint64_t> replan;
  {
    std::lock_guard lock(shared_->mu);
    for (Shared::Pending& p : shared_->pending) {
      bool again = false;
      for (size_t i = 0; i < p.t.size(); ++i) {
        Shared::Target& t = p.t[i];
        if (t.consumed || !t.planned) continue;
        bool follows = false;
        for (const AdapterBinding& b : p.h.targets[i].adapters) follows = follows || (b.name == name && b.version == 0);
        if (!follows) continue;
        bool moved = false;
        for (const AdapterKey& a : t.key.adapters) moved = moved || (a.name == name && a.version != version);
        if (!moved) continue;
        ++shared_->stats.stale;
        t.planned = false;
        if (t.job) {
          t.job->gone = true;
          cancel.push_back(t.task);
          t.job.reset();  // its on_done finds nothing to clear
        }
        again = true;
      }
      if (again) replan.push_back(p.id);
    }
  }
  for (TaskId t : cancel) shared_->sched.cancel(t);
  if (replan.empty()) return;
  shared_->sched.call([sh = shared_, replan](Engine&) {
    for (uint64_t id : replan) Shared::plan_on(sh, id);
  });
}

PrePrefillStats PrePrefill::stats() const {
  std::lock_guard lock(shared_->mu);
  return shared_->stats;
}

std::vector<std::pair<uint64_t, std::string>> PrePrefill::ended() const {
  std::lock_guard lock(shared_->mu);
  return {shared_->ended.begin(), shared_->ended.end()};
}

double PrePrefill::planned_priority(uint64_t handoff, const std::string& agent) const {
  std::lock_guard lock(shared_->mu);
  if (Shared::Pending* p = shared_->find_locked(handoff)) {
    for (size_t i = 0; i < p->t.size(); ++i)
      if (p->h.targets[i].agent == agent && p->t[i].planned) return p->t[i].d_ma;
  }
  return 0;
}

}  // namespace ebb
