// /v1/training/jobs: LoRA training as background jobs on the scheduler
// (train/train_job.h: one trainer phase per scheduler step, so foreground
// requests take over at phase boundaries).
//
//   POST /v1/training/jobs                 submit (body below) -> the job
//   GET  /v1/training/jobs                 {"object": "list", "data": [jobs]}
//   GET  /v1/training/jobs/{id}            the job
//   POST /v1/training/jobs/{id}/cancel     ends it at its next phase boundary
//   POST /v1/training/jobs/{id}/publish    {"version"?}: publishes the staged version
//
// The body: {"adapter": NAME, "samples": [...], "rank", "alpha", "targets"
// (string "q,k,v" or array), "learning_rate", "steps" | "epochs",
// "batch_size", "seed", "warmup_steps", "weight_decay", "grad_clip",
// "from_adapter" (continue a loaded adapter), "publish": "auto" | "manual",
// "commit_every", "phase_seconds" (phases sized from measured costs to take
// about this long; 0.15 by default, 0: a whole sample per phase),
// "phase_layers", "phase_head_rows" (fixed pieces instead: layers and head
// rows per phase)}; a sample is {"tokens", "weights"?} (per token),
// {"messages", "weight"?} (the assistant messages' tokens weigh `weight`, the
// rest 0), {"prompt", "completion", "weight"?} or {"text", "weight"?}.
// Trained adapters and their checkpoints go to --adapter-dir as NAME.gguf and
// NAME.ckpt/ when it is set.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <future>
#include <map>
#include <optional>
#include <regex>

#include "platform/error.h"
#include "platform/timer.h"
#include "serve/server_impl.h"
#include "train/train_job.h"

namespace ebb::serve {

using nlohmann::json;

namespace {

// Bounds of one submission (the body's own bound is --max-body).
constexpr size_t kMaxSamples = 4096;
constexpr int64_t kMaxTotalTokens = int64_t{1} << 20;
constexpr int64_t kMaxSteps = 1000000;
constexpr int64_t kMaxRank = 256;
constexpr int64_t kMaxBatch = 256;
constexpr size_t kMaxActiveJobs = 4;    // queued or running at once
constexpr size_t kMaxKeptJobs = 64;     // finished jobs beyond this are forgotten, oldest first

ApiException bad(const std::string& message, const std::string& param) {
  return ApiException(invalid_request(message, param));
}

bool valid_adapter_name(const std::string& s) {
  static const std::regex re("[A-Za-z0-9][A-Za-z0-9._-]{0,127}");
  return std::regex_match(s, re);
}

const json* field(const json& o, const char* name) {
  const auto it = o.find(name);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

int64_t int_field(const json& o, const char* name, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(o, name);
  if (!v) return def;
  if (!v->is_number_integer() || v->get<int64_t>() < lo || v->get<int64_t>() > hi)
    throw bad("'" + std::string(name) + "' must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
              name);
  return v->get<int64_t>();
}

double num_field(const json& o, const char* name, double def, double lo, double hi, bool lo_open) {
  const json* v = field(o, name);
  if (!v) return def;
  const double x = v->is_number() ? v->get<double>() : NAN;
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "' must be a number in %c%g, %g]", lo_open ? '(' : '[', lo, hi);
    throw bad("'" + std::string(name) + buf, name);
  }
  return x;
}

std::vector<int32_t> encode(const Tokenizer& tok, const std::string& text, bool special) {
  EncodeOptions eo;
  eo.add_bos = tok.add_bos_default();
  eo.parse_special = special;
  return tok.encode(text, eo);
}

struct SampleContext {
  const Tokenizer& tok;
  ChatFormat format;
  const RequestLimits& limits;
  int64_t max_tokens;  // per sample (the context)
};

// One sample of the body as tokens and a weight per token.
TrainSample parse_sample(const json& j, size_t i, const SampleContext& c) {
  const std::string p = "samples[" + std::to_string(i) + "]";
  if (!j.is_object()) throw bad("'" + p + "' must be an object", p);
  TrainSample s;
  const double weight = [&] {
    const json* w = field(j, "weight");
    if (!w) return 1.0;
    if (!w->is_number() || !std::isfinite(w->get<double>()))
      throw bad("'" + p + ".weight' must be a finite number", p + ".weight");
    return w->get<double>();
  }();
  const int kinds = (j.contains("tokens") ? 1 : 0) + (j.contains("messages") ? 1 : 0) + (j.contains("prompt") ? 1 : 0) +
                    (j.contains("text") ? 1 : 0);
  if (kinds != 1)
    throw bad("'" + p + "' needs exactly one of 'tokens' (with 'weights'), 'messages', 'prompt' (with 'completion') or 'text'",
              p);
  const auto str = [&](const char* key) {
    const json* v = field(j, key);
    if (!v || !v->is_string()) throw bad("'" + p + "." + key + "' must be a string", p + "." + key);
    return v->get<std::string>();
  };
  if (j.contains("tokens")) {
    const json& t = j["tokens"];
    if (!t.is_array()) throw bad("'" + p + ".tokens' must be an array of token ids", p + ".tokens");
    if (static_cast<int64_t>(t.size()) > c.max_tokens)
      throw bad("'" + p + ".tokens' has " + std::to_string(t.size()) + " tokens; the context holds " +
                    std::to_string(c.max_tokens),
                p + ".tokens");
    const json* w = field(j, "weights");
    if (w && (!w->is_array() || w->size() != t.size()))
      throw bad("'" + p + ".weights' must be an array of one number per token (" + std::to_string(t.size()) + ")",
                p + ".weights");
    for (size_t k = 0; k < t.size(); ++k) {
      if (!t[k].is_number_integer() || t[k].get<int64_t>() < 0 || t[k].get<int64_t>() >= c.limits.n_vocab)
        throw bad("'" + p + ".tokens[" + std::to_string(k) + "]' must be a token id in [0, " +
                      std::to_string(c.limits.n_vocab) + ")",
                  p + ".tokens");
      s.tokens.push_back(static_cast<int32_t>(t[k].get<int64_t>()));
      double x = 1.0;
      if (w) {
        const json& e = (*w)[k];
        x = e.is_number() ? e.get<double>() : NAN;
        if (!std::isfinite(x))
          throw bad("'" + p + ".weights[" + std::to_string(k) + "]' must be a finite number", p + ".weights");
      }
      s.weights.push_back(static_cast<float>(x * weight));
    }
  } else if (j.contains("messages")) {
    // The chat request's reader checks the messages (roles, content parts).
    CompletionRequest r;
    try {
      r = parse_completion_request(json{{"messages", j["messages"]}}, Endpoint::kChat, c.limits);
    } catch (const ApiException& e) {
      ApiError err = e.error();
      err.param = p + "." + (err.param.empty() ? "messages" : err.param);
      err.message = "'" + p + "': " + err.message;
      throw ApiException(err);
    }
    const std::vector<ChatMessage>& msgs = r.messages;
    if (std::none_of(msgs.begin(), msgs.end(), [](const ChatMessage& m) { return m.role == "assistant"; }))
      throw bad("'" + p + ".messages' has no assistant message to learn", p + ".messages");
    s.tokens = encode(c.tok, apply_chat_template(c.format, msgs, false), true);
    s.weights.assign(s.tokens.size(), 0.0f);
    // An assistant message's tokens: from the end of the prompt before it
    // (with the header that opens its turn) to the end of the message.
    for (size_t k = 0; k < msgs.size(); ++k) {
      if (msgs[k].role != "assistant") continue;
      const std::span<const ChatMessage> before(msgs.data(), k), upto(msgs.data(), k + 1);
      const size_t from = encode(c.tok, apply_chat_template(c.format, before, true), true).size();
      const size_t to = encode(c.tok, apply_chat_template(c.format, upto, false), true).size();
      for (size_t t = from; t < to && t < s.weights.size(); ++t) s.weights[t] = static_cast<float>(weight);
    }
  } else if (j.contains("prompt")) {
    const std::string prompt = str("prompt"), completion = str("completion");
    const size_t n_prompt = encode(c.tok, prompt, false).size();
    s.tokens = encode(c.tok, prompt + completion, false);
    s.weights.assign(s.tokens.size(), static_cast<float>(weight));
    for (size_t t = 0; t < n_prompt && t < s.weights.size(); ++t) s.weights[t] = 0.0f;
  } else {
    s.tokens = encode(c.tok, str("text"), false);
    s.weights.assign(s.tokens.size(), static_cast<float>(weight));
  }
  if (s.tokens.size() < 2) throw bad("'" + p + "' has " + std::to_string(s.tokens.size()) + " token(s); a sample needs at least 2", p);
  if (static_cast<int64_t>(s.tokens.size()) > c.max_tokens)
    throw bad("'" + p + "' has " + std::to_string(s.tokens.size()) + " tokens; the context holds " +
                  std::to_string(c.max_tokens),
              p);
  return s;
}

// A job as the server lists it.
struct JobEntry {
  std::string id;  // "trainjob-N"
  std::shared_ptr<TrainJob> job;
  int64_t created_at = 0;  // Unix time
  size_t samples = 0;
  bool publish_auto = true;
  std::string from_adapter;
};

}  // namespace

struct Server::Impl::TrainState {
  mutable std::mutex mu;
  std::vector<JobEntry> jobs;  // in submission order
  uint64_t next = 1;
  // Totals of jobs no longer listed, so that the counters never go down.
  TrainJobStatus retired;
  std::map<std::string, int64_t> retired_states;

  std::shared_ptr<TrainJob> find(const std::string& id, JobEntry* out = nullptr) const {
    std::lock_guard lock(mu);
    for (const JobEntry& e : jobs)
      if (e.id == id) {
        if (out) *out = e;
        return e.job;
      }
    return nullptr;
  }
};

namespace {

// The job; with `sched`, what the scheduler's admission sees of its task
// (ŷ against the background window: a job whose phases are longer than
// the window waits until they are shorter, so the job says so).
json job_json(const JobEntry& e, const Scheduler* sched = nullptr) {
  const TrainJobStatus s = e.job->status();
  const double now = now_seconds();
  const double start = s.started_s > 0 ? s.started_s : (s.finished_s > 0 ? s.finished_s : now);
  const double end = s.finished_s > 0 ? s.finished_s : now;
  json phases = json::object();
  for (const PhaseKind k : {PhaseKind::kForward, PhaseKind::kBackward, PhaseKind::kCommit}) {
    const int i = static_cast<int>(k);
    phases[phase_name(k)] = {{"total_s", s.phase_s[i]}, {"max_s", s.phase_max_s[i]}, {"estimate_s", s.phase_est_s[i]}};
  }
  json files = json::array();
  for (const std::string& f : s.files) files.push_back(f);
  json j = {{"id", e.id},
            {"object", "training.job"},
            {"adapter", s.adapter},
            {"from_adapter", e.from_adapter.empty() ? json(nullptr) : json(e.from_adapter)},
            {"publish", e.publish_auto ? "auto" : "manual"},
            {"state", train_job_state_name(s.state)},
            {"created_at", e.created_at},
            {"samples", e.samples},
            {"step", s.step},
            {"steps", s.steps},
            {"loss", s.step > 0 ? json(s.loss) : json(nullptr)},
            {"loss_ema", s.step > 0 ? json(s.loss_ema) : json(nullptr)},
            {"first_loss", s.step > 0 ? json(s.first_loss) : json(nullptr)},
            {"tokens_trained", s.tokens},
            {"phases_run", s.phases},
            {"yields", s.yields},
            {"interruptions", s.interruptions},
            {"commits", s.commits},
            {"publishes", s.publishes},
            {"version_staged", s.version_staged ? json(s.version_staged) : json(nullptr)},
            {"version_published", s.version_published ? json(s.version_published) : json(nullptr)},
            {"peak_bytes", s.peak_bytes},
            {"files", files},
            {"timings",
             {{"queued_s", start - s.created_s},
              {"wall_s", s.started_s > 0 ? end - s.started_s : 0.0},
              {"run_s", s.run_s},
              {"save_s", s.save_s},
              {"phases", phases}}},
            {"error", s.error.empty() ? json(nullptr) : json(s.error)}};
  if (sched && (s.state == TrainJobState::kQueued || s.state == TrainJobState::kRunning)) {
    if (const std::optional<TaskDescriptor> d = sched->descriptor(e.job->task_id())) {
      const SchedulerOptions& so = sched->options();
      j["scheduler"] = {{"next_yield_s", d->next_yield_s},
                        {"est_memory", d->est_memory},
                        {"background_window_s", so.background_window_s},
                        {"fits_window", d->next_yield_s + so.margin_s <= so.background_window_s}};
    }
  }
  return j;
}

}  // namespace

void Server::Impl::training_routes() {
  train_state = std::make_shared<TrainState>();

  http.Post("/v1/training/jobs", guarded([this](const httplib::Request& req, httplib::Response& res) {
              const json body = parse_body(req);
              if (!body.is_object()) throw bad("the body must be a JSON object", "");
              // The adapter and the options.
              const json* name = field(body, "adapter");
              if (!name || !name->is_string() || !valid_adapter_name(name->get<std::string>()))
                throw bad("'adapter' must be a name of 1 to 128 characters from [A-Za-z0-9._-], not starting with "
                          "'.', '_' or '-'",
                          "adapter");
              TrainJobOptions jo;
              jo.adapter = name->get<std::string>();
              std::string from;
              if (const json* f = field(body, "from_adapter")) {
                if (!f->is_string() || !has_adapter(f->get<std::string>()))
                  throw bad("'from_adapter' must name a loaded adapter (GET /v1/adapters or /v1/models lists them)",
                            "from_adapter");
                from = f->get<std::string>();
              }
              TrainerOptions to;
              to.init.rank = int_field(body, "rank", 8, 1, kMaxRank);
              to.init.alpha = static_cast<float>(num_field(body, "alpha", 16, 0, 1e6, true));
              to.init.seed = static_cast<uint64_t>(int_field(body, "seed", 1, 0, INT64_MAX));
              to.data_seed = to.init.seed;
              if (const json* t = field(body, "targets")) {
                std::string csv;
                if (t->is_string()) {
                  csv = t->get<std::string>();
                } else if (t->is_array()) {
                  for (const json& x : *t) {
                    if (!x.is_string()) throw bad("'targets' must be a string or an array of strings", "targets");
                    if (!csv.empty()) csv += ',';
                    csv += x.get<std::string>();
                  }
                } else {
                  throw bad("'targets' must be a string (\"q,k,v\") or an array of strings", "targets");
                }
                try {
                  to.init.targets = parse_lora_targets(csv);
                } catch (const Error& e) {
                  throw bad(std::string("'targets': ") + e.what(), "targets");
                }
              }
              to.adamw.lr = static_cast<float>(num_field(body, "learning_rate", 1e-4, 0, 1, true));
              to.adamw.warmup_steps = int_field(body, "warmup_steps", 0, 0, kMaxSteps);
              to.adamw.weight_decay = static_cast<float>(num_field(body, "weight_decay", 0, 0, 1, false));
              to.adamw.grad_clip = static_cast<float>(num_field(body, "grad_clip", 1, 0, 1e6, false));
              to.batch = int_field(body, "batch_size", 1, 1, kMaxBatch);
              // Phases finer than a sample (train/trainer.h): shorter waits for
              // foreground requests on larger models.
              to.phase_layers = int_field(body, "phase_layers", 0, 0, 4096);
              to.phase_head_rows = int_field(body, "phase_head_rows", 0, 0, int64_t{1} << 20);
              // By default pieces sized to about 0.15 s each (their longest, with
              // the costs' jitter, about 0.25 s), well inside the
              // scheduler's background window (--background-window, 0.5 s).
              to.phase_target_s = num_field(body, "phase_seconds", 0.15, 0, 60, false);
              jo.commit_every = int_field(body, "commit_every", 0, 0, kMaxSteps);
              if (const json* p = field(body, "publish")) {
                if (!p->is_string() || (*p != "auto" && *p != "manual"))
                  throw bad("'publish' must be \"auto\" or \"manual\"", "publish");
                jo.publish_auto = *p == "auto";
              }
              jo.out_dir = opts.adapter_dir;
              jo.on_commit = [this](const AdapterInfo& staged, uint64_t dropped) {
                adapter_staged(staged.name, staged.published ? 0 : staged.version, dropped);
                if (staged.published) adapter_published(staged.name, staged.version);  // publish "auto"
              };
              // The samples.
              const json* sj = field(body, "samples");
              if (!sj || !sj->is_array() || sj->empty())
                throw bad("'samples' must be a non-empty array", "samples");
              if (sj->size() > kMaxSamples)
                throw bad("'samples' has " + std::to_string(sj->size()) + " samples; at most " +
                              std::to_string(kMaxSamples) + " per job",
                          "samples");
              const SampleContext ctx{engine.tokenizer(), opts.chat_format, limits,
                                      limits.n_ctx > 0 ? limits.n_ctx : engine.config().n_ctx_train};
              std::vector<TrainSample> samples;
              int64_t total = 0;
              for (size_t i = 0; i < sj->size(); ++i) {
                samples.push_back(parse_sample((*sj)[i], i, ctx));
                total += static_cast<int64_t>(samples.back().tokens.size());
                if (total > kMaxTotalTokens)
                  throw bad("the samples hold more than " + std::to_string(kMaxTotalTokens) + " tokens in all",
                            "samples");
              }
              if (field(body, "steps") && field(body, "epochs"))
                throw bad("give 'steps' or 'epochs', not both", "steps");
              if (field(body, "steps")) {
                jo.steps = int_field(body, "steps", 1, 1, kMaxSteps);
              } else {
                const double epochs = num_field(body, "epochs", 1, 0, 1e4, true);
                const double steps = std::ceil(epochs * static_cast<double>(samples.size()) / static_cast<double>(to.batch));
                if (steps > static_cast<double>(kMaxSteps))
                  throw bad("'epochs' makes more than " + std::to_string(kMaxSteps) + " steps", "epochs");
                jo.steps = std::max<int64_t>(1, static_cast<int64_t>(steps));
              }
              to.adamw.total_steps = jo.steps;

              TrainState& ts = *train_state;
              {
                std::lock_guard lock(ts.mu);
                size_t active = 0;
                for (const auto& e : ts.jobs) {
                  if (e.job->finished()) continue;
                  ++active;
                  if (e.job->status().adapter == jo.adapter)
                    throw ApiException(error_of(409,
                                                "job " + e.id + " is already training adapter '" + jo.adapter +
                                                    "': cancel it or wait for it to end",
                                                "invalid_request_error", "conflict"));
                }
                if (active >= kMaxActiveJobs)
                  throw ApiException(error_of(503, std::to_string(active) + " training jobs are queued or running (at most " +
                                                       std::to_string(kMaxActiveJobs) + ")",
                                              "server_error", "server_overloaded"));
              }
              // The trainer is built on the scheduler thread (it allocates on
              // the engine's ledger and reads the adapter to continue).
              std::shared_ptr<TrainJob> job;
              try {
                job = sched
                          .call([&](Engine& e) {
                            AdapterSet start;
                            if (!from.empty()) start = e.adapters().resolve(std::vector<AdapterBinding>{{from, 1.0f, 0}});
                            return TrainJob::make(e, std::move(samples), to, jo, start.empty() ? nullptr : start[0].v->lora.get());
                          })
                          .get();
              } catch (const SchedulerBusy& e) {
                throw ApiException(error_of(503, e.what(), "server_error", "server_overloaded"));
              } catch (const std::future_error&) {
                throw ApiException(error_of(503, "the server is shutting down", "server_error", "server_shutting_down"));
              } catch (const Error& e) {
                throw bad(e.what(), "");
              }
              JobEntry entry;
              entry.job = job;
              entry.created_at = static_cast<int64_t>(std::time(nullptr));
              entry.samples = sj->size();
              entry.publish_auto = jo.publish_auto;
              entry.from_adapter = from;
              {
                std::lock_guard lock(ts.mu);
                entry.id = "trainjob-" + std::to_string(ts.next++);
                ts.jobs.push_back(entry);
                // Forget the oldest finished jobs over the bound (their totals stay in the counters).
                size_t finished = 0;
                for (const auto& e : ts.jobs) finished += e.job->finished() ? 1 : 0;
                for (auto it = ts.jobs.begin(); finished > kMaxKeptJobs && it != ts.jobs.end();) {
                  if (!it->job->finished()) {
                    ++it;
                    continue;
                  }
                  const TrainJobStatus s = it->job->status();
                  ts.retired.step += s.step;
                  ts.retired.tokens += s.tokens;
                  ts.retired.commits += s.commits;
                  ts.retired.publishes += s.publishes;
                  ts.retired.phases += s.phases;
                  ts.retired.interruptions += s.interruptions;
                  for (int k = 0; k < 3; ++k) ts.retired.phase_s[k] += s.phase_s[k];
                  ++ts.retired_states[train_job_state_name(s.state)];
                  it = ts.jobs.erase(it);
                  --finished;
                }
              }
              try {
                job->submit(sched);
              } catch (const SchedulerBusy& e) {
                throw ApiException(error_of(503, e.what(), "server_error", "server_overloaded"));
              }
              res.status = 200;
              res.set_content(dump(job_json(entry)), kJson);
            }));

  http.Get("/v1/training/jobs", guarded([this](const httplib::Request&, httplib::Response& res) {
             std::vector<JobEntry> jobs;
             {
               std::lock_guard lock(train_state->mu);
               jobs = train_state->jobs;
             }
             json data = json::array();
             for (const auto& e : jobs) data.push_back(job_json(e, &sched));
             res.set_content(dump(json{{"object", "list"}, {"data", data}}), kJson);
           }));

  const auto lookup = [this](const httplib::Request& req, JobEntry& e) {
    const std::string id = req.matches[1];
    if (!train_state->find(id, &e))
      throw ApiException(error_of(404, "no training job '" + id + "' (GET /v1/training/jobs lists them)",
                                  "invalid_request_error", "not_found"));
  };
  http.Get(R"(/v1/training/jobs/([A-Za-z0-9_-]+))",
           guarded([this, lookup](const httplib::Request& req, httplib::Response& res) {
             JobEntry e;
             lookup(req, e);
             res.set_content(dump(job_json(e, &sched)), kJson);
           }));
  http.Post(R"(/v1/training/jobs/([A-Za-z0-9_-]+)/cancel)",
            guarded([lookup](const httplib::Request& req, httplib::Response& res) {
              JobEntry e;
              lookup(req, e);
              e.job->cancel();
              res.set_content(dump(job_json(e)), kJson);
            }));
  http.Post(R"(/v1/training/jobs/([A-Za-z0-9_-]+)/publish)",
            guarded([this, lookup](const httplib::Request& req, httplib::Response& res) {
              JobEntry e;
              lookup(req, e);
              uint64_t version = 0;
              if (!req.body.empty()) {
                const json body = parse_body(req);
                if (!body.is_object()) throw bad("the body must be a JSON object", "");
                version = static_cast<uint64_t>(int_field(body, "version", 0, 0, INT64_MAX));
              }
              if (e.job->status().version_staged == 0)
                throw ApiException(error_of(409, "job " + e.id + " has not staged a version yet", "invalid_request_error",
                                            "not_staged"));
              try {
                const uint64_t published =
                    on_engine(sched, [job = e.job, version](Engine&) { return job->publish(version); });
                adapter_published(e.job->status().adapter, published);  // pending handoff targets re-planned
              } catch (const Error& x) {
                throw bad(x.what(), "version");
              }
              res.set_content(dump(job_json(e)), kJson);
            }));
}

void Server::Impl::training_metrics(std::string& out) const {
  if (!train_state) return;
  std::map<std::string, int64_t> states;
  TrainJobStatus sum;
  {
    std::lock_guard lock(train_state->mu);
    states = train_state->retired_states;
    sum = train_state->retired;
    for (const auto& e : train_state->jobs) {
      const TrainJobStatus s = e.job->status();
      ++states[train_job_state_name(s.state)];
      sum.step += s.step;
      sum.tokens += s.tokens;
      sum.commits += s.commits;
      sum.publishes += s.publishes;
      sum.phases += s.phases;
      sum.interruptions += s.interruptions;
      for (int k = 0; k < 3; ++k) sum.phase_s[k] += s.phase_s[k];
    }
  }
  metric(out, "ebb_training_jobs", "gauge", "Training jobs by state");
  for (const TrainJobState s : {TrainJobState::kQueued, TrainJobState::kRunning, TrainJobState::kCommitted,
                                TrainJobState::kDone, TrainJobState::kFailed, TrainJobState::kCancelled}) {
    const auto it = states.find(train_job_state_name(s));
    sample(out, "ebb_training_jobs" + label("state", train_job_state_name(s)),
           static_cast<double>(it == states.end() ? 0 : it->second));
  }
  metric(out, "ebb_training_steps_total", "counter", "Optimizer steps of training jobs");
  sample(out, "ebb_training_steps_total", static_cast<double>(sum.step));
  metric(out, "ebb_training_tokens_total", "counter", "Tokens trained (forward phases)");
  sample(out, "ebb_training_tokens_total", static_cast<double>(sum.tokens));
  metric(out, "ebb_training_phases_total", "counter", "Trainer phases run");
  sample(out, "ebb_training_phases_total", static_cast<double>(sum.phases));
  metric(out, "ebb_training_interruptions_total", "counter", "Times other work ran inside a training step");
  sample(out, "ebb_training_interruptions_total", static_cast<double>(sum.interruptions));
  metric(out, "ebb_training_commits_total", "counter", "Adapter versions staged by training jobs");
  sample(out, "ebb_training_commits_total", static_cast<double>(sum.commits));
  metric(out, "ebb_training_publishes_total", "counter", "Adapter versions of training jobs published");
  sample(out, "ebb_training_publishes_total", static_cast<double>(sum.publishes));
  metric(out, "ebb_training_phase_seconds_total", "counter", "Time in trainer phases, by phase");
  for (const PhaseKind k : {PhaseKind::kForward, PhaseKind::kBackward, PhaseKind::kCommit})
    sample(out, "ebb_training_phase_seconds_total" + label("phase", phase_name(k)), sum.phase_s[static_cast<int>(k)]);
}

void Server::Impl::stop_training() {
  if (!train_state) return;
  std::vector<std::shared_ptr<TrainJob>> jobs;
  {
    std::lock_guard lock(train_state->mu);
    for (const auto& e : train_state->jobs) jobs.push_back(e.job);
  }
  // Each ends at its next phase boundary; a scheduler that has already shut
  // down has ended them all.
  for (const auto& j : jobs) j->cancel();
  const double deadline = now_seconds() + 10;
  for (const auto& j : jobs) j->wait(std::max(0.0, deadline - now_seconds()));
}

}  // namespace ebb::serve
