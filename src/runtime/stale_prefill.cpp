#include "runtime/stale_prefill.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/session.h"
#include "runtime/warm_task.h"

namespace ebb {

struct StalePrefill::Shared {
  Shared(Engine& e, Scheduler& s, StalePrefillOptions o) : engine(e), sched(s), opts(o) {}
  Engine& engine;
  Scheduler& sched;
  StalePrefillOptions opts;
  mutable std::mutex mu;
  StalePrefillStats stats;
  struct Entry {
    TaskId id = 0;
    std::shared_ptr<Job> job;
  };
  std::vector<Entry> jobs;  // submitted, not ended
};

// One hot prefix warmed under a staged version; its Session lives from the
// first step to the end (on the scheduler thread).
struct StalePrefill::Job {
  std::shared_ptr<Shared> sh;
  std::string name;  // the adapter warmed, at `version`
  uint64_t version = 0;
  CacheKey key;                         // the target key: the staged version's
  std::vector<TokenId> tokens;          // [n] whole KV chunks
  std::vector<AdapterBinding> bindings; // every adapter of the key, versions pinned
  int64_t chunk_tokens = 128;
  double step_seconds = 0;
  std::unique_ptr<Session> session;
  std::atomic<bool> gone{false};        // its version was unloaded: ends without inserting more

  bool step();
  void done(TaskOutcome outcome);
};

bool StalePrefill::Job::step() {
  Engine& e = sh->engine;
  PrefixCache* pc = e.prefix_cache();
  if (!pc || gone.load()) return false;
  try {
    e.adapters().resolve(bindings);  // still loaded? (a version is never reused for other bytes)
  } catch (const Error&) {
    gone = true;
    return false;
  }
  const double t0 = now_seconds();
  if (!session) {
    if (pc->covered(key, tokens) >= static_cast<int64_t>(tokens.size())) return false;  // a request made it meanwhile
    session = open_warm_session(e, key, tokens, bindings,
                                "stale-coverage prefill of adapter '" + name + "' version " + std::to_string(version));
  }
  // Whole micro-batches from position 0, as a recompute of the prompt runs
  // them: the KV is bit for bit what a request would have computed.
  const int64_t mb = e.forward().max_batch();
  const int64_t ran =
      run_warm_step(*session, mb, std::max<int64_t>(1, chunk_tokens / mb) * mb, step_seconds, t0).tokens;
  const int64_t inserted0 = pc->stats().inserted_chunks;
  session->insert_into(*pc, key, tokens);
  const int64_t inserted = pc->stats().inserted_chunks - inserted0;
  {
    std::lock_guard lock(sh->mu);
    sh->stats.tokens_prefilled += ran;
    sh->stats.chunks_inserted += inserted;
  }
  return session->n_pending() > 0;
}

void StalePrefill::Job::done(TaskOutcome outcome) {
  session.reset();  // the KV stays in the prefix cache
  std::lock_guard lock(sh->mu);
  count_task_end(sh->stats, outcome, gone.load());
  auto& jobs = sh->jobs;
  jobs.erase(std::remove_if(jobs.begin(), jobs.end(), [this](const Shared::Entry& x) { return x.job.get() == this; }),
             jobs.end());
}

StalePrefill::StalePrefill(Engine& engine, Scheduler& sched, StalePrefillOptions opts)
    : opts_(opts), shared_(std::make_shared<Shared>(engine, sched, opts)) {
  if (opts_.chunk_tokens < 1) throw Error("stale-coverage prefill: the chunk must hold at least 1 token");
  if (!(opts_.step_seconds >= 0)) throw Error("stale-coverage prefill: the step's seconds must be >= 0 (0: off)");
  if (opts_.max_prefixes < 0) throw Error("stale-coverage prefill: the number of prefixes must be >= 0");
}

StalePrefill::~StalePrefill() {
  std::vector<TaskId> ids;
  {
    std::lock_guard lock(shared_->mu);
    for (const Shared::Entry& x : shared_->jobs) {
      x.job->gone = true;
      ids.push_back(x.id);
    }
  }
  for (TaskId id : ids) shared_->sched.cancel(id);
}

std::future<size_t> StalePrefill::on_staged(const std::string& name, uint64_t version) {
  return shared_->sched.call([sh = shared_, name, version](Engine&) { return plan_on(sh, name, version); });
}

size_t StalePrefill::plan(const std::string& name, uint64_t version) { return plan_on(shared_, name, version); }

namespace {

bool holds(const CacheKey& k, const std::string& name, uint64_t version) {
  for (const AdapterKey& a : k.adapters)
    if (a.name == name && a.version == version) return true;
  return false;
}

}  // namespace

size_t StalePrefill::plan_on(const std::shared_ptr<Shared>& sh, const std::string& name, uint64_t version) {
  const StalePrefillOptions& o = sh->opts;
  PrefixCache* pc = sh->engine.prefix_cache();
  if (!o.enabled || o.max_prefixes == 0 || !pc) return 0;

  // The version to warm, and where its prefixes come from.
  uint64_t digest = 0, published = 0;
  bool found = false, others = false;
  for (const AdapterInfo& i : sh->engine.adapters().list()) {
    if (i.name != name) continue;
    if (i.published) published = i.version;
    if (i.version == version) {
      found = true;
      digest = i.digest;
    } else {
      others = true;
    }
  }
  if (!found) return 0;
  std::function<bool(const CacheKey&)> want;
  if (published != 0 && published != version) {
    want = [&](const CacheKey& k) { return holds(k, name, published); };
  } else if (others) {
    want = [&](const CacheKey& k) {
      for (const AdapterKey& a : k.adapters)
        if (a.name == name && a.version != version) return true;
      return false;
    };
  } else {
    want = [](const CacheKey& k) { return k.adapters.empty(); };  // its first version: the base model's prefixes
  }
  const std::vector<PrefixCache::HotPrefix> hot = pc->hot_prefixes(want, static_cast<size_t>(o.max_prefixes));

  const ModelConfig& c = sh->engine.config();
  size_t submitted = 0;
  std::vector<std::pair<CacheKey, std::vector<int32_t>>> planned;
  for (const PrefixCache::HotPrefix& h : hot) {
    CacheKey key = h.key;
    bool replaced = false;
    for (AdapterKey& a : key.adapters) {
      if (a.name != name) continue;
      a.version = version;
      a.digest = digest;
      replaced = true;
    }
    if (!replaced) {
      key.adapters.push_back({name, version, digest, 1.0f});
      std::sort(key.adapters.begin(), key.adapters.end(),
                [](const AdapterKey& x, const AdapterKey& y) { return x.name < y.name; });
    }
    std::vector<int32_t> tokens = h.tokens;
    const int64_t cap = o.max_prefix_tokens / key.chunk_size * key.chunk_size;
    if (static_cast<int64_t>(tokens.size()) > cap) tokens.resize(static_cast<size_t>(cap));
    if (tokens.empty() || pc->covered(key, tokens) >= static_cast<int64_t>(tokens.size())) continue;
    bool dup = false;
    for (const auto& [k, t] : planned) dup = dup || (k == key && t == tokens);
    if (dup) continue;
    planned.emplace_back(key, tokens);

    auto job = std::make_shared<Job>();
    job->sh = sh;
    job->name = name;
    job->version = version;
    job->key = key;
    job->tokens.assign(tokens.begin(), tokens.end());
    for (const AdapterKey& a : key.adapters) job->bindings.push_back({a.name, a.scale, a.version});
    job->chunk_tokens = o.chunk_tokens;
    job->step_seconds = o.step_seconds;

    Task t;
    t.desc.cls = TaskClass::kBackground;
    t.desc.kind = "prefill";
    t.desc.priority = o.priority;
    t.desc.adapter = name;
    t.desc.utility = h.heat_kv;
    // m̂: the KV of one step's tokens; ŷ and t̂ from the measured prefill cost.
    const uint64_t kv_bytes_per_token = static_cast<uint64_t>(c.n_layer) * 2 * static_cast<uint64_t>(c.kv_dim()) *
                                        (key.kv_type == DType::kF32 ? 4 : 2);
    const int64_t step_tokens = std::min<int64_t>(o.chunk_tokens, static_cast<int64_t>(tokens.size()));
    t.desc.est_memory = kv_bytes_per_token * static_cast<uint64_t>(step_tokens);
    t.desc.next_yield_s = pc->prefill_cost() * static_cast<double>(step_tokens);
    t.desc.est_duration_s = pc->prefill_cost() * static_cast<double>(tokens.size());
    t.step = [job] { return job->step(); };
    t.on_done = [job](TaskOutcome outcome, const std::string&) { job->done(outcome); };
    TaskId id = 0;
    {
      // Registered under the lock its on_done takes (lock order: this, then the scheduler's).
      std::lock_guard lock(sh->mu);
      try {
        id = sh->sched.submit_background(std::move(t));
      } catch (const SchedulerBusy&) {
        break;  // a full queue or a shutdown: the request path prefills the rest
      }
      sh->jobs.push_back({id, job});
      ++sh->stats.tasks_submitted;
      ++sh->stats.tasks_running;
    }
    ++submitted;
  }
  std::lock_guard lock(sh->mu);
  ++sh->stats.versions;
  return submitted;
}

void StalePrefill::on_unloaded(const std::string& name, uint64_t version) {
  std::vector<TaskId> ids;
  {
    std::lock_guard lock(shared_->mu);
    for (const Shared::Entry& x : shared_->jobs) {
      if (x.job->name != name || (version != 0 && x.job->version != version)) continue;
      x.job->gone = true;
      ids.push_back(x.id);
    }
  }
  for (TaskId id : ids) shared_->sched.cancel(id);
}

StalePrefillStats StalePrefill::stats() const {
  std::lock_guard lock(shared_->mu);
  return shared_->stats;
}

}  // namespace ebb
