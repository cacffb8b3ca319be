// ebb serve --learn: the judge prompt as background inference (runtime/
// judge.h) and the learning state kept across a restart (runtime/
// learn_store.h). docs/agents.md describes both.
//
// A judge call: feedback without a reward on a turn of an agent whose judge
// is of kind "prompt" is answered at once (judging: true); its prompt is
// rendered, tokenized and submitted as a background task of kind "judge".
// When the call ends (on the scheduler thread) its result is queued; the
// learner thread attaches the score to the trace as a reward (source
// "judge", the correction kept) and makes the sample, or counts a failure.
//
// The state: the learner thread saves it (at most every kSaveInterval
// seconds, when it changed, and at stop): the versions and their gates, the
// published version per adapter, counters, replay buffers, held-back sets
// and baselines, and the weights of each published version (written once,
// as DIR/learned/ADAPTER/vN.gguf). Start-up loads it back, the versions
// under their own numbers, and publishes what was published.
#include <algorithm>
#include <filesystem>

#include "platform/error.h"
#include "platform/timer.h"
#include "platform/wall_clock.h"
#include "serve/server_learning.h"

namespace ebb::serve {

using nlohmann::json;

void Server::Impl::LearnState::trim_versions(const std::vector<AdapterInfo>& registry) {
  const auto published = [&](const VersionRecord& v) {
    for (const AdapterInfo& i : registry)
      if (i.published && i.name == v.adapter && i.version == v.version) return true;
    return false;
  };
  for (auto it = versions.begin(); versions.size() > kMaxVersions && it != versions.end();)
    it = published(*it) ? std::next(it) : versions.erase(it);
}

bool Server::Impl::submit_judge(const AgentSpec& a, const std::string& response_id, const std::string& prompt_text,
                                const std::string& response_text, const std::string& feedback, std::string* why_not) {
  LearnState& s = *learn_state;
  const auto fail = [&](const std::string& why) {
    std::lock_guard lock(s.mu);
    ++s.judge_calls;
    ++s.judge_failures;
    s.dirty = true;
    s.last_error = "judge of agent '" + a.name + "': " + why;
    s.judge_log.push_back(json{{"id", response_id}, {"agent", a.name}, {"answer", nullptr}, {"reward", nullptr},
                               {"ok", false}, {"error", why}, {"at", unix_now()}});
    while (s.judge_log.size() > LearnState::kMaxJudgeLog) s.judge_log.pop_front();
    if (why_not) *why_not = "the judge call could not run: " + why;
    return false;
  };
  const JudgeSpec& judge = judge_of(a);
  JudgeCall call;
  try {
    const std::string text = render_judge_prompt(judge.prompt, prompt_text, response_text, feedback);
    EncodeOptions eo;
    eo.add_bos = engine.tokenizer().add_bos_default();
    call.prompt = engine.tokenizer().encode(text, eo);
    if (!judge.grammar.empty()) {
      call.grammar = grammar::Grammar::parse(judge.grammar);
      call.vocab = token_trie();
    }
  } catch (const Error& e) {
    return fail(e.what());
  }
  if (call.prompt.empty()) return fail("the rendered judge prompt has no tokens");
  if (static_cast<int64_t>(call.prompt.size()) + judge.max_tokens > opts.n_ctx)
    return fail("the rendered judge prompt has " + std::to_string(call.prompt.size()) + " tokens; with max_tokens " +
                std::to_string(judge.max_tokens) + " it does not fit the context (" + std::to_string(opts.n_ctx) +
                ", --ctx)");
  if (!judge.adapter.empty() && !has_adapter(judge.adapter))
    return fail("no adapter '" + judge.adapter + "' is loaded (judge.adapter)");
  call.adapter = judge.adapter;
  call.max_tokens = judge.max_tokens;
  const std::string agent = a.name, correction = feedback;
  Task t = judge_task(
      engine, std::move(call),
      [this, response_id, agent, correction](JudgeResult r) {
        LearnState& ls = *learn_state;
        {
          std::lock_guard lock(ls.mu);
          ls.judged.push_back(LearnState::Judged{response_id, agent, correction, std::move(r), unix_now()});
        }
        ls.cv.notify_all();
      },
      &sched);
  {
    std::lock_guard lock(s.mu);
    ++s.judge_pending;
  }
  try {
    sched.submit_background(std::move(t));
  } catch (const SchedulerBusy& e) {
    {
      std::lock_guard lock(s.mu);
      --s.judge_pending;
    }
    return fail(std::string("the scheduler refused it: ") + e.what());
  }
  return true;
}

void Server::Impl::learner_chores(std::unique_lock<std::mutex>& lock, bool force_save) {
  LearnState& s = *learn_state;
  // Judge calls that ended: their scores become rewards on their traces.
  while (!s.judged.empty()) {
    LearnState::Judged x = std::move(s.judged.front());
    s.judged.pop_front();
    const JudgeResult& r = x.result;
    json log = {{"id", x.response_id},
                {"agent", x.agent},
                {"answer", r.ran ? json(r.answer) : json(nullptr)},
                {"reward", r.reward ? json(*r.reward) : json(nullptr)},
                {"steps", r.steps},
                {"adapter_version", r.adapter_version ? json(r.adapter_version) : json(nullptr)},
                {"foreground_active_at_start", r.fg_active_at_start},
                {"foreground_completed_at_start", r.fg_completed_at_start},
                {"at", x.at}};
    if (!r.ran || !r.reward) {
      ++s.judge_failures;
      const std::string why = !r.ran ? r.error : "the answer '" + r.answer + "' has no score (0-10, yes or no)";
      s.last_error = "judge of agent '" + x.agent + "': " + why;
      log["ok"] = false;
      log["error"] = why;
    } else {
      TraceFeedback fb;
      fb.reward = *r.reward;
      fb.correction = x.correction;
      fb.source = "judge";
      json out;
      lock.unlock();  // give_feedback takes the lock
      const bool found = give_feedback(x.response_id, fb, &out);
      lock.lock();
      log["ok"] = true;
      log["applied"] = found && out.value("applied", false);
      if (!found) log["error"] = "the trace is gone (retention)";
    }
    // The counts move with the log entry, under one hold of the lock (the
    // feedback above released it), so /v1/learning never shows a call
    // counted and not yet logged.
    --s.judge_pending;
    ++s.judge_calls;
    s.dirty = true;
    s.judge_log.push_back(std::move(log));
    while (s.judge_log.size() > LearnState::kMaxJudgeLog) s.judge_log.pop_front();
  }

  // The state on disk.
  if (!s.store || (!s.dirty && s.weights_pending.empty())) return;
  const double now = unix_now();
  if (!force_save && now - s.last_save < LearnState::kSaveInterval) return;
  std::deque<std::pair<std::string, uint64_t>> pending;
  pending.swap(s.weights_pending);
  const double t0 = now_seconds();
  s.dirty = false;
  s.saving = true;  // not "saved" until the transaction is in
  lock.unlock();
  std::map<std::pair<std::string, uint64_t>, std::string> written;
  std::string error;
  for (const auto& [name, version] : pending) {
    try {
      const std::vector<AdapterBinding> b = {{name, 1.0f, version}};
      const AdapterSet set = engine.adapters().resolve(b);
      if (!set.empty()) written[{name, version}] = s.store->write_weights(name, version, *set[0].v->lora);
    } catch (const Error& e) {
      error = "cannot keep adapter '" + name + "' version " + std::to_string(version) + ": " + e.what();
    }
  }
  std::vector<AdapterInfo> reg = engine.adapters().list();
  lock.lock();
  for (auto& [k, f] : written) s.weight_files[k] = f;
  LearnSnapshot snap;
  for (const VersionRecord& v : s.versions) {
    LearnVersionRow r{v.agent, v.adapter, v.version, v.against, v.gate, v.loss, v.loss_published,
                      v.published, v.step, v.at, ""};
    if (const auto it = s.weight_files.find({v.adapter, v.version}); it != s.weight_files.end()) r.file = it->second;
    snap.versions.push_back(std::move(r));
  }
  for (const AdapterInfo& i : reg)
    if (i.published)
      for (const VersionRecord& v : s.versions)
        if (v.adapter == i.name) {
          snap.published[i.name] = i.version;
          break;
        }
  int64_t steps = s.retired_steps;  // with the rounds running (as /v1/learning counts them)
  for (const auto& [name, loop] : s.loops)
    if (loop.job) steps += loop.job->status().step;
  snap.counters = {{"feedback", static_cast<double>(s.feedback)},
                   {"feedback_unapplied", static_cast<double>(s.feedback_unapplied)},
                   {"samples", static_cast<double>(s.samples)},
                   {"train_steps", static_cast<double>(steps)},
                   {"committed_versions", static_cast<double>(s.committed)},
                   {"published_versions", static_cast<double>(s.published)},
                   {"rejected_versions", static_cast<double>(s.rejected)},
                   {"rollbacks", static_cast<double>(s.rollbacks)},
                   {"rounds_failed", static_cast<double>(s.rounds_failed)},
                   {"judge_calls", static_cast<double>(s.judge_calls)},
                   {"judge_failures", static_cast<double>(s.judge_failures)}};
  for (const auto& [name, loop] : s.loops) {
    LearnLoopRow l;
    l.agent = name;
    l.baseline_mean = loop.baseline.mean();
    l.baseline_n = loop.baseline.count();
    l.positives = loop.positives;
    l.fresh = loop.fresh;
    l.rounds = loop.rounds;
    l.replay.assign(loop.replay.items().begin(), loop.replay.items().end());
    l.heldout = loop.heldout;
    snap.loops.push_back(std::move(l));
  }
  lock.unlock();
  try {
    s.store->save(snap);
  } catch (const Error& e) {
    error = e.what();
  }
  lock.lock();
  s.saving = false;
  s.last_save = now;
  s.last_save_s = now_seconds() - t0;
  ++s.saves;
  if (!error.empty()) {
    ++s.save_failures;
    s.last_error = "saving the learning state: " + error;
    s.dirty = true;  // try again
  }
}

void Server::Impl::restore_learning() {
  LearnState& s = *learn_state;
  std::vector<std::string> notes;
  try {
    s.store = std::make_unique<LearnStore>(*s.traces);
  } catch (const Error& e) {
    notes.push_back(std::string("the learning state cannot be kept: ") + e.what());
  }
  int64_t skipped = 0;
  LearnSnapshot snap;
  if (s.store) {
    try {
      snap = s.store->load(&skipped);
    } catch (const Error& e) {
      notes.push_back(std::string("the saved learning state cannot be read (starting without it): ") + e.what());
      snap = LearnSnapshot{};
    }
  }
  if (skipped) notes.push_back(std::to_string(skipped) + " saved samples could not be read and were left out");
  // The published versions' weights, under their own numbers.
  std::map<std::string, std::vector<const LearnVersionRow*>> files;
  for (const LearnVersionRow& v : snap.versions)
    if (!v.file.empty()) files[v.adapter].push_back(&v);
  int64_t loaded = 0;
  std::map<std::pair<std::string, uint64_t>, std::string> kept;
  if (!files.empty() && s.store) {
    const std::string dir = s.store->dir();
    on_engine(sched, [&](Engine& e) {
      for (auto& [name, vs] : files) {
        std::sort(vs.begin(), vs.end(), [](auto* x, auto* y) { return x->version < y->version; });
        bool any = false;
        for (const LearnVersionRow* v : vs) {
          try {
            e.adapters().load_version((std::filesystem::path(dir) / v->file).string(), name, v->version, false);
            kept[{name, v->version}] = v->file;
            any = true;
            ++loaded;
          } catch (const Error& err) {
            notes.push_back("adapter '" + name + "' version " + std::to_string(v->version) +
                            " was not restored: " + err.what());
          }
        }
        const auto p = snap.published.find(name);
        if (!any || p == snap.published.end()) continue;
        try {
          e.adapters().publish(name, p->second);
        } catch (const Error& err) {
          notes.push_back("adapter '" + name + "': its published version " + std::to_string(p->second) +
                          " was not restored (" + err.what() + ")");
        }
      }
      return 0;
    });
  }
  std::lock_guard lock(s.mu);
  const auto counter = [&](const char* k) {
    const auto it = snap.counters.find(k);
    return it == snap.counters.end() ? int64_t{0} : static_cast<int64_t>(it->second);
  };
  s.feedback = counter("feedback");
  s.feedback_unapplied = counter("feedback_unapplied");
  s.samples = counter("samples");
  s.retired_steps = counter("train_steps");
  s.committed = counter("committed_versions");
  s.published = counter("published_versions");
  s.rejected = counter("rejected_versions");
  s.rollbacks = counter("rollbacks");
  s.rounds_failed = counter("rounds_failed");
  s.judge_calls = counter("judge_calls");
  s.judge_failures = counter("judge_failures");
  for (const LearnVersionRow& v : snap.versions) {
    VersionRecord r;
    r.agent = v.agent;
    r.adapter = v.adapter;
    r.version = v.version;
    r.against = v.against;
    r.gate = v.gate;
    r.loss = v.loss;
    r.loss_published = v.loss_published;
    r.published = v.published;
    r.step = v.step;
    r.at = v.at;
    s.versions.push_back(std::move(r));
  }
  s.trim_versions(engine.adapters().list());
  s.weight_files = std::move(kept);
  int64_t samples = 0;
  for (LearnLoopRow& l : snap.loops) {
    AgentLoop& loop = s.loops.try_emplace(l.agent, opts.learn.replay).first->second;
    loop.baseline.restore(l.baseline_mean, l.baseline_n);
    loop.positives = l.positives;
    loop.fresh = l.fresh;
    loop.rounds = l.rounds;
    for (LearnSample& x : l.replay) loop.replay.push(std::move(x));
    loop.heldout = std::move(l.heldout);
    samples += static_cast<int64_t>(loop.replay.size() + loop.heldout.size());
  }
  s.restored = json{{"versions", snap.versions.size()},
                    {"adapter_versions_loaded", loaded},
                    {"published", snap.published},
                    {"agents", snap.loops.size()},
                    {"samples", samples}};
  for (const std::string& n : notes) {
    std::fprintf(stderr, "ebb serve: %s\n", n.c_str());
    s.notes.push_back(n);
  }
}

void Server::Impl::learning_state_json(json& out) const {
  const LearnState& s = *learn_state;
  json judges = json::array();
  for (const json& j : s.judge_log) judges.push_back(j);
  out["judges"] = judges;
  out["state"] = {{"kept", s.store != nullptr},
                  {"saved", s.store != nullptr && !s.dirty && !s.saving && s.weights_pending.empty()},
                  {"saves", s.saves},
                  {"save_failures", s.save_failures},
                  {"last_save_s", s.last_save_s},
                  {"restored", s.restored.is_null() ? json(nullptr) : s.restored}};
}

}  // namespace ebb::serve
