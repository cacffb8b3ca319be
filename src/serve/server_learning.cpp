// The online learning loop of ebb serve --learn (issue 38 part 4; LOCAL
// §2.2; docs/agents.md): traces, feedback, the judge, the learner.
//
//   POST /v1/feedback             {"id", "reward": x | "rating": 1..5 | "up" | "down" | "correction": text}
//   GET  /v1/learning             counts, published versions, recent versions with their gates
//   GET  /v1/learning/traces/{id} one trace (token ids, text, feedback)
//   POST /v1/learning/rollback    {"adapter", "version"}: publishes that (earlier) version again
//
// A learning agent's turns are traces (runtime/trace_store.h, DIR/traces.sqlite,
// written off the decode path). Feedback attaches to the trace with that
// response id; the judge (runtime/learner.h) turns it into a training
// sample: a correction trains toward the corrected text, a reward trains the
// sampled tokens with its advantage over the agent's running-mean reward.
// The first positive sample and every heldout_every-th after it are held
// back for the gate; the rest go to the agent's replay buffer. Feedback also
// comes from the agent's next user message (a rename in the rule's form, the
// "rule" feedback policy) and from a tool result {"reward": x} that follows
// its turn.
//
// The learner thread starts a round when an agent has min_samples new
// samples and no round running: a training job (train/train_job.h) on the
// scheduler over the replay buffer, continuing the agent's published
// version, steps optimizer steps, a version committed and staged every
// commit_every steps. Each committed version meets the gate on the scheduler
// thread: its held-back loss against the published version's (the base
// model's before the first), measured by a background task of kind "gate"
// one held-back sample per step; not worse: published (the agent follows
// it; the other agents' KV keeps its coverage, keyed by their own adapters);
// worse: left staged, and dropped by the round's next commit. While no
// version of the name has passed, the agent runs on the base model; a
// rejected version then is unloaded and the round goes on: its next
// version is gated against the base model (finish_gate).
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "platform/error.h"
#include "platform/thread_name.h"
#include "platform/timer.h"
#include "platform/wall_clock.h"
#include "serve/server_learning.h"

namespace ebb::serve {

using nlohmann::json;

namespace {

json trace_json(const Trace& t) {
  json j = {{"object", "learning.trace"},
            {"id", t.response_id},
            {"agent", t.agent},
            {"adapter", t.adapter.empty() ? json(nullptr) : json(t.adapter)},
            {"adapter_version", t.adapter_version ? json(t.adapter_version) : json(nullptr)},
            {"prompt_token_ids", t.prompt},
            {"token_ids", t.output},
            {"text", t.text},
            {"tool_calls", t.tool_calls.empty() ? json(nullptr) : json::parse(t.tool_calls, nullptr, false)},
            {"created", t.created_s},
            {"ttft_s", t.ttft_s},
            {"seconds", t.total_s},
            {"feedback", nullptr}};
  if (t.has_feedback)
    j["feedback"] = {{"reward", t.reward ? json(*t.reward) : json(nullptr)},
                     {"correction", t.correction.empty() ? json(nullptr) : json(t.correction)},
                     {"source", t.feedback_source},
                     {"at", t.feedback_s}};
  return j;
}

json version_json(const VersionRecord& v) {
  return {{"agent", v.agent},       {"adapter", v.adapter},
          {"version", v.version},   {"gated_against", v.against ? json(v.against) : json(nullptr)},
          {"gate", v.gate},         {"heldout_loss", v.gate == "passed" || v.gate == "rejected" ? json(v.loss) : json(nullptr)},
          {"heldout_loss_published", v.gate == "passed" || v.gate == "rejected" ? json(v.loss_published) : json(nullptr)},
          {"published", v.published}, {"step", v.step}, {"at", v.at}};
}

// What one feedback call judged.
struct Judged {
  bool applied = false;   // a training sample came of it
  bool heldout = false;   // ... held back for the gate
  double weight = 0;      // its weight (advantage or the correction's)
  std::string why_not;    // !applied: why
};

}  // namespace

namespace {

// Turns feedback on trace `t` into a sample of the agent's loop (ls.mu held).
Judged judge(const Trace& t, const TraceFeedback& fb, AgentLoop& loop, const LearnOptions& lo, const Tokenizer& tok) {
  Judged j;
  LearnSample s;
  if (!fb.correction.empty() && !fb.reward) {  // with a reward (a judge call's): the reward trains
    const std::optional<std::string> target = judge_correction(t.text, fb.correction);
    if (!target) {
      j.why_not = "the correction renames a word the response does not have";
      return j;
    }
    EncodeOptions eo;
    eo.add_bos = false;
    const std::vector<int32_t> ids = tok.encode(*target, eo);
    if (ids.empty()) {
      j.why_not = "the corrected text is empty";
      return j;
    }
    s = make_sample(t.response_id, t.prompt, ids, lo.correction_weight);
  } else if (fb.reward) {
    const double adv = loop.baseline.advantage(*fb.reward);
    if (t.output.empty() || adv == 0) {
      j.why_not = t.output.empty() ? "the turn generated no tokens" : "the reward equals the baseline (advantage 0)";
      return j;
    }
    s = make_sample(t.response_id, t.prompt, t.output, adv);
  } else {
    j.why_not = "no reward and no correction";
    return j;
  }
  j.applied = true;
  j.weight = s.weight;
  if (s.positive()) {
    const bool hold = loop.heldout.size() < lo.heldout &&
                      (loop.heldout.empty() || loop.positives % std::max<int64_t>(1, lo.heldout_every) == 0);
    ++loop.positives;
    if (hold) {
      TrainSample h = s.sample;
      for (float& w : h.weights) w = w > 0 ? 1.0f : 0.0f;
      loop.heldout.push_back(std::move(h));
      j.heldout = true;
      return j;
    }
  }
  loop.replay.push(std::move(s));
  ++loop.fresh;
  return j;
}

}  // namespace

void Server::Impl::learning_routes() {
  LearnState& ls = *learn_state;
  const LearnOptions& lo = opts.learn;
  if (lo.learn) {
    if (lo.state_dir.empty()) throw Error("ebb serve --learn needs --state-dir DIR (traces and agents are kept there)");
    std::string note;
    TraceStoreOptions to;
    to.max_rows = lo.max_trace_rows;
    to.max_bytes = lo.max_trace_bytes;
    ls.traces = TraceStore::open((std::filesystem::path(lo.state_dir) / "traces.sqlite").string(), to, &note);
    if (!note.empty()) {
      std::fprintf(stderr, "ebb serve: %s\n", note.c_str());
      ls.notes.push_back(note);
    }
    restore_learning();
    ls.thread = std::thread([this] {
      set_current_thread_name("ebb-learner");
      LearnState& s = *learn_state;
      std::unique_lock lock(s.mu);
      while (!s.stop) {
        // Polls only while a round runs (its end is noticed here) or a save
        // of the state is due (at most one per kSaveInterval); else sleeps
        // until feedback, a gate, a rollback or stop() notifies, so a server
        // whose agents only record traces has no thread waking beside decode.
        bool polling = false;
        for (const auto& [name, loop] : s.loops) polling = polling || loop.job != nullptr;
        const bool save_due = s.store && (s.dirty || !s.weights_pending.empty());
        if (polling) s.cv.wait_for(lock, std::chrono::milliseconds(50));
        else if (save_due) s.cv.wait_for(lock, std::chrono::duration<double>(LearnState::kSaveInterval));
        else s.cv.wait(lock);
        if (s.stop) break;
        learner_chores(lock, false);
        for (auto& [name, loop] : s.loops) {
          if (loop.job && loop.job->finished()) {
            const TrainJobStatus st = loop.job->status();
            s.retired_steps += st.step;
            if (st.state == TrainJobState::kFailed) {
              ++s.rounds_failed;
              s.last_error = "agent '" + name + "': " + st.error;
            }
            // A round that ended before its first gate leaves the name as it was.
            if (const std::optional<AgentSpec> sp = s.agents->get(name))
              if (!s.gates_pending.count(sp->adapter)) s.ungated_first.erase(sp->adapter);
            loop.job.reset();
            s.dirty = true;
          }
          if (loop.job || loop.fresh < opts.learn.min_samples) continue;
          const std::optional<AgentSpec> a = s.agents->get(name);
          if (!a || !a->learn || a->adapter.empty()) continue;
          std::vector<TrainSample> samples;
          for (const LearnSample& x : loop.replay.items()) samples.push_back(x.sample);
          std::vector<TrainSample> heldout = loop.heldout;
          loop.fresh = 0;
          ++loop.rounds;
          s.dirty = true;
          const std::string agent = name;
          lock.unlock();  // the scheduler thread takes s.mu in the gate
          std::shared_ptr<TrainJob> job;
          try {
            job = start_round(*a, std::move(samples), std::move(heldout));
          } catch (const std::exception& e) {
            lock.lock();
            ++s.rounds_failed;
            s.last_error = "agent '" + agent + "': " + e.what();
            break;  // the map may have changed: iterate anew
          }
          lock.lock();
          const auto it = s.loops.find(agent);
          if (it != s.loops.end()) it->second.job = job;
          break;
        }
      }
    });
  }

  http.Post("/v1/feedback", guarded([this](const httplib::Request& req, httplib::Response& res) {
              LearnState& s = *learn_state;
              const json body = parse_body(req);
              if (!body.is_object()) throw ApiException(invalid_request("the body must be a JSON object"));
              for (auto it = body.begin(); it != body.end(); ++it) {
                const std::string& k = it.key();
                if (k != "id" && k != "reward" && k != "rating" && k != "correction")
                  throw ApiException(invalid_request("'" + k + "' is not a feedback field (id, reward, rating, correction)", k));
              }
              if (!body.contains("id") || !body["id"].is_string() || body["id"].get<std::string>().empty())
                throw ApiException(invalid_request("'id' must be the response's id (a string)", "id"));
              const int kinds = body.contains("reward") + body.contains("rating") + body.contains("correction");
              if (kinds != 1)
                throw ApiException(invalid_request("give exactly one of 'reward', 'rating' or 'correction'",
                                                   kinds == 0 ? "reward" : "correction"));
              TraceFeedback fb;
              if (body.contains("reward")) {
                const json& v = body["reward"];
                if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 100)
                  throw ApiException(invalid_request("'reward' must be a number in [-100, 100]", "reward"));
                fb.reward = v.get<double>();
              } else if (body.contains("rating")) {
                const json& v = body["rating"];
                if (v == "up") fb.reward = 1.0;
                else if (v == "down") fb.reward = -1.0;
                else if (v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 5)
                  fb.reward = (v.get<double>() - 3.0) / 2.0;
                else
                  throw ApiException(invalid_request("'rating' must be \"up\", \"down\" or an integer 1..5", "rating"));
              } else {
                const json& v = body["correction"];
                if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>().size() > 64 * 1024)
                  throw ApiException(invalid_request("'correction' must be a non-empty string of at most 64 KiB",
                                                     "correction"));
                fb.correction = v.get<std::string>();
              }
              if (!s.traces)
                throw ApiException(invalid_request("feedback needs traces: start ebb serve with --learn --state-dir DIR",
                                                   "id", "learning_off"));
              const std::string id = body["id"].get<std::string>();
              json out;
              if (!give_feedback(id, fb, &out)) {
                ApiError e = error_of(404, "no trace of response '" + id + "' (only learning agents' turns are traced)",
                                      "invalid_request_error", "trace_not_found");
                e.param = "id";
                throw ApiException(e);
              }
              res.set_content(dump(out), kJson);
            }));

  http.Get("/v1/learning", guarded([this](const httplib::Request&, httplib::Response& res) {
             res.set_content(dump(learning_json()), kJson);
           }));
  http.Get(R"(/v1/learning/traces/([A-Za-z0-9_.-]+))",
           guarded([this](const httplib::Request& req, httplib::Response& res) {
             const std::string id = req.matches[1];
             const std::optional<Trace> t = learn_state->traces ? learn_state->traces->find(id) : std::nullopt;
             if (!t) {
               ApiError e = error_of(404, "no trace of response '" + id + "'", "invalid_request_error", "trace_not_found");
               throw ApiException(e);
             }
             res.set_content(dump(trace_json(*t)), kJson);
           }));
  http.Post("/v1/learning/rollback", guarded([this](const httplib::Request& req, httplib::Response& res) {
              const json body = parse_body(req);
              if (!body.is_object()) throw ApiException(invalid_request("the body must be a JSON object"));
              if (!body.contains("adapter") || !body["adapter"].is_string())
                throw ApiException(invalid_request("'adapter' must be an adapter name", "adapter"));
              if (!body.contains("version") || !body["version"].is_number_integer() || body["version"].get<int64_t>() < 1)
                throw ApiException(invalid_request("'version' must be an integer >= 1", "version"));
              const std::string name = body["adapter"].get<std::string>();
              const uint64_t version = body["version"].get<uint64_t>();
              bool known_name = false, known_version = false;
              for (const AdapterInfo& i : engine.adapters().list()) {
                known_name = known_name || i.name == name;
                known_version = known_version || (i.name == name && i.version == version);
              }
              if (!known_version) {
                ApiError e = error_of(404,
                                      known_name ? "adapter '" + name + "' has no version " + std::to_string(version) +
                                                       " (GET /v1/adapters lists them)"
                                                 : "no adapter '" + name + "' (GET /v1/adapters lists them)",
                                      "invalid_request_error", "adapter_not_found");
                e.param = known_name ? "version" : "adapter";
                throw ApiException(e);
              }
              on_engine(sched, [name, version](Engine& e) {
                e.adapters().publish(name, version);
                return 0;
              });
              adapter_published(name, version);  // pending handoff targets re-planned under it
              {
                std::lock_guard lock(learn_state->mu);
                ++learn_state->rollbacks;
                learn_state->dirty = true;
              }
              learn_state->cv.notify_all();  // the learner saves it
              res.set_content(dump(json{{"object", "learning.rollback"}, {"adapter", name}, {"published", version}}),
                              kJson);
            }));
}

std::shared_ptr<TrainJob> Server::Impl::start_round(const AgentSpec& a, std::vector<TrainSample> samples,
                                                    std::vector<TrainSample> heldout) {
  const LearnOptions& lo = opts.learn;
  TrainerOptions to;
  to.init.rank = lo.rank;
  to.init.alpha = static_cast<float>(lo.alpha);
  to.adamw.lr = static_cast<float>(lo.lr);
  to.batch = std::min<int64_t>(lo.batch, static_cast<int64_t>(samples.size()));
  to.phase_target_s = lo.phase_s;  // what a request arriving mid-phase waits at most, about
  TrainJobOptions jo;
  jo.adapter = a.adapter;
  jo.steps = lo.steps;
  jo.commit_every = lo.commit_every;
  jo.publish_auto = false;  // the gate publishes
  auto shared_heldout = std::make_shared<const std::vector<TrainSample>>(std::move(heldout));
  const std::string agent = a.name;
  auto self_holder = std::make_shared<std::weak_ptr<TrainJob>>();  // the job, once made (its step for the record)
  jo.on_commit = [this, agent, shared_heldout, self_holder](const AdapterInfo& staged, uint64_t dropped) {
    gate(agent, staged, dropped, *shared_heldout, self_holder->lock());
  };
  std::shared_ptr<TrainJob> job = on_engine(sched, [&](Engine& e) {
    AdapterSet from;
    for (const AdapterInfo& i : e.adapters().list())
      if (i.name == a.adapter && i.published) {
        from = e.adapters().resolve(std::vector<AdapterBinding>{{a.adapter, 1.0f, i.version}});
        break;
      }
    if (from.empty()) {
      std::lock_guard lock(learn_state->mu);
      learn_state->ungated_first.insert(a.adapter);
    }
    return TrainJob::make(e, std::move(samples), to, jo, from.empty() ? nullptr : from[0].v->lora.get());
  });
  *self_holder = job;
  job->submit(sched);
  return job;
}

// On the scheduler thread, after a round committed and staged a version:
// the gate, as a background task of kind "gate" measuring one held-back
// sample under one version per step (so a request waits for one sample's
// forward at most), then finish_gate().
void Server::Impl::gate(const std::string& agent, const AdapterInfo& staged, uint64_t dropped,
                        const std::vector<TrainSample>& heldout, const std::shared_ptr<TrainJob>& job) {
  VersionRecord v;
  v.agent = agent;
  v.adapter = staged.name;
  v.version = staged.version;
  v.step = job ? job->status().step : 0;
  handoffs_staged(v.adapter, v.version);  // warm while the gate runs
  if (opts.learn.gate == "off" || heldout.empty()) {
    const bool first = gate_baseline(v);
    v.gate = opts.learn.gate == "off" ? "off" : "no_heldout";
    v.published = true;
    finish_gate(v, first, dropped);
    return;
  }
  struct GateRun {
    VersionRecord v;
    bool first = false;
    uint64_t dropped = 0;
    std::vector<TrainSample> heldout;
    size_t next = 0;  // [0, n): the new version's samples, [n, 2n): the published version's
    LossSum mine, theirs;
    bool superseded = false;  // the round's next commit dropped it before its gate began
  };
  auto run = std::make_shared<GateRun>();
  run->v = v;
  run->dropped = dropped;
  run->heldout = heldout;
  {
    std::lock_guard lock(learn_state->mu);
    ++learn_state->gates_pending[staged.name];
  }
  Task t;
  t.desc.kind = "gate";
  t.desc.adapter = staged.name;
  t.step = [this, run] {
    // What it is measured against, as the gate starts (not at the commit: a
    // first version rejected meanwhile leaves the base model to beat).
    if (run->next == 0) {
      bool present = false;
      for (const AdapterInfo& i : engine.adapters().list())
        present = present || (i.name == run->v.adapter && i.version == run->v.version);
      if (!present) {
        run->superseded = true;
        return false;
      }
      run->first = gate_baseline(run->v);
    }
    const size_t n = run->heldout.size();
    const bool mine = run->next < n;
    const TrainSample& s = run->heldout[run->next % n];
    const LossSum l = mine ? heldout_loss_sum(engine, run->v.adapter, run->v.version, s)
                           : heldout_loss_sum(engine, run->v.against ? run->v.adapter : "", run->v.against, s);
    LossSum& to = mine ? run->mine : run->theirs;
    to.sum += l.sum;
    to.tokens += l.tokens;
    return ++run->next < 2 * n;
  };
  t.on_done = [this, run](TaskOutcome outcome, const std::string& error) {
    VersionRecord& v = run->v;
    if (run->superseded) {
      // A newer version of the round replaced it (the job drops a staged
      // version at its next commit): that one is gated instead.
      v.published = false;
      v.gate = "superseded";
      finish_gate(v, false, run->dropped);
      return;
    }
    if (outcome == TaskOutcome::kCompleted) {
      v.loss = run->mine.tokens ? run->mine.sum / static_cast<double>(run->mine.tokens) : 0.0;
      v.loss_published = run->theirs.tokens ? run->theirs.sum / static_cast<double>(run->theirs.tokens) : 0.0;
      v.published = v.loss <= v.loss_published;
      v.gate = v.published ? "passed" : "rejected";
    } else {
      v.published = false;
      v.gate = outcome == TaskOutcome::kCancelled ? "cancelled" : "error: " + error;
    }
    finish_gate(v, run->first, run->dropped);
  };
  try {
    sched.submit_background(std::move(t));
  } catch (const SchedulerBusy& e) {
    v.gate = std::string("error: ") + e.what();
    finish_gate(v, gate_baseline(v), dropped);
  }
}

bool Server::Impl::gate_baseline(VersionRecord& v) {
  bool ungated = false;
  {
    std::lock_guard lock(learn_state->mu);
    ungated = learn_state->ungated_first.count(v.adapter) > 0;
  }
  v.against = 0;
  if (ungated) return true;  // no version of the name passed a gate yet: the base model
  for (const AdapterInfo& i : engine.adapters().list())
    if (i.name == v.adapter && i.published) v.against = i.version;
  // The registry publishes the first version of a name by itself.
  if (v.against == v.version) {
    v.against = 0;
    return true;
  }
  return false;
}

void Server::Impl::finish_gate(VersionRecord v, bool first, uint64_t dropped) {
  v.at = unix_now();
  if (first && !v.published) {
    // Another version of the name may have passed meanwhile: then this one
    // is an ordinary rejected version, left staged.
    std::lock_guard lock(learn_state->mu);
    first = learn_state->ungated_first.count(v.adapter) > 0;
  }
  try {
    if (v.published) {
      engine.adapters().publish(v.adapter, v.version);
      adapter_published(v.adapter, v.version);  // pending handoff targets re-planned under it
    } else if (first) {
      // A rejected version while no version of the name has passed: it
      // goes, and the agent stays on the base model (ungated_first holds
      // while the round runs). The round goes on learning: a later version
      // it already staged stays, made the name's default in the registry
      // (still not served: ungated), and is gated against the base model;
      // the next commit of an unloaded name starts it anew.
      uint64_t later = 0;
      for (const AdapterInfo& i : engine.adapters().list())
        if (i.name == v.adapter && i.version != v.version) later = std::max(later, i.version);
      if (later == 0) {
        engine.adapters().unload(v.adapter);
      } else {
        engine.adapters().publish(v.adapter, later);
        engine.adapters().unload(v.adapter, v.version);
      }
    }
  } catch (const Error& e) {
    // Gone meanwhile (a rollback, an unload): nothing to publish.
    v.published = false;
    v.gate += std::string(" (") + e.what() + ")";
  }
  // Stale-coverage prefill of a version left staged; a published one is
  // what the agent's next request prefills anyway.
  if (!first || v.published) adapter_staged(v.adapter, v.published ? 0 : v.version, dropped);
  if (opts.log_requests)
    std::fprintf(stderr, "learn %s: %s v%llu gate %s (held-back loss %.4f vs %.4f of v%llu)%s\n", v.agent.c_str(),
                 v.adapter.c_str(), static_cast<unsigned long long>(v.version), v.gate.c_str(), v.loss,
                 v.loss_published, static_cast<unsigned long long>(v.against), v.published ? ", published" : "");
  std::lock_guard lock(learn_state->mu);
  if (const auto it = learn_state->gates_pending.find(v.adapter); it != learn_state->gates_pending.end())
    if (--it->second <= 0) learn_state->gates_pending.erase(it);
  if (v.published) learn_state->ungated_first.erase(v.adapter);  // a rejected first keeps the agent on the base
  ++learn_state->committed;
  if (v.published) ++learn_state->published;
  else if (v.gate != "superseded") ++learn_state->rejected;
  learn_state->versions.push_back(v);
  learn_state->dirty = true;
  if (v.published) learn_state->weights_pending.emplace_back(v.adapter, v.version);  // kept across a restart
  learn_state->trim_versions(engine.adapters().list());
  learn_state->cv.notify_all();  // the learner saves it
}

bool Server::Impl::give_feedback(const std::string& id, const TraceFeedback& fb, json* out) {
  LearnState& s = *learn_state;
  if (!s.traces) return false;
  const std::optional<Trace> t = s.traces->find(id);
  if (!t) return false;
  if (!s.traces->attach(id, fb)) return false;
  Judged j;
  const std::optional<AgentSpec> a = s.agents->get(t->agent);
  // The agent's judge prompt scores feedback without a reward, in the background.
  const bool by_prompt = a && a->learn && a->feedback != "off" && judge_of(*a).kind == "prompt" && !fb.reward;
  {
    std::lock_guard lock(s.mu);
    if (fb.source != "judge") ++s.feedback;  // a judge call's reward is the same feedback, scored
    s.dirty = true;
    if (by_prompt) {
      j.why_not = "scored by the agent's judge prompt in the background (judge_calls in /v1/learning)";
    } else if (a && a->learn && a->feedback != "off" && judge_of(*a).kind == "client" && !fb.reward) {
      j.why_not = "the agent's judge takes client rewards only (judge.kind \"client\")";
      ++s.feedback_unapplied;
    } else if (a && a->learn && a->feedback != "off") {
      auto it = s.loops.try_emplace(a->name, opts.learn.replay).first;
      j = judge(*t, fb, it->second, opts.learn, engine.tokenizer());
      if (j.applied) ++s.samples;
      else ++s.feedback_unapplied;
    } else {
      j.why_not = a ? "the agent does not learn" : "the agent is gone";
      ++s.feedback_unapplied;
    }
  }
  bool judging = false;
  if (by_prompt) {
    std::string why;
    judging = submit_judge(*a, id, engine.tokenizer().decode(t->prompt), t->text, fb.correction, &why);
    if (!judging) j.why_not = why;
  }
  s.cv.notify_all();
  if (out)
    *out = {{"object", "learning.feedback"},
            {"judging", judging},
            {"id", id},
            {"agent", t->agent},
            {"source", fb.source},
            {"applied", j.applied},
            {"heldout", j.heldout},
            {"weight", j.applied ? json(j.weight) : json(nullptr)},
            {"reason", j.applied ? json(nullptr) : json(j.why_not)}};
  return true;
}

void Server::Impl::next_state_feedback(const AgentSpec& a, const CompletionRequest& r) {
  LearnState& s = *learn_state;
  std::string last;
  {
    std::lock_guard lock(s.mu);
    const auto it = s.loops.find(a.name);
    if (it == s.loops.end() || it->second.last_response.empty()) return;
    last = it->second.last_response;
  }
  // The messages after the last assistant turn: a tool result {"reward": x},
  // or the user's message in the rule's form.
  const json& m = r.chat_messages;
  size_t after = 0;
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i].value("role", "") == "assistant") after = i + 1;
  for (size_t i = after; i < m.size(); ++i) {
    const std::string role = m[i].value("role", "");
    const json& c = m[i]["content"];
    if (!c.is_string()) continue;
    TraceFeedback fb;
    if (role == "tool") {
      const json tj = json::parse(c.get<std::string>(), nullptr, false);
      if (!tj.is_object() || !tj.contains("reward") || !tj["reward"].is_number()) continue;
      fb.reward = std::clamp(tj["reward"].get<double>(), -100.0, 100.0);
      fb.source = "tool";
    } else if (role == "user" && parse_rename(c.get<std::string>())) {
      fb.correction = c.get<std::string>();
      fb.source = "rule";
    } else {
      continue;
    }
    give_feedback(last, fb, nullptr);
    std::lock_guard lock(s.mu);
    s.loops.at(a.name).last_response.clear();  // one judgement per turn
    return;
  }
}

void Server::Impl::turn_done(const AgentTurn& t, const std::string& id, const GenerateStats& st,
                             const std::string& tool_calls) {
  LearnState& s = *learn_state;
  if (!t.learn || !s.traces) return;
  Trace tr;
  tr.response_id = id;
  tr.agent = t.agent;
  tr.adapter = t.adapter;
  tr.adapter_version = t.adapter_version;
  tr.prompt.assign(t.prompt.begin(), t.prompt.end());
  tr.output.assign(st.tokens.begin(), st.tokens.end());
  tr.text = st.text;
  tr.tool_calls = tool_calls;
  tr.created_s = unix_now();
  tr.ttft_s = st.ttft_seconds;
  tr.total_s = now_seconds() - t.t0;
  s.traces->record(std::move(tr));
  std::lock_guard lock(s.mu);
  s.loops.try_emplace(t.agent, opts.learn.replay).first->second.last_response = id;
}

json Server::Impl::learning_json() const {
  const LearnState& s = *learn_state;
  TraceCounts tc;
  if (s.traces) tc = s.traces->counts();
  std::lock_guard lock(s.mu);
  int64_t steps = s.retired_steps;
  json agents = json::object();
  for (const auto& [name, loop] : s.loops) {
    json job = nullptr;
    if (loop.job) {
      const TrainJobStatus st = loop.job->status();
      steps += st.step;  // a finished round's steps move to retired_steps when it is cleared
      job = {{"state", train_job_state_name(st.state)}, {"step", st.step}, {"steps", st.steps},
             {"loss", st.step > 0 ? json(st.loss) : json(nullptr)},
             {"phase_max_s", std::max({st.phase_max_s[0], st.phase_max_s[1], st.phase_max_s[2]})},
             {"save_s", st.save_s}};
    }
    agents[name] = {{"replay", loop.replay.size()},
                    {"heldout", loop.heldout.size()},
                    {"new_samples", loop.fresh},
                    {"rounds", loop.rounds},
                    {"baseline", loop.baseline.count() ? json(loop.baseline.mean()) : json(nullptr)},
                    {"rewards", loop.baseline.count()},
                    {"round", job}};
  }
  json published = json::object();
  json names = json::array();
  for (const VersionRecord& v : s.versions)
    if (std::find(names.begin(), names.end(), v.adapter) == names.end()) names.push_back(v.adapter);
  for (const AdapterInfo& i : engine.adapters().list())
    if (i.published && std::find(names.begin(), names.end(), i.name) != names.end()) published[i.name] = i.version;
  json versions = json::array();
  for (const VersionRecord& v : s.versions) versions.push_back(version_json(v));
  json out = {{"object", "learning"},
              {"enabled", s.traces != nullptr},
              {"gate", opts.learn.gate},
              {"traces", tc.rows},
              {"traces_recorded", tc.recorded},
              {"traces_dropped", tc.dropped},
              {"traces_retired", tc.retired},
              {"trace_bytes", tc.bytes},
              {"feedback", s.feedback},
              {"feedback_unapplied", s.feedback_unapplied},
              {"samples", s.samples},
              {"train_steps", steps},
              {"committed_versions", s.committed},
              {"published_versions", s.published},
              {"rejected_versions", s.rejected},
              {"rollbacks", s.rollbacks},
              {"gates_pending", [&] {
                 int64_t n = 0;
                 for (const auto& [a, k] : s.gates_pending) n += k;
                 return n;
               }()},
              {"rounds_failed", s.rounds_failed},
              {"judge_calls", s.judge_calls},
              {"judge_failures", s.judge_failures},
              {"judge_pending", s.judge_pending},
              {"last_error", s.last_error.empty() ? json(nullptr) : json(s.last_error)},
              {"published", published},
              {"versions", versions},
              {"agents", agents},
              {"notes", s.notes}};
  learning_state_json(out);
  return out;
}

void Server::Impl::learning_metrics(std::string& out) const {
  if (!learn_state || !learn_state->traces) return;
  const json j = learning_json();
  const auto counter = [&](const char* name, const char* help, const char* key) {
    metric(out, name, "counter", help);
    sample(out, name, j[key].get<double>());
  };
  metric(out, "ebb_learning_traces", "gauge", "Traces in the trace database");
  sample(out, "ebb_learning_traces", j["traces"].get<double>());
  counter("ebb_learning_traces_dropped_total", "Traces dropped because the writer's queue was full", "traces_dropped");
  counter("ebb_learning_feedback_total", "Feedback attached to traces", "feedback");
  counter("ebb_learning_train_steps_total", "Optimizer steps of learning rounds", "train_steps");
  counter("ebb_learning_committed_versions_total", "Versions committed by learning rounds", "committed_versions");
  counter("ebb_learning_published_versions_total", "Versions the gate published", "published_versions");
  counter("ebb_learning_rejected_versions_total", "Versions the gate rejected", "rejected_versions");
  counter("ebb_learning_judge_calls_total", "Judge calls (the judge prompt run as background inference) that ended",
          "judge_calls");
  counter("ebb_learning_judge_failures_total",
          "Judge calls whose answer had no score, or that could not run (their feedback trains nothing)",
          "judge_failures");
  counter("ebb_learning_rollbacks_total", "Rollbacks (a version published again)", "rollbacks");
}

void Server::Impl::stop_learning() {
  if (!learn_state) return;
  std::vector<std::shared_ptr<TrainJob>> jobs;
  {
    std::lock_guard lock(learn_state->mu);
    if (learn_state->stop) return;
    learn_state->stop = true;
    for (auto& [n, loop] : learn_state->loops)
      if (loop.job) jobs.push_back(loop.job);
  }
  learn_state->cv.notify_all();
  if (learn_state->thread.joinable()) learn_state->thread.join();
  for (const auto& j : jobs) j->cancel();
  const double deadline = now_seconds() + 10;
  for (const auto& j : jobs) j->wait(std::max(0.0, deadline - now_seconds()));
  if (learn_state->store) {
    std::unique_lock lock(learn_state->mu);
    learner_chores(lock, true);  // what changed since the last save
  }
  if (learn_state->traces) learn_state->traces->flush();
}

}  // namespace ebb::serve
