#include "bench/agents_workload.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "bench/learning_loop.h"
#include "cli/options.h"
#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/handoff.h"
#include "runtime/offload_admission.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"

namespace ebb::cli {
namespace {

using Tokens = std::vector<TokenId>;

Tokens cat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The process's peak resident set since the last reset (VmHWM), and the
// reset (clear_refs 5); 0 where /proc does not have them.
uint64_t peak_rss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream in(line.substr(6));
      uint64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (f) f << "5";
}

struct Agent {
  std::string name;
  Tokens system;
  bool learns = false;  // binds the trained adapter once published
};

}  // namespace

void validate(const AgentsWorkload& w) {
  if (w.tasks < 0) throw UsageError("bench agents: --tasks must be >= 0 (0: tasks until --duration)");
  if (w.concurrency < 1 || w.steps < 1)
    throw UsageError("bench agents: --concurrency and --steps must be at least 1");
  if (!(w.learn.duration_s > 0))
    throw UsageError("bench agents: --duration must be > 0 (every system runs exactly that long)");
  if (w.system_tokens < 1 || w.user_tokens < 1 || w.context_tokens < 0 || w.tool_result_tokens < 0 ||
      w.instruction_tokens < 1 || w.gen < 1)
    throw UsageError("bench agents: --system-tokens, --user-tokens, --gen and --instruction-tokens must be at least 1, "
                     "--context-tokens and --tool-result-tokens at least 0");
  if (w.handoff_delay_s < 0 || w.window_gap_s < 0) throw UsageError("bench agents: times must be >= 0");
  if (w.window_steps < 1) throw UsageError("bench agents: --window-steps must be at least 1");
  if (w.hot_prefixes < 0 || w.chunk_tokens < 1)
    throw UsageError("bench agents: --hot-prefixes must be >= 0 and --chunk-tokens >= 1");
  if (!(w.step_seconds >= 0)) throw UsageError("bench agents: --step-seconds must be >= 0 (0: --chunk-tokens alone)");
  validate(w.learn);
}

nlohmann::json workload_json(const AgentsWorkload& w) {
  return {{"tasks", w.tasks},
          {"concurrency", w.concurrency},
          {"steps", w.steps},
          {"system_tokens", w.system_tokens},
          {"user_tokens", w.user_tokens},
          {"context_tokens", w.context_tokens},
          {"tool_result_tokens", w.tool_result_tokens},
          {"instruction_tokens", w.instruction_tokens},
          {"gen", w.gen},
          {"handoff_delay_s", w.handoff_delay_s},
          {"window_gap_s", w.window_gap_s},
          {"window_steps", w.window_steps},
          {"window_reload", w.window_reload},
          {"window_gaps", w.window_random_gaps ? "random" : "fixed"},
          {"step_seconds", w.step_seconds},
          {"hot_prefixes", w.hot_prefixes},
          {"chunk_tokens", w.chunk_tokens},
          {"learn", workload_json(w.learn)}};
}

bool agents_system_known(const std::string& s) {
  return s == "ebb" || s == "no-preprefill" || s == "no-stale-prefill" || s == "sleep-train-wake" || s == "fifo" ||
         s == "round-robin";
}

AgentsRun run_agents_workload(Engine& engine, const AgentsWorkload& w, const std::string& system) {
  if (!agents_system_known(system)) throw UsageError("bench agents: unknown system '" + system + "'");
  AgentsRun run;
  run.system = system;
  run.kv_budget = w.kv_budget;
  run.hot_prefixes = w.hot_prefixes;
  run.chunk_tokens = w.chunk_tokens;
  const bool stw = system == "sleep-train-wake";
  const bool preprefill = system != "no-preprefill" && !stw;
  const bool stale = system != "no-stale-prefill" && !stw;
  const ModelConfig& c = engine.config();
  const int64_t n_vocab = c.n_vocab;

  // The longest prompt of a task, and the foreground reserve: that much KV
  // for each task in flight.
  const int64_t longest = w.system_tokens + w.user_tokens + w.context_tokens +
                          w.steps * (3 * w.gen + w.tool_result_tokens + w.instruction_tokens) + w.gen + 8;
  const uint64_t kv_per_token = static_cast<uint64_t>(c.n_layer) * 2 * static_cast<uint64_t>(c.kv_dim()) * 2;

  SchedulerOptions so;
  so.policy = system == "round-robin" ? SchedPolicy::kRoundRobin
              : system == "fifo"      ? SchedPolicy::kFifo
                                      : SchedPolicy::kForegroundFirst;
  so.background_window_s = w.learn.window_s;
  so.max_batch = std::max(8, w.concurrency);
  so.max_background = 4096;
  so.shares_over_foreground = true;  // as ebb serve --learn: training keeps its share of a saturated engine
  std::unique_ptr<CacheOffloader> offloader;
  if (w.kv_budget > 0) {
    so.memory_reserve = kv_per_token * static_cast<uint64_t>(longest * w.concurrency);
    const uint64_t budget = w.kv_budget;
    so.free_memory = [&engine, budget] {
      const Footprint f = engine.footprint();
      const uint64_t used = f.kv() + f.kv_spare + f.compressed + f.training;
      return budget > used ? budget - used : 0;
    };
    offloader = std::make_unique<CacheOffloader>(engine);
    so.offload = offloader->hook();
  }
  reset_peak_rss();
  Scheduler sched(&engine, so);

  std::unique_ptr<PrePrefill> pp;
  if (preprefill) {
    PrePrefillOptions po;
    po.chunk_tokens = w.chunk_tokens;
    po.step_seconds = w.step_seconds;
    pp = std::make_unique<PrePrefill>(engine, sched, po);
  }
  StalePrefillOptions sto;
  sto.max_prefixes = w.hot_prefixes;
  sto.chunk_tokens = w.chunk_tokens;
  sto.step_seconds = w.step_seconds;
  LearningLoop learn(
      engine, sched, w.learn, stw ? TrainGranularity::kWindows : TrainGranularity::kPhases, stale, w.window_gap_s,
      LearningCallbacks{.on_staged =
                            [&pp, stale](uint64_t v) {
                              // Stale-coverage prefill of the staged version covers the prompts known
                              // to come too: the handoffs' pending targets.
                              if (pp && stale) pp->on_staged(kLearnedAdapter, v).get();
                            },
                        .on_publish =
                            [&pp](uint64_t v) {
                              if (pp) pp->on_published(kLearnedAdapter, v);
                            }},
      sto, [&w] {
        SleepWakeOptions sw;
        sw.steps = w.window_steps;
        sw.drop_cache = w.window_reload;
        sw.random_gaps = w.window_random_gaps;
        if (w.window_reload) sw.reload_path = w.model_path;
        return sw;
      }());

  std::mt19937_64 agent_rng(w.learn.seed * 31 + 7);
  const std::vector<Agent> agents = {{"planner", random_tokens(agent_rng, w.system_tokens, n_vocab), false},
                                     {"tool", random_tokens(agent_rng, w.system_tokens, n_vocab), true},
                                     {"critic", random_tokens(agent_rng, w.system_tokens, n_vocab), false}};
  const Agent& planner = agents[0];
  const Agent& tool = agents[1];
  const Agent& critic = agents[2];

  std::mutex mu;  // run's vectors
  std::string failure;
  const double t0 = now_seconds();
  const double deadline = t0 + w.learn.duration_s;  // T
  const auto past_t = [deadline] { return now_seconds() >= deadline; };
  const auto bindings = [&](const Agent& a) {
    std::vector<AdapterBinding> b;
    if (a.learns && learn.published()) b.push_back({kLearnedAdapter, 1.0f, 0});
    return b;
  };
  const auto session_for = [&](const Agent& a, int64_t n) {
    SessionOptions s;
    s.cache_namespace = a.name;
    s.n_ctx = n + w.gen + 8;
    return s;
  };
  // One foreground turn: the agent's system prompt + history + its
  // instruction; returns its prompt when the answer is done, nullopt when
  // T came first (none starts at or after T; one in flight is cancelled).
  const auto turn = [&](const Agent& a, const Tokens& history, const Tokens& instruction) -> std::optional<Tokens> {
    if (past_t()) return std::nullopt;
    GenerationRequest req;
    req.prompt = cat(cat(a.system, history), instruction);
    req.options.max_tokens = w.gen;
    req.options.sampling.temperature = 0;
    req.options.stop_at_eog = false;
    req.session = session_for(a, static_cast<int64_t>(req.prompt.size()));
    req.adapters = bindings(a);
    const double t_submit = now_seconds();
    std::shared_ptr<GenerationStream> s = sched.submit_generation(req);
    bool cut = false;
    for (;;) {
      if (!cut && past_t()) {
        s->cancel();  // in flight at T: ends before its next step, not counted
        cut = true;
      }
      std::optional<GenerationEvent> e = s->next(0.05);
      if (!e) {
        if (now_seconds() > deadline + 120.0) throw Error("bench agents: a turn did not end within 120 s of T");
        continue;
      }
      if (e->kind == GenerationEvent::Kind::kText) continue;
      if (e->kind == GenerationEvent::Kind::kError) throw Error("bench agents: a turn failed: " + e->error);
      break;
    }
    if (cut || past_t()) {
      std::lock_guard lock(mu);
      ++run.cut_turns;
      return std::nullopt;
    }
    const double ttft = (s->first_token_at() > 0 ? s->first_token_at() : now_seconds()) - t_submit;
    std::lock_guard lock(mu);
    run.ttft_s.push_back(ttft);
    run.ttft_by_agent[a.name].push_back(ttft);
    ++run.turns;
    return req.prompt;
  };
  const auto handoff = [&](const std::string& source, std::vector<const Agent*> targets, const Tokens& shared) {
    if (!pp) return uint64_t{0};
    Handoff h;
    h.source = source;
    h.shared_context = shared;
    for (const Agent* t : targets) {
      HandoffTarget ht{t->name, t->name, bindings(*t), t->system, {}};
      // A learning agent runs on the base model until the first publish, then binds it.
      if (t->learns && ht.adapters.empty()) ht.on_first_publish.push_back({kLearnedAdapter, 1.0f, 0});
      h.targets.push_back(std::move(ht));
    }
    return pp->post(std::move(h));
  };
  const auto consume = [&](uint64_t id, const Agent& a) {
    if (pp && id) pp->consume(id, a.name);
  };
  const auto pause = [&] {
    const double until = std::min(now_seconds() + w.handoff_delay_s, deadline);
    while (now_seconds() < until)
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.05, until - now_seconds())));
  };

  std::vector<std::thread> workers;
  for (int k = 0; k < w.concurrency; ++k) {
    workers.emplace_back([&, k] {
      try {
        for (int64_t task = k; (w.tasks == 0 || task < w.tasks) && !past_t(); task += w.concurrency) {
          {
            std::lock_guard lock(mu);
            ++run.tasks_started;
          }
          bool done = true;
          // The task's script: seeded by the task alone, the same for every system.
          std::mt19937_64 rng(w.learn.seed * 1000003 + static_cast<uint64_t>(task));
          Tokens history = cat(random_tokens(rng, w.user_tokens, n_vocab), random_tokens(rng, w.context_tokens, n_vocab));
          uint64_t to_planner = 0;
          for (int step = 0; step < w.steps && done; ++step) {
            if (!turn(planner, history, random_tokens(rng, w.instruction_tokens, n_vocab))) {
              done = false;
              break;
            }
            consume(to_planner, planner);
            history = cat(history, random_tokens(rng, w.gen, n_vocab));  // the plan
            const uint64_t to_tool = handoff("planner", {&tool, &critic}, history);
            pause();
            consume(to_tool, tool);
            if (!turn(tool, history, random_tokens(rng, w.instruction_tokens, n_vocab))) {
              done = false;
              break;
            }
            history = cat(history, random_tokens(rng, w.gen, n_vocab));                 // the tool call
            history = cat(history, random_tokens(rng, w.tool_result_tokens, n_vocab));  // its result
            const uint64_t to_critic = handoff("tool", {&critic}, history);
            pause();
            consume(to_tool, critic);
            consume(to_critic, critic);
            const std::optional<Tokens> critic_turn = turn(critic, history, random_tokens(rng, w.instruction_tokens, n_vocab));
            if (!critic_turn) {
              done = false;
              break;
            }
            const Tokens& critic_prompt = *critic_turn;
            const Tokens verdict = random_tokens(rng, w.gen, n_vocab);
            history = cat(history, verdict);
            // The judge scores the step: the critic's prompt, its verdict, a short ask.
            learn.judge(cat(cat(critic_prompt, verdict), random_tokens(rng, 8, n_vocab)),
                        session_for(critic, static_cast<int64_t>(critic_prompt.size() + verdict.size() + 8 +
                                                                 w.learn.judge_gen)));
            if (step + 1 < w.steps) {
              to_planner = handoff("critic", {&planner}, history);
              pause();
            }
          }
          if (done) {
            std::lock_guard lock(mu);
            ++run.tasks_completed;
          }
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        if (failure.empty()) failure = e.what();
      }
    });
  }
  // Everything is counted as it stands at T.
  while (!past_t()) {
    {
      std::lock_guard lock(mu);
      if (!failure.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  run.wall_s = now_seconds() - t0;
  const SchedulerMetrics m = sched.metrics();
  const LearningResult lr = learn.result();
  const PrePrefillStats ps = pp ? pp->stats() : PrePrefillStats{};
  run.peak_rss_bytes = peak_rss();
  // Then the work in flight ends: turns cancelled, training stopped at its
  // next step boundary, waiting background tasks cancelled.
  for (auto& t : workers) t.join();
  learn.stop();
  sched.shutdown(0);
  run.run_s = now_seconds() - t0;
  if (!failure.empty()) throw Error(failure);
  run.wait_p50 = m.wait_p50_s;
  run.wait_p95 = m.wait_p95_s;
  run.wait_p99 = m.wait_p99_s;
  run.wait_max = m.wait_max_s;
  run.wait_behind_s = m.wait_behind_s;
  run.fg_busy_s = m.fg_busy_s;
  run.idle_s = m.idle_s;
  run.idle_bg_waiting_s = m.idle_bg_waiting_s;
  run.bg_busy_s = m.bg_busy_by_kind_s;
  run.bg_deferred_window = m.bg_deferred_window;
  run.bg_over_window = m.bg_over_window;
  run.bg_aged = m.bg_aged;
  run.bg_share = m.bg_share;
  run.bg_share_fg = m.bg_share_fg;
  run.cached_tokens = m.cached_tokens;
  run.prompt_tokens = m.prompt_tokens;
  run.offload_requests = m.offload_requests;
  run.offload_short = m.offload_short;
  run.offload_freed = m.offload_freed_bytes;
  run.bg_pending_memory = m.bg_pending_memory;
  run.commits = lr.commits;
  run.publishes = lr.publishes;
  run.publish_failures = lr.publish_failures;
  run.train_steps = lr.train_steps;
  run.train_phases = lr.train_phases;
  run.train_run_s = lr.train_run_s;
  run.judge_calls = lr.judge_calls;
  run.windows = lr.windows;
  run.window_s = lr.window_s;
  run.sleep_s = lr.sleep_s;
  run.wake_s = lr.wake_s;
  run.stale_tasks = lr.stale_tasks;
  run.stale_completed = lr.stale_completed;
  run.stale_tokens = lr.stale_tokens;
  if (pp) {
    run.preprefill_tasks = ps.tasks_submitted;
    run.preprefill_completed = ps.tasks_completed;
    run.preprefill_tokens = ps.tokens_prefilled;
    run.preprefill_stale = ps.stale;
    run.preprefill_s = ps.busy_s;
    run.preprefill_shrunk_steps = ps.shrunk_steps;
    run.preprefill_timed_steps = ps.timed_steps;
    run.preprefill_staged = ps.staged_planned;
    run.preprefill_staged_kept = ps.staged_promoted;
    run.preprefill_min_chunk = ps.min_chunk_tokens;
  }
  return run;
}

}  // namespace ebb::cli
