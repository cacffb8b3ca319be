// /v1/agents: create, list, get, update, delete (runtime/agents.h), and how
// a request that names an agent takes its system prompt, namespace and
// adapter binding.
//
//   POST   /v1/agents              {"name", "role"?, "system_prompt"?, "namespace"?, "adapter"?,
//                                   "adapter_version"? (pinned; absent: follow published),
//                                   "tools"?, "feedback"? ("rule" | "explicit" | "off"), "learn"?}
//   GET    /v1/agents              {"object": "list", "data": [agents]}
//   GET    /v1/agents/{name}       the agent
//   PATCH  /v1/agents/{name}       the fields given replace the agent's (POST too)
//   DELETE /v1/agents/{name}       {"object": "agent.deleted", "name", "deleted": true}
//
// 400 a bad field (named in "param"), 404 an unknown agent, 409 a name that
// is taken. With --state-dir the agents persist in DIR/agents.json.
#include <ctime>
#include <filesystem>

#include "platform/error.h"
#include "serve/server_learning.h"

namespace ebb::serve {

using nlohmann::json;

namespace {

ApiException agent_error(const AgentError& e) { return ApiException(invalid_request(e.what(), e.field())); }

ApiException no_agent(const std::string& name, const std::string& param) {
  ApiError e = error_of(404, "no agent '" + name + "' (GET /v1/agents lists them)", "invalid_request_error",
                        "agent_not_found");
  e.param = param;
  return ApiException(e);
}

}  // namespace

void Server::Impl::agent_routes() {
  learn_state = std::make_shared<LearnState>();
  LearnState& ls = *learn_state;
  const std::string& dir = opts.learn.state_dir;
  std::string note;
  ls.agents = std::make_unique<AgentRegistry>(dir.empty() ? "" : (std::filesystem::path(dir) / "agents.json").string(),
                                              AgentLimits{}, &note);
  if (!note.empty()) {
    std::fprintf(stderr, "ebb serve: %s\n", note.c_str());
    ls.notes.push_back(note);
  }

  http.Post("/v1/agents", guarded([this](const httplib::Request& req, httplib::Response& res) {
              const json body = parse_body(req);
              AgentSpec a;
              try {
                a = agent_from_json(body, AgentSpec{}, true, learn_state->agents->limits());
              } catch (const AgentError& e) {
                throw agent_error(e);
              }
              a.created_at = a.updated_at = static_cast<int64_t>(std::time(nullptr));
              AgentRegistry::Status st;
              try {
                st = learn_state->agents->create(a);
              } catch (const Error& e) {
                throw ApiException(error_of(500, e.what(), "server_error", "state_write_failed"));
              }
              if (st == AgentRegistry::Status::kExists)
                throw ApiException(error_of(409, "an agent named '" + a.name + "' exists (PATCH /v1/agents/" + a.name +
                                                     " changes it)",
                                            "invalid_request_error", "agent_exists"));
              if (st == AgentRegistry::Status::kFull)
                throw ApiException(invalid_request("the server holds " +
                                                       std::to_string(learn_state->agents->limits().max_agents) +
                                                       " agents, its limit: delete one first",
                                                   "name", "too_many_agents"));
              res.set_content(dump(agent_to_json(a)), kJson);
            }));
  http.Get("/v1/agents", guarded([this](const httplib::Request&, httplib::Response& res) {
             json data = json::array();
             for (const AgentSpec& a : learn_state->agents->list()) data.push_back(agent_to_json(a));
             res.set_content(dump(json{{"object", "list"}, {"data", data}}), kJson);
           }));
  const char* one = R"(/v1/agents/([A-Za-z0-9._-]+))";
  http.Get(one, guarded([this](const httplib::Request& req, httplib::Response& res) {
             const std::string name = req.matches[1];
             const std::optional<AgentSpec> a = learn_state->agents->get(name);
             if (!a) throw no_agent(name, "");
             res.set_content(dump(agent_to_json(*a)), kJson);
           }));
  const auto update = guarded([this](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    const std::optional<AgentSpec> old = learn_state->agents->get(name);
    if (!old) throw no_agent(name, "");
    AgentSpec a;
    try {
      a = agent_from_json(parse_body(req), *old, false, learn_state->agents->limits());
    } catch (const AgentError& e) {
      throw agent_error(e);
    }
    a.updated_at = static_cast<int64_t>(std::time(nullptr));
    AgentRegistry::Status st;
    try {
      st = learn_state->agents->update(a);
    } catch (const Error& e) {
      throw ApiException(error_of(500, e.what(), "server_error", "state_write_failed"));
    }
    if (st == AgentRegistry::Status::kNotFound) throw no_agent(name, "");
    res.set_content(dump(agent_to_json(a)), kJson);
  });
  http.Patch(one, update);
  http.Post(one, update);
  http.Delete(one, guarded([this](const httplib::Request& req, httplib::Response& res) {
                const std::string name = req.matches[1];
                AgentRegistry::Status st;
                try {
                  st = learn_state->agents->remove(name);
                } catch (const Error& e) {
                  throw ApiException(error_of(500, e.what(), "server_error", "state_write_failed"));
                }
                if (st == AgentRegistry::Status::kNotFound) throw no_agent(name, "");
                res.set_content(dump(json{{"object", "agent.deleted"}, {"name", name}, {"deleted", true}}), kJson);
              }));
}

std::shared_ptr<Server::Impl::AgentTurn> Server::Impl::apply_agent(CompletionRequest& r) {
  if (r.agent.empty()) return nullptr;
  const std::optional<AgentSpec> a = learn_state->agents->get(r.agent);
  if (!a) throw no_agent(r.agent, r.model.find(":agent/") != std::string::npos ? "model" : "agent");
  if (r.cache_namespace_given)
    throw ApiException(invalid_request("'cache_namespace' cannot be given with an agent: its namespace is the agent's "
                                       "('" + a->cache_namespace() + "')",
                                       "cache_namespace"));
  auto turn = std::make_shared<AgentTurn>();
  turn->agent = a->name;
  turn->learn = a->learn && learn_state->traces != nullptr;
  // The system prompt, when the conversation has none.
  if (r.endpoint == Endpoint::kChat && !a->system_prompt.empty()) {
    bool has_system = false;
    for (const ChatMessage& m : r.messages) has_system = has_system || m.role == "system";
    if (!has_system) {
      r.messages.insert(r.messages.begin(), ChatMessage{"system", a->system_prompt});
      r.chat_messages.insert(r.chat_messages.begin(), json{{"role", "system"}, {"content", a->system_prompt}});
    }
  }
  r.cache_namespace = a->cache_namespace();
  r.cache_namespace_given = true;
  // The adapter version, pinned now: what the turn runs is what its trace says.
  bool ungated = false;
  {
    std::lock_guard lock(learn_state->mu);
    ungated = learn_state->ungated_first.count(a->adapter) > 0;
  }
  if (!a->adapter.empty()) {
    uint64_t published = 0;
    bool pinned_found = false;
    for (const AdapterInfo& i : engine.adapters().list()) {
      if (i.name != a->adapter) continue;
      if (i.published && !ungated) published = i.version;
      if (a->adapter_version && i.version == a->adapter_version) pinned_found = true;
    }
    const uint64_t v = a->adapter_version ? (pinned_found ? a->adapter_version : 0) : published;
    if (v != 0) {
      r.adapter = a->adapter;
      r.adapter_version = v;
    } else if (!a->learn || a->adapter_version) {
      // A learning agent runs on the base model until its first version is published.
      ApiError e = error_of(404,
                            "agent '" + a->name + "' binds adapter '" + a->adapter + "'" +
                                (a->adapter_version ? " version " + std::to_string(a->adapter_version) : "") +
                                ", which is not loaded (GET /v1/adapters lists them)",
                            "invalid_request_error", "adapter_not_found");
      e.param = "agent";
      throw ApiException(e);
    }
    turn->adapter = a->adapter;
    turn->adapter_version = v;
  }
  // Next-state feedback: the user's next message judged by the rule.
  if (a->feedback == "rule" && turn->learn && r.endpoint == Endpoint::kChat) next_state_feedback(*a, r);
  return turn;
}

}  // namespace ebb::serve
