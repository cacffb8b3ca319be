// ebb serve's server internals, shared by its route files (server.cpp:
// completions, tokenize, models; server_metrics.cpp; and one file per
// group of routes). Not a public header.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/grammar/constraint.h"
#include "runtime/grammar/token_trie.h"
#include "serve/http_server.h"
#include "serve/openai.h"
#include "serve/server.h"

namespace ebb {
struct AgentSpec;
struct HandoffTarget;
struct TraceFeedback;
struct TrainSample;
class TrainJob;
}

namespace ebb::serve {

struct VersionRecord;  // server_learning.h

inline constexpr const char* kJson = "application/json";
// How long a streaming response waits for the next event before it checks
// that its client is still there.
inline constexpr double kPollSeconds = 0.25;

std::string dump(const nlohmann::json& j);
void send_error(httplib::Response& res, const ApiError& e);
ApiError error_of(int status, std::string message, std::string type, std::string code);
// Compares without an early exit, so the time taken says nothing of where a
// wrong key differs.
bool same_secret(const std::string& a, const std::string& b);
// The body as JSON, or a 400 naming the parse error.
nlohmann::json parse_body(const httplib::Request& req);

// Runs fn on the scheduler thread (Scheduler::call) and waits for its result
// or exception; a scheduler that is stopping is a 503 server_shutting_down.
template <class F>
auto on_engine(Scheduler& sched, F fn) {
  try {
    return sched.call(std::move(fn)).get();
  } catch (const SchedulerBusy& e) {
    throw ApiException(error_of(503, std::string("the server is shutting down: ") + e.what(), "server_error",
                                "server_shutting_down"));
  } catch (const std::future_error&) {
    throw ApiException(error_of(503, "the server is shutting down: the scheduler has ended", "server_error",
                                "server_shutting_down"));
  }
}

// Prometheus text (server_metrics.cpp): "# HELP/# TYPE" lines, a sample
// line, and a {key="value"} label with the value escaped.
void metric(std::string& out, const char* name, const char* type, const char* help);
void sample(std::string& out, const std::string& name, double v);
std::string label(const char* key, const std::string& value);

// server.cpp: fresh call ids for one response (make_call_id).
CallIdFn call_ids();

// server_chat.cpp: r.tools_json and r.response_format.schema with their
// objects' keys in the order the client sent them (CompletionRequest's
// nlohmann::json sorts keys), for the template's tojson and the grammars'
// key order. Where the request's normalised value differs from the body's
// (a legacy `functions` entry, a default), the sorted value is kept.
struct ClientOrder {
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  nlohmann::ordered_json schema;  // null: none
};
ClientOrder client_order(const CompletionRequest& r, const std::string& body);

struct Server::Impl {
  Engine& engine;
  Scheduler& sched;
  ServerOptions opts;
  HttpServer http;
  RequestLimits limits;
  int64_t started = static_cast<int64_t>(std::time(nullptr));
  // Response ids: a random prefix drawn at start-up and a counter, so ids
  // stay unique across restarts (feedback names a response by its id).
  std::string id_prefix;
  std::atomic<uint64_t> next_id{1};
  std::string new_id(const char* kind) { return kind + id_prefix + std::to_string(next_id++); }
  mutable std::mutex stats_mu;
  std::map<int, int64_t> responses;  // by HTTP status
  int64_t streams_cancelled = 0;     // streaming clients that went away
  int64_t bound_port = -1;
  // Completions in flight (their responses not yet fully written): stop()
  // lets them finish writing before it closes the server.
  std::mutex inflight_mu;
  std::condition_variable inflight_cv;
  int64_t inflight = 0;
  struct Ticket {
    Impl* impl;
    explicit Ticket(Impl* i) : impl(i) {
      std::lock_guard lock(impl->inflight_mu);
      ++impl->inflight;
    }
    ~Ticket() {
      {
        std::lock_guard lock(impl->inflight_mu);
        --impl->inflight;
      }
      impl->inflight_cv.notify_all();
    }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
  };
  bool drain(double timeout_s) {
    std::unique_lock lock(inflight_mu);
    return inflight_cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return inflight == 0; });
  }

  Impl(Engine& e, Scheduler& s, ServerOptions o) : engine(e), sched(s), opts(std::move(o)) {
    limits.model_id = opts.model_id;
    limits.n_vocab = engine.config().n_vocab;
    limits.n_ctx = opts.n_ctx;
    limits.served.constraints = true;
    limits.served.logprobs = true;
    limits.served.n_choices = true;  // several choices share the prompt's KV (on a device: copied there)
    limits.served.token_ids = true;
    limits.served.stop_token_ids = true;
    limits.served.logit_bias = true;
    limits.served.tools = opts.chat_template != nullptr;  // calls are rendered by the template
    if (!limits.served.tools)
      limits.served.tools_why_not =
          "the model has no usable Jinja chat template (ebb serve --chat-template FILE gives one)";
    routes();
  }
  ~Impl();

  // The routes open without a key: the health check and the page at /
  // (static; its script sends the key to the data routes).
  static bool open_route(const std::string& path) { return path == "/health" || path == "/"; }
  bool key_ok(const std::string& authorization) const {
    if (opts.api_key.empty()) return true;
    const std::string prefix = "Bearer ";
    return authorization.size() > prefix.size() && authorization.compare(0, prefix.size(), prefix) == 0 &&
           same_secret(authorization.substr(prefix.size()), opts.api_key);
  }
  static ApiError unauthorized(const std::string& authorization) {
    return error_of(401,
                    authorization.empty() ? "No API key given: send the header 'Authorization: Bearer KEY'"
                                          : "Incorrect API key given",
                    "invalid_request_error", "invalid_api_key");
  }
  bool authorized(const httplib::Request& req, httplib::Response& res) const {
    const std::string h = req.get_header_value("Authorization");
    if (key_ok(h)) return true;
    send_error(res, unauthorized(h));
    res.set_header("WWW-Authenticate", "Bearer");
    return false;
  }

  // Every route but /health: the key is checked, ApiException becomes its
  // answer, anything else a 500 with its message.
  httplib::Server::Handler guarded(std::function<void(const httplib::Request&, httplib::Response&)> fn,
                                   bool open = false) {
    return [this, fn = std::move(fn), open](const httplib::Request& req, httplib::Response& res) {
      if (!open && !authorized(req, res)) return;
      try {
        fn(req, res);
      } catch (const ApiException& e) {
        send_error(res, e.error());
      } catch (const std::exception& e) {
        send_error(res, error_of(500, e.what(), "server_error", "internal_error"));
      }
    };
  }

  // Route groups, each in its own file with its own state (a shared_ptr, so
  // that the type is complete only there).
  void routes();  // server.cpp: all of them, the completions and the rest here
  // server_memory.cpp: GET /v1/memory, POST /v1/memory/{evict,restore,limit,trim}
  struct MemoryState;
  std::shared_ptr<MemoryState> memory_state;
  void memory_routes();
  void memory_metrics(std::string& out) const;
  // server_adapters.cpp: /v1/adapters (list, load from --adapter-dir, unload, stage, publish)
  struct AdapterState;
  std::shared_ptr<AdapterState> adapter_state;
  void adapter_routes();
  void adapter_metrics(std::string& out) const;
  // On the scheduler thread, after a version of `name` was staged (not
  // published) elsewhere (training): stale-coverage prefill of its hot
  // prefixes; `dropped`, when not 0, an earlier version that is gone.
  void adapter_staged(const std::string& name, uint64_t version, uint64_t dropped);
  // server_train.cpp: /v1/training/jobs (submit samples, status, commit, cancel)
  struct TrainState;
  std::shared_ptr<TrainState> train_state;
  void training_routes();
  void training_metrics(std::string& out) const;
  void stop_training();  // stop(): running jobs end at their next phase boundary
  // server_agents.cpp: /v1/agents; server_learning.cpp: traces, /v1/feedback,
  // the learner, /v1/learning (their state in server_learning.h).
  struct LearnState;
  std::shared_ptr<LearnState> learn_state;
  void agent_routes();
  void learning_routes();
  void learning_metrics(std::string& out) const;
  void stop_learning();  // stop(): the learner thread ends, the trace store flushes
  // A turn of an agent, carried to its end for its trace.
  struct AgentTurn {
    std::string agent, adapter;
    uint64_t adapter_version = 0;
    bool learn = false;  // its trace is recorded
    std::vector<TokenId> prompt;
    double t0 = 0;
  };
  // Applies r.agent to r (system prompt, namespace, adapter version pinned
  // now); null without an agent. ApiException 404 for an unknown agent.
  std::shared_ptr<AgentTurn> apply_agent(CompletionRequest& r);
  // The rule judge on a learning agent's next user message (server_learning.cpp).
  void next_state_feedback(const AgentSpec& a, const CompletionRequest& r);
  // Attaches feedback to the trace `id` and judges it; false: no such trace.
  bool give_feedback(const std::string& id, const TraceFeedback& fb, nlohmann::json* out);
  // A learning round for agent a (learner thread): a training job submitted.
  std::shared_ptr<TrainJob> start_round(const AgentSpec& a, std::vector<TrainSample> samples,
                                        std::vector<TrainSample> heldout);
  // On the scheduler thread after a round's commit: the gate, then publish or not.
  void gate(const std::string& agent, const AdapterInfo& staged, uint64_t dropped,
            const std::vector<TrainSample>& heldout, const std::shared_ptr<TrainJob>& job);
  // The judge that applies to agent a: its own, or the server's default.
  const JudgeSpec& judge_of(const AgentSpec& a) const { return a.judge.set ? a.judge : opts.learn.judge; }
  // What v is gated against, set in v.against (0: the base model); true
  // when no version of v.adapter has passed a gate yet (v is a "first").
  bool gate_baseline(VersionRecord& v);
  // The gate's verdict: publish, or (a rejected first) unload the version,
  // keeping a later staged version of the round; record it.
  void finish_gate(VersionRecord v, bool first, uint64_t dropped);
  nlohmann::json learning_json() const;  // GET /v1/learning
  // server_learn_state.cpp: judge calls (runtime/judge.h) and the learning
  // state's persistence (runtime/learn_store.h).
  // Submits the agent's judge prompt over trace t's feedback as a background
  // task; false (why_not says why, counted as a judge failure) when it cannot.
  bool submit_judge(const AgentSpec& a, const std::string& response_id, const std::string& prompt_text,
                    const std::string& response_text, const std::string& feedback, std::string* why_not);
  // Learner thread, LearnState::mu held (released while it writes): judged
  // feedback becomes samples; the state is saved when it changed.
  void learner_chores(std::unique_lock<std::mutex>& lock, bool force_save);
  // Start-up (learning_routes): the saved state back, versions reloaded.
  void restore_learning();
  void learning_state_json(nlohmann::json& out) const;  // LearnState::mu held
  // After an agent's turn (choice 0): its trace (learning agents, with --learn).
  void turn_done(const AgentTurn& t, const std::string& id, const GenerateStats& st, const std::string& tool_calls);
  // server_handoffs.cpp: POST/GET /v1/handoffs, cross-agent pre-prefill
  // (runtime/handoff.h) through the scheduler.
  struct HandoffState;
  std::shared_ptr<HandoffState> handoff_state;
  void handoff_routes();
  void handoff_metrics(std::string& out) const;
  HandoffTarget handoff_target(const AgentSpec& a, const CompletionRequest& base, const ClientOrder& order,
                               int64_t* n_tokens) const;
  // A request of `agent` came: its pending handoffs are consumed.
  void consume_handoffs(const std::string& agent);
  // Version `version` of adapter `name` was published (any thread): pending
  // handoff targets that follow it are re-planned under it.
  void adapter_published(const std::string& name, uint64_t version);
  // On the scheduler thread: version `version` of adapter `name` was staged
  // and waits for its publish (a gate, a manual publish): the pending
  // handoff targets that follow it are pre-prefilled under it too.
  void handoffs_staged(const std::string& name, uint64_t version);
  // server_web.cpp: the page at /
  void web_routes();
  // server_pressure.cpp: memory pressure watching (--pressure)
  struct PressureState;
  std::shared_ptr<PressureState> pressure_state;
  void start_pressure();  // listen(): starts the watcher thread
  void stop_pressure();   // stop()
  void pressure_metrics(std::string& out) const;

  void models(httplib::Response& res) const;
  bool has_adapter(const std::string& name) const;
  // The prompt's tokens; for chat, fmt receives the output format (with
  // open_think decided by the rendered prompt). generation_prompt false: a
  // chat rendered without the assistant's opening (a handoff's prefix).
  std::vector<TokenId> prompt_tokens(const CompletionRequest& r, GenerateOptions& go, ChatOutputFormat& fmt,
                                     const ClientOrder& order, bool generation_prompt = true) const;
  // server_chat.cpp: the request's grammar (response_format, grammar,
  // json_schema, tools), or null. ApiException (400) naming the field when
  // it does not compile.
  std::shared_ptr<grammar::GrammarConstraint> constraint_for(const CompletionRequest& r, const ChatOutputFormat& fmt,
                                                             const ClientOrder& order) const;
  // The vocabulary as a byte trie, built on first use and shared.
  std::shared_ptr<const grammar::TokenTrie> token_trie() const;
  mutable std::mutex trie_mu;
  mutable std::shared_ptr<const grammar::TokenTrie> trie;
  // Whether the output is read for calls: tools given and not tool_choice none.
  static bool calls_on(const CompletionRequest& r) { return !r.tools.empty() && r.tool_choice != ToolChoice::kNone; }
  // Chat responses are parsed (reasoning, calls) when a template rendered them.
  bool parse_chat(const CompletionRequest& r) const {
    return r.endpoint == Endpoint::kChat && opts.chat_template != nullptr;
  }
  void completion(const httplib::Request& req, httplib::Response& res, Endpoint ep);
  static Usage usage_of(int64_t n_prompt, const GenerateStats& st);
  void log(const httplib::Request& req, int status, const std::string& id, const Usage& u, StopReason stop,
           double seconds) const;
  void stream_response(const httplib::Request& req, httplib::Response& res, CompletionRequest r,
                       std::shared_ptr<GenerationStream> stream, GenerationEvent first, const std::string& id,
                       int64_t created, int64_t n_prompt, std::vector<TokenId> prompt_ids, double t0,
                       std::shared_ptr<Ticket> ticket, const ChatOutputFormat& fmt,
                       std::shared_ptr<AgentTurn> turn = nullptr);
  // The sampled tokens as the response carries them: log-probabilities
  // (with each token's text) when r.logprobs, ids when r.return_token_ids.
  void add_tokens(const CompletionRequest& r, std::span<const StepLogprobs> tokens,
                  std::vector<TokenLogprob>& logprobs, std::vector<TokenId>& ids) const;
  void tokenize(const httplib::Request& req, httplib::Response& res) const;
  void detokenize(const httplib::Request& req, httplib::Response& res) const;
  std::string metrics() const;  // server_metrics.cpp

  bool gone(const auto& st) {
    st.stream->cancel();
    if (opts.log_requests) {  // on stdout with the other request lines
      std::fprintf(stdout, "%s %s %s | cancelled: the client went away mid-stream\n", st.method.c_str(),
                   st.path.c_str(), st.id.c_str());
      std::fflush(stdout);
    }
    std::lock_guard lock(stats_mu);
    ++streams_cancelled;
    return false;
  }
};

}  // namespace ebb::serve
