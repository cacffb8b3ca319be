#include "runtime/handoff.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <mutex>
#include <optional>

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
    // A task under a staged version of an adapter the target follows
    // (on_staged): the coverage its request finds once that version is
    // published; promoted to `job` then.
    std::shared_ptr<Job> staged_job;
    TaskId staged_task = 0;
    std::string staged_name;
    uint64_t staged_version = 0;
    // Marks both tasks gone; returns their ids to cancel (outside the lock).
    void drop(std::vector<TaskId>& cancel);
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
  static size_t plan_staged(const std::shared_ptr<Shared>& sh, const std::string& name, uint64_t version);
  // Submits target i of handoff `id` as a task over `tokens` under `key`
  // (bindings `pinned`, `missing` tokens not covered, utility d) into
  // `slot`/`task` (under mu). False when the scheduler takes no more.
  static bool submit(const std::shared_ptr<Shared>& sh, uint64_t id, const std::string& agent, CacheKey key,
                     std::vector<TokenId> tokens, std::vector<AdapterBinding> pinned, int64_t missing, double d,
                     std::shared_ptr<Job>& slot, TaskId& task);
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

void PrePrefill::Shared::Target::drop(std::vector<TaskId>& cancel) {
  for (auto* slot : {&job, &staged_job}) {
    if (!*slot) continue;
    (*slot)->gone = true;
    cancel.push_back(slot == &job ? task : staged_task);
    slot->reset();
  }
}

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
    for (Shared::Target& t : p->t) {
      if (t.job.get() == this) t.job.reset();
      if (t.staged_job.get() == this) t.staged_job.reset();
    }
  }
}

namespace {

// A target's prefix and its key under `bindings` (resolved now: a
// follow-published binding pins the published version); nullopt when an
// adapter is gone (its request will fail or bind another).
struct TargetPlan {
  CacheKey key;
  std::vector<AdapterBinding> pinned;  // the key's adapters, versions pinned
  std::vector<TokenId> tokens;         // whole KV chunks, at most max_prefix_tokens
  int64_t missing = 0;                 // not covered under key
};

std::optional<TargetPlan> plan_target(Engine& e, PrefixCache& pc, const PrePrefillOptions& o, const Handoff& h,
                                      const HandoffTarget& tg, const std::vector<AdapterBinding>& bindings) {
  TargetPlan p;
  p.key.ns = tg.ns;
  p.key.chunk_size = o.kv_chunk_size > 0 ? o.kv_chunk_size : e.options().kv_chunk_size;
  p.key.kv_type = o.kv_type;
  p.key.f16_accumulator = o.f16_accumulator;
  try {
    p.key.adapters = adapter_keys(e.adapters().resolve(bindings));
  } catch (const Error&) {
    return std::nullopt;
  }
  for (const AdapterKey& a : p.key.adapters) p.pinned.push_back({a.name, a.scale, a.version});
  p.tokens = tg.system_prompt;
  p.tokens.insert(p.tokens.end(), h.shared_context.begin(), h.shared_context.end());
  const int64_t cap = std::min<int64_t>(static_cast<int64_t>(p.tokens.size()), o.max_prefix_tokens) /
                      p.key.chunk_size * p.key.chunk_size;
  p.tokens.resize(static_cast<size_t>(std::max<int64_t>(0, cap)));
  p.missing = static_cast<int64_t>(p.tokens.size()) - pc.covered(p.key, p.tokens);
  return p;
}

// Whether the target's requests follow the published version of `name`.
bool follows(const HandoffTarget& tg, const std::string& name) {
  for (const AdapterBinding& b : tg.adapters)
    if (b.name == name && b.version == 0) return true;
  return false;
}

// Whether they bind `name` once it is first published.
bool awaits(const HandoffTarget& tg, const std::string& name) {
  for (const AdapterBinding& b : tg.on_first_publish)
    if (b.name == name) return true;
  return false;
}

}  // namespace

bool PrePrefill::Shared::submit(const std::shared_ptr<Shared>& sh, uint64_t id, const std::string& agent,
                                CacheKey key, std::vector<TokenId> tokens, std::vector<AdapterBinding> pinned,
                                int64_t missing, double d, std::shared_ptr<Job>& slot, TaskId& task) {
  const ModelConfig& c = sh->engine.config();
  const PrefixCache& pc = *sh->engine.prefix_cache();
  auto job = std::make_shared<Job>();
  job->sh = sh;
  job->handoff = id;
  job->agent = agent;
  job->key = std::move(key);
  job->tokens = std::move(tokens);
  job->bindings = std::move(pinned);

  Task t;
  t.desc.cls = TaskClass::kBackground;
  t.desc.kind = "preprefill";
  t.desc.priority = sh->opts.priority;
  t.desc.utility = d;
  t.desc.adapter = job->bindings.empty() ? "" : job->bindings.front().name;
  const int64_t step_tokens = std::min<int64_t>(sh->opts.chunk_tokens, static_cast<int64_t>(job->tokens.size()));
  t.desc.est_memory = kv_bytes_per_token(c, job->key) * static_cast<uint64_t>(step_tokens);
  t.desc.next_yield_s = pc.prefill_cost() * static_cast<double>(step_tokens);
  t.desc.est_duration_s = pc.prefill_cost() * static_cast<double>(missing);
  t.step = [job] { return job->step(); };
  t.on_done = [job](TaskOutcome o, const std::string&) { job->done(o); };
  try {
    task = sh->sched.submit_background(std::move(t));
  } catch (const SchedulerBusy&) {
    return false;  // a full queue or a shutdown: the request prefills it itself
  }
  slot = job;
  ++sh->stats.tasks_submitted;
  ++sh->stats.tasks_running;
  return true;
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
  size_t submitted = 0;
  for (size_t i = 0; i < h.targets.size(); ++i) {
    if (!want[i]) continue;
    const HandoffTarget& tg = h.targets[i];
    std::optional<TargetPlan> plan = plan_target(e, *pc, sh->opts, h, tg, tg.adapters);
    if (!plan) continue;
    const double d = preprefill_priority(h.rho, consumers, plan->missing, sh->opts.beta_s, sh->opts.m_max);

    std::lock_guard lock(sh->mu);  // lock order: this, then the scheduler's
    Shared::Pending* p = sh->find_locked(id);
    if (!p || p->t[i].consumed || p->t[i].job) continue;
    // A first publish gave the target a binding while this planned: the
    // re-plan on_published queued behind this call plans it under that.
    if (p->h.targets[i].adapters.size() != tg.adapters.size()) continue;
    Shared::Target& ts = p->t[i];
    ts.planned = true;
    ts.key = plan->key;
    ts.d_ma = d;
    if (plan->missing <= 0) {
      ++sh->stats.nothing_missing;
      continue;
    }
    ++sh->stats.targets_planned;
    if (!submit(sh, id, tg.agent, plan->key, std::move(plan->tokens), std::move(plan->pinned), plan->missing, d,
                ts.job, ts.task))
      break;
    ++submitted;
  }
  return submitted;
}

size_t PrePrefill::Shared::plan_staged(const std::shared_ptr<Shared>& sh, const std::string& name,
                                       uint64_t version) {
  Engine& e = sh->engine;
  PrefixCache* pc = e.prefix_cache();
  if (!sh->opts.enabled || !pc) return 0;
  // The pending targets that follow `name`, copied (planning resolves
  // adapters and reads the cache outside the lock).
  struct Want {
    uint64_t id;
    size_t i;
    Handoff h;
    int64_t consumers;
  };
  std::vector<Want> wants;
  std::vector<TaskId> cancel;
  {
    std::lock_guard lock(sh->mu);
    for (Shared::Pending& p : sh->pending) {
      int64_t consumers = 0;
      for (const Shared::Target& t : p.t) consumers += t.consumed ? 0 : 1;
      for (size_t i = 0; i < p.t.size(); ++i) {
        Shared::Target& t = p.t[i];
        if (t.consumed || !(follows(p.h.targets[i], name) || awaits(p.h.targets[i], name))) continue;
        if (t.staged_job && t.staged_name == name && t.staged_version == version) continue;
        if (t.staged_job) {  // an older staged version's: it will never be published now
          t.staged_job->gone = true;
          cancel.push_back(t.staged_task);
          t.staged_job.reset();
        }
        wants.push_back({p.id, i, p.h, consumers});
      }
    }
  }
  for (TaskId t : cancel) sh->sched.cancel(t);
  size_t submitted = 0;
  for (Want& w : wants) {
    const HandoffTarget& tg = w.h.targets[w.i];
    std::vector<AdapterBinding> bindings = tg.adapters;
    for (AdapterBinding& b : bindings)
      if (b.name == name && b.version == 0) b.version = version;
    for (const AdapterBinding& b : tg.on_first_publish)
      if (b.name == name) bindings.push_back({b.name, b.scale, version});
    std::optional<TargetPlan> plan = plan_target(e, *pc, sh->opts, w.h, tg, bindings);
    if (!plan || plan->missing <= 0) continue;
    const double d = preprefill_priority(w.h.rho, w.consumers, plan->missing, sh->opts.beta_s, sh->opts.m_max);
    std::lock_guard lock(sh->mu);
    Shared::Pending* p = sh->find_locked(w.id);
    if (!p || p->t[w.i].consumed || p->t[w.i].staged_job) continue;
    Shared::Target& ts = p->t[w.i];
    if (!submit(sh, w.id, tg.agent, plan->key, std::move(plan->tokens), std::move(plan->pinned), plan->missing, d,
                ts.staged_job, ts.staged_task))
      break;
    ts.staged_name = name;
    ts.staged_version = version;
    ++sh->stats.staged_planned;
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
      for (Shared::Target& t : p.t) t.drop(ids);
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
      for (Shared::Target& t : shared_->pending.front().t) t.drop(cancel);
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
  std::vector<TaskId> cancel;
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
        t.drop(cancel);
      }
      all = all && t.consumed;
    }
    if (all) pend.erase(it);
  }
  for (TaskId t : cancel) shared_->sched.cancel(t);
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
        if (t.consumed) continue;
        HandoffTarget& ht = p.h.targets[i];
        const auto first = std::find_if(ht.on_first_publish.begin(), ht.on_first_publish.end(),
                                        [&](const AdapterBinding& b) { return b.name == name; });
        if (first != ht.on_first_publish.end()) {
          // Its requests bind the adapter from now on.
          ht.adapters.push_back(*first);
          ht.on_first_publish.erase(first);
          if (!t.planned && !t.job && !t.staged_job) {
            again = true;  // never planned (nothing was missing, or not yet): plan it under the adapter
            continue;
          }
        } else {
          if (!t.planned || !follows(ht, name)) continue;
          bool moved = false;
          for (const AdapterKey& a : t.key.adapters) moved = moved || (a.name == name && a.version != version);
          if (!moved) continue;
        }
        ++shared_->stats.stale;
        if (t.job) {
          t.job->gone = true;
          cancel.push_back(t.task);
          t.job.reset();  // its on_done finds nothing to clear
        }
        if (t.staged_job && t.staged_name == name && t.staged_version == version) {
          // Warmed under this version since it was staged: that task goes on
          // as the target's own, no re-plan.
          t.job = std::move(t.staged_job);
          t.task = t.staged_task;
          t.key = t.job->key;
          t.planned = true;
          ++shared_->stats.staged_promoted;
          continue;
        }
        if (t.staged_job) {  // another version's, never to be published now
          t.staged_job->gone = true;
          cancel.push_back(t.staged_task);
          t.staged_job.reset();
        }
        t.planned = false;
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

std::future<size_t> PrePrefill::on_staged(const std::string& name, uint64_t version) {
  return shared_->sched.call(
      [sh = shared_, name, version](Engine&) { return Shared::plan_staged(sh, name, version); });
}

size_t PrePrefill::on_staged_now(const std::string& name, uint64_t version) {
  return Shared::plan_staged(shared_, name, version);
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
