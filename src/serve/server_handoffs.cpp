// /v1/handoffs: cross-agent pre-prefill in ebb serve (LOCAL §6.1;
// runtime/handoff.h). A handoff names a source agent, its target agents and
// the shared context their next requests will carry; the server prefills
// each target's prompt prefix ahead, under the target's KV identity, as
// bounded background tasks on the scheduler requests use, and publishes
// the KV in the prefix cache, where the target's request finds it.
//
//   POST /v1/handoffs   {"source", "targets": [agent, ...],
//                        "messages": [chat messages], "tools"?: [...] | "prompt": "text",
//                        "priority"?: ρ_c > 0 (2.0)}
//        → {"object": "handoff", "id": "handoff-N", "source",
//           "targets": [{"agent", "tokens", "prefill_tokens", "planned", "priority"}]}
//   GET  /v1/handoffs   {"object": "handoffs", "pending": {"handoffs", "targets"}, "stats": {PrePrefillStats}}
//
// A target's prefix is what its request under the agent would render:
//   messages  the agent's system prompt (when the messages have none), then
//             the messages (and the tools, as the request will send them),
//             through the server's chat template with no generation prompt; a template whose rendering of more
//             messages is not an exact extension loses only the tail
//   prompt    the text tokenized as /v1/completions tokenizes it
// Only whole KV chunks of it are prefilled ("prefill_tokens"). "planned" is
// true when a task was submitted (something was missing under the target's
// key); "priority" is its D_ma. The target's binding is resolved when the
// task is planned: a follow-published agent runs under the published
// version, and a publish of its adapter before its request re-plans it
// (adapter_published). A target's next chat or completions request
// consumes its pending handoffs: an unfinished task is cancelled there and
// the request prefills what is still missing itself.
//
// 400 a malformed body (the field named), 404 a target that is no agent,
// 409 when the engine has no prefix cache (nothing could be reused; ebb
// serve always has one).
#include <algorithm>
#include <cmath>
#include <set>

#include "platform/error.h"
#include "runtime/handoff.h"
#include "serve/server_learning.h"

namespace ebb::serve {

using nlohmann::json;

namespace {

// Targets of one handoff at most: with PrePrefill's 256 pending handoffs and
// each target's prefix kept up to max_prefix_tokens (8192), what pending
// handoffs hold is bounded (256 · 16 · 8192 token ids: 128 MiB at worst).
constexpr size_t kMaxTargets = 16;

ApiException bad(const std::string& message, const std::string& param) {
  return ApiException(invalid_request(message, param));
}

}  // namespace

struct Server::Impl::HandoffState {
  std::unique_ptr<PrePrefill> pp;
  std::mutex mu;  // pending
  // Pending handoff ids per target agent. PrePrefill forgets the oldest
  // beyond max_pending, so ids older than the last max_pending are dropped
  // here too: bounded.
  std::map<std::string, std::vector<uint64_t>> pending;
  uint64_t last_id = 0;

  void prune_locked(size_t max_pending) {
    const uint64_t oldest = last_id > max_pending ? last_id - max_pending + 1 : 0;
    for (auto it = pending.begin(); it != pending.end();) {
      std::erase_if(it->second, [oldest](uint64_t id) { return id < oldest; });
      it = it->second.empty() ? pending.erase(it) : std::next(it);
    }
  }
};

void Server::Impl::handoff_routes() {
  handoff_state = std::make_shared<HandoffState>();
  // The tasks' keys have the geometry of the requests' sessions (the chunk
  // the context picked, the KV type), so the request looks up their chunks.
  PrePrefillOptions po;
  po.kv_chunk_size =
      opts.session.kv_chunk_size > 0 ? opts.session.kv_chunk_size : engine.session_chunk_size(opts.n_ctx);
  po.kv_type = opts.session.kv_type;
  po.f16_accumulator = opts.session.f16_attention;
  po.step_seconds = opts.background_step_s;  // what a request arriving mid-step waits, about
  handoff_state->pp = std::make_unique<PrePrefill>(engine, sched, po);

  http.Post("/v1/handoffs", guarded([this](const httplib::Request& req, httplib::Response& res) {
              const json body = parse_body(req);
              if (!body.is_object()) throw bad("the request body must be a JSON object", "");
              for (const auto& [k, v] : body.items()) {
                if (k != "source" && k != "targets" && k != "messages" && k != "tools" && k != "prompt" &&
                    k != "priority")
                  throw bad("unknown field '" + k +
                                "' (a handoff takes source, targets, messages (and tools) or prompt, priority)",
                            k);
              }
              if (!body.contains("source") || !body["source"].is_string())
                throw bad("'source' must name the agent handing off", "source");
              const std::string source = body["source"].get<std::string>();
              try {
                check_agent_name(source);
              } catch (const AgentError& e) {
                throw bad(std::string("'source': ") + e.what(), "source");
              }
              if (!body.contains("targets") || !body["targets"].is_array() || body["targets"].empty())
                throw bad("'targets' must be a non-empty array of agent names", "targets");
              if (body["targets"].size() > kMaxTargets)
                throw bad("'targets' names " + std::to_string(body["targets"].size()) + " agents; at most " +
                              std::to_string(kMaxTargets),
                          "targets");
              std::vector<AgentSpec> targets;
              std::set<std::string> seen;
              for (const json& t : body["targets"]) {
                if (!t.is_string() || t.get<std::string>().empty())
                  throw bad("'targets' must hold agent names (strings)", "targets");
                const std::string name = t.get<std::string>();
                if (!seen.insert(name).second) throw bad("'targets' names '" + name + "' twice", "targets");
                std::optional<AgentSpec> a = learn_state->agents->get(name);
                if (!a) {
                  ApiError e = error_of(404, "no agent '" + name + "' (GET /v1/agents lists them)",
                                        "invalid_request_error", "agent_not_found");
                  e.param = "targets";
                  throw ApiException(e);
                }
                targets.push_back(std::move(*a));
              }
              const bool chat = body.contains("messages");
              if (chat == body.contains("prompt"))
                throw bad("a handoff carries exactly one of 'messages' (chat) and 'prompt' (completions text)",
                          chat ? "prompt" : "messages");
              if (!chat && !body["prompt"].is_string()) throw bad("'prompt' must be a string", "prompt");
              if (!chat && body.contains("tools"))
                throw bad("'tools' goes with 'messages' (a chat prefix), not with 'prompt'", "tools");
              if (chat && (!body["messages"].is_array() || body["messages"].empty()))
                throw bad("'messages' must be a non-empty array of chat messages", "messages");
              double rho = 2.0;
              if (body.contains("priority")) {
                const json& p = body["priority"];
                if (!p.is_number() || !(p.get<double>() > 0) || !std::isfinite(p.get<double>()))
                  throw bad("'priority' must be a number > 0 (the shared context's rho; default 2.0)", "priority");
                rho = p.get<double>();
              }
              if (!engine.prefix_cache())
                throw ApiException(error_of(409,
                                            "cross-agent pre-prefill needs the prefix cache, and this server runs "
                                            "without one (its KV could not be reused): nothing was planned",
                                            "invalid_request_error", "prefix_cache_off"));

              // Each target's prefix, as its request under the agent renders it.
              Handoff h;
              h.source = source;
              h.rho = rho;
              CompletionRequest base;
              ClientOrder order;
              if (chat) {
                // As a chat request of these messages (and tools) reads them.
                json as_chat = {{"messages", body["messages"]}};
                if (body.contains("tools")) as_chat["tools"] = body["tools"];
                try {
                  base = parse_completion_request(as_chat, Endpoint::kChat, limits);
                } catch (const ApiException& e) {
                  ApiError err = e.error();
                  if (err.param.empty()) err.param = "messages";
                  throw ApiException(err);
                }
                order = client_order(base, req.body);  // the tools' keys in the client's order, as the request's
              } else {
                base.endpoint = Endpoint::kCompletions;
                base.prompt = body["prompt"].get<std::string>();
                if (base.prompt.empty()) throw bad("'prompt' is empty", "prompt");
              }
              std::vector<int64_t> n_tokens;
              for (const AgentSpec& a : targets) {
                n_tokens.push_back(0);
                h.targets.push_back(handoff_target(a, base, order, &n_tokens.back()));
              }

              HandoffState& hs = *handoff_state;
              std::future<size_t> planned;
              uint64_t id = 0;
              try {
                id = hs.pp->post(h, &planned);
                planned.get();
              } catch (const SchedulerBusy& e) {
                throw ApiException(error_of(503, std::string("the server is shutting down: ") + e.what(),
                                            "server_error", "server_shutting_down"));
              } catch (const std::future_error&) {
                throw ApiException(error_of(503, "the server is shutting down: the scheduler has ended",
                                            "server_error", "server_shutting_down"));
              }
              {
                std::lock_guard lock(hs.mu);
                hs.last_id = std::max(hs.last_id, id);
                for (const HandoffTarget& t : h.targets) hs.pending[t.agent].push_back(id);
                hs.prune_locked(hs.pp->options().max_pending);
              }
              const int64_t chunk = hs.pp->options().kv_chunk_size;
              const int64_t cap = hs.pp->options().max_prefix_tokens;
              json out = json::array();
              for (size_t i = 0; i < h.targets.size(); ++i) {
                const double d = hs.pp->planned_priority(id, h.targets[i].agent);
                out.push_back({{"agent", h.targets[i].agent},
                               {"tokens", n_tokens[i]},
                               {"prefill_tokens", std::min(n_tokens[i], cap) / chunk * chunk},
                               {"planned", d > 0},
                               {"priority", d}});
              }
              res.set_content(dump(json{{"object", "handoff"},
                                        {"id", "handoff-" + std::to_string(id)},
                                        {"source", source},
                                        {"targets", out}}),
                              kJson);
            }));

  http.Get("/v1/handoffs", guarded([this](const httplib::Request&, httplib::Response& res) {
             HandoffState& hs = *handoff_state;
             int64_t targets = 0;
             std::set<uint64_t> ids;
             {
               std::lock_guard lock(hs.mu);
               for (const auto& [agent, v] : hs.pending) {
                 targets += static_cast<int64_t>(v.size());
                 ids.insert(v.begin(), v.end());
               }
             }
             const PrePrefillStats s = hs.pp->stats();
             const json stats = {{"handoffs", s.handoffs},
                                 {"targets_planned", s.targets_planned},
                                 {"tasks_submitted", s.tasks_submitted},
                                 {"tasks_completed", s.tasks_completed},
                                 {"tasks_cancelled", s.tasks_cancelled},
                                 {"tasks_failed", s.tasks_failed},
                                 {"tasks_running", s.tasks_running},
                                 {"nothing_missing", s.nothing_missing},
                                 {"tokens_prefilled", s.tokens_prefilled},
                                 {"chunks_inserted", s.chunks_inserted},
                                 {"steps", s.steps},
                                 {"shrunk_steps", s.shrunk_steps},
                                 {"timed_steps", s.timed_steps},
                                 {"min_chunk_tokens", s.min_chunk_tokens},
                                 {"busy_s", s.busy_s},
                                 {"consumed", s.consumed},
                                 {"stale", s.stale},
                                 {"staged_planned", s.staged_planned},
                                 {"staged_promoted", s.staged_promoted}};
             res.set_content(dump(json{{"object", "handoffs"},
                                       {"prefix_cache", engine.prefix_cache() != nullptr},
                                       {"pending", {{"handoffs", ids.size()}, {"targets", targets}}},
                                       {"stats", stats}}),
                             kJson);
           }));
}

// Target a's prefix and KV identity, as its request under the agent would
// have them; n_tokens receives the prefix's length (before it is cut to
// max_prefix_tokens).
HandoffTarget Server::Impl::handoff_target(const AgentSpec& a, const CompletionRequest& base, const ClientOrder& order,
                                           int64_t* n_tokens) const {
  const bool chat = base.endpoint == Endpoint::kChat;
  CompletionRequest r = base;
  r.agent = a.name;
  if (chat && !a.system_prompt.empty()) {  // as apply_agent: when the messages have none
    bool has_system = false;
    for (const ChatMessage& m : r.messages) has_system = has_system || m.role == "system";
    if (!has_system) {
      r.messages.insert(r.messages.begin(), ChatMessage{"system", a.system_prompt});
      r.chat_messages.insert(r.chat_messages.begin(), json{{"role", "system"}, {"content", a.system_prompt}});
    }
  }
  GenerateOptions go;
  ChatOutputFormat fmt;
  HandoffTarget t;
  t.agent = a.name;
  t.ns = a.cache_namespace();
  t.system_prompt = prompt_tokens(r, go, fmt, order, /*generation_prompt=*/false);
  if (static_cast<int64_t>(t.system_prompt.size()) >= opts.n_ctx)
    throw ApiException(invalid_request("the prefix of agent '" + a.name + "' has " +
                                           std::to_string(t.system_prompt.size()) + " tokens; the context holds " +
                                           std::to_string(opts.n_ctx),
                                       chat ? "messages" : "prompt", "context_length_exceeded"));
  // Its adapter binding, as apply_agent runs its request: pinned, following
  // the published version, or (a learning agent with no version that passed
  // a gate yet) the base model.
  if (!a.adapter.empty()) {
    bool ungated = false;
    {
      std::lock_guard lock(learn_state->mu);
      ungated = learn_state->ungated_first.count(a.adapter) > 0;
    }
    bool published = false, pinned_found = false;
    for (const AdapterInfo& i : engine.adapters().list()) {
      if (i.name != a.adapter) continue;
      published = published || (i.published && !ungated);
      pinned_found = pinned_found || (a.adapter_version && i.version == a.adapter_version);
    }
    if (a.adapter_version ? pinned_found : published) {
      t.adapters.push_back({a.adapter, 1.0f, a.adapter_version});
    } else if (a.learn && !a.adapter_version) {
      t.on_first_publish.push_back({a.adapter, 1.0f, 0});  // its gate's first pass re-plans it under the adapter
    } else {
      ApiError e = error_of(404,
                            "agent '" + a.name + "' binds adapter '" + a.adapter + "'" +
                                (a.adapter_version ? " version " + std::to_string(a.adapter_version) : "") +
                                ", which is not loaded (GET /v1/adapters lists them)",
                            "invalid_request_error", "adapter_not_found");
      e.param = "targets";
      throw ApiException(e);
    }
  }
  *n_tokens = static_cast<int64_t>(t.system_prompt.size());
  // Only whole chunks up to max_prefix_tokens are prefilled: no more is kept.
  const auto keep = static_cast<size_t>(handoff_state->pp->options().max_prefix_tokens);
  if (t.system_prompt.size() > keep) t.system_prompt.resize(keep);
  return t;
}

void Server::Impl::consume_handoffs(const std::string& agent) {
  if (!handoff_state) return;
  HandoffState& hs = *handoff_state;
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(hs.mu);
    const auto it = hs.pending.find(agent);
    if (it == hs.pending.end()) return;
    ids = std::move(it->second);
    hs.pending.erase(it);
  }
  for (uint64_t id : ids) hs.pp->consume(id, agent);
}

void Server::Impl::handoffs_staged(const std::string& name, uint64_t version) {
  if (!handoff_state || !handoff_state->pp) return;
  try {
    handoff_state->pp->on_staged_now(name, version);
  } catch (const SchedulerBusy&) {
    // The scheduler is shutting down: nothing will be published.
  }
}

void Server::Impl::adapter_published(const std::string& name, uint64_t version) {
  if (!handoff_state || !handoff_state->pp) return;
  try {
    handoff_state->pp->on_published(name, version);
  } catch (const SchedulerBusy&) {
    // The scheduler is shutting down: no request will come to use a re-plan.
  }
}

void Server::Impl::handoff_metrics(std::string& o) const {
  if (!handoff_state) return;
  const PrePrefillStats s = handoff_state->pp->stats();
  metric(o, "ebb_preprefill_handoffs_total", "counter", "Handoffs posted (POST /v1/handoffs)");
  sample(o, "ebb_preprefill_handoffs_total", static_cast<double>(s.handoffs));
  metric(o, "ebb_preprefill_tasks_total", "counter", "Cross-agent pre-prefill tasks, by outcome");
  sample(o, "ebb_preprefill_tasks_total" + label("outcome", "submitted"), static_cast<double>(s.tasks_submitted));
  sample(o, "ebb_preprefill_tasks_total" + label("outcome", "completed"), static_cast<double>(s.tasks_completed));
  sample(o, "ebb_preprefill_tasks_total" + label("outcome", "cancelled"), static_cast<double>(s.tasks_cancelled));
  sample(o, "ebb_preprefill_tasks_total" + label("outcome", "failed"), static_cast<double>(s.tasks_failed));
  metric(o, "ebb_preprefill_tasks_running", "gauge", "Cross-agent pre-prefill tasks submitted and not ended");
  sample(o, "ebb_preprefill_tasks_running", static_cast<double>(s.tasks_running));
  metric(o, "ebb_preprefill_tokens_total", "counter", "Tokens prefilled ahead for handoff targets");
  sample(o, "ebb_preprefill_tokens_total", static_cast<double>(s.tokens_prefilled));
  metric(o, "ebb_preprefill_chunks_total", "counter", "KV chunks pre-prefill added to the prefix cache");
  sample(o, "ebb_preprefill_chunks_total", static_cast<double>(s.chunks_inserted));
  metric(o, "ebb_preprefill_consumed_total", "counter", "Handoff targets whose request came");
  sample(o, "ebb_preprefill_consumed_total", static_cast<double>(s.consumed));
  int64_t pending = 0;
  {
    std::lock_guard lock(handoff_state->mu);
    for (const auto& [agent, ids] : handoff_state->pending) pending += static_cast<int64_t>(ids.size());
  }
  metric(o, "ebb_preprefill_pending_targets", "gauge", "Handoff targets whose request has not come yet");
  sample(o, "ebb_preprefill_pending_targets", static_cast<double>(pending));
  metric(o, "ebb_preprefill_stale_total", "counter",
         "Handoff targets re-planned because their adapter was published at another version before their request");
  sample(o, "ebb_preprefill_stale_total", static_cast<double>(s.stale));
  metric(o, "ebb_preprefill_staged_total", "counter",
         "Handoff targets pre-prefilled under a staged version ahead of its publish, by outcome so far");
  sample(o, "ebb_preprefill_staged_total" + label("outcome", "planned"), static_cast<double>(s.staged_planned));
  sample(o, "ebb_preprefill_staged_total" + label("outcome", "kept_at_publish"), static_cast<double>(s.staged_promoted));
}

}  // namespace ebb::serve
