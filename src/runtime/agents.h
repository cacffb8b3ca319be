// Agents (LOCAL §6; issue 38 part 1): an agent is a name with a role, a
// system prompt, a context namespace, an adapter binding, its tools, a
// feedback policy and whether it learns. Requests that name an agent take
// its system prompt, its namespace (the prefix cache's CacheKey.ns) and its
// adapter binding, so an agent's KV identity is (tokens, namespace, adapter,
// adapter version): a publish of its adapter makes only its own coverage
// stale.
//
//   adapter binding   a registry name and a policy: follow the published
//                     version (adapter_version 0), or pinned to a version
//   feedback policy   "rule": explicit feedback and the rule judge on the
//                     agent's next user message (learner.h); "explicit":
//                     POST /v1/feedback only; "off": none recorded
//
// AgentRegistry holds them by name, checks every field (AgentError names the
// field) and persists them as one JSON file (written to a temporary file and
// renamed, so a reader or a crash never sees half of it). A file that cannot
// be read as agents is renamed aside and the registry starts empty, saying so.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "platform/error.h"

namespace ebb {

// How an agent's feedback becomes a reward (judge.h):
//   "rule"    (default) a correction by the rule judge (learner.h), a reward
//             or rating as given
//   "client"  rewards and ratings only; a correction trains nothing
//   "prompt"  a reward or rating as given; feedback without one (a
//             correction) is scored by running `prompt` as a background
//             judge call on the scheduler, under `adapter` when named,
//             greedy, at most max_tokens tokens, its answer constrained by
//             `grammar` (GBNF; "" : free); the score is the reward
struct JudgeSpec {
  // Whether the agent named its judge; if not, the server's default judge
  // (ebb serve --judge; rule unless set) is the one that applies.
  bool set = false;
  std::string kind = "rule";
  std::string prompt;            // "prompt": the template ({prompt} {response} {feedback})
  std::string adapter;           // "" : the base model
  std::string grammar = kDefaultGrammar;
  int64_t max_tokens = 4;        // 1..64
  static constexpr const char* kDefaultGrammar = "root ::= [0-9] | \"10\" | \"yes\" | \"no\"";
};

struct AgentSpec {
  std::string name;            // [A-Za-z0-9][A-Za-z0-9._-]{0,63}
  std::string role;            // free text ("planner", "storyteller"); "" allowed
  std::string system_prompt;   // prepended to chat requests that have no system message
  std::string ns;              // the context namespace; "" : "agent/NAME"
  std::string adapter;         // "" : the base model
  uint64_t adapter_version = 0;  // 0: follow the published version; else pinned
  std::vector<std::string> tools;  // names of the tools it may call (informational)
  std::string feedback = "rule";   // "rule", "explicit" or "off"
  bool learn = false;              // its turns are traces and its feedback trains its adapter
  JudgeSpec judge;                 // how its feedback becomes a reward
  int64_t created_at = 0, updated_at = 0;  // Unix time

  // The namespace its requests use.
  std::string cache_namespace() const { return ns.empty() ? "agent/" + name : ns; }
};

// A bad agent: the field and why.
class AgentError : public Error {
 public:
  AgentError(std::string field, const std::string& message) : Error(message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

nlohmann::json agent_to_json(const AgentSpec& a);
// The fields of `j` over `base` (create: a default spec; update: the agent
// as it is). Unknown fields are refused (AgentError naming them), as is a
// field of the wrong type or out of bounds. `name` is only read on create.
struct AgentLimits;
AgentSpec agent_from_json(const nlohmann::json& j, AgentSpec base, bool create, const AgentLimits& limits);

struct AgentLimits {
  size_t max_agents = 256;
  size_t max_system_prompt = 64 * 1024;  // bytes
  size_t max_tools = 64;
};

class AgentRegistry {
 public:
  // path: the file agents persist to ("" : memory only). Reads it when it
  // exists; `note` receives what happened when it could not be read (the
  // file is then moved to PATH.corrupt-UNIXTIME and the registry starts empty).
  explicit AgentRegistry(std::string path, AgentLimits limits = {}, std::string* note = nullptr);
  AgentRegistry(const AgentRegistry&) = delete;
  AgentRegistry& operator=(const AgentRegistry&) = delete;

  enum class Status { kOk, kNotFound, kExists, kFull };
  // Create: kExists when the name is taken, kFull at max_agents.
  Status create(const AgentSpec& a);
  // Replaces the agent of that name (kNotFound when none).
  Status update(const AgentSpec& a);
  Status remove(const std::string& name);
  std::optional<AgentSpec> get(const std::string& name) const;
  std::vector<AgentSpec> list() const;  // by name
  const AgentLimits& limits() const { return limits_; }

 private:
  void save_locked() const;  // throws ebb::Error naming the file when it cannot write

  const std::string path_;
  const AgentLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, AgentSpec> agents_;
};

// Throws AgentError("name") unless `name` can name an agent.
void check_agent_name(const std::string& name);

// A judge as the agents' "judge" field gives it ({"kind", "prompt"?,
// "adapter"?, "grammar"?, "max_tokens"?} or the kind alone) over `base`;
// the result is set. Throws AgentError naming the field ("judge.prompt").
JudgeSpec judge_from_json(const nlohmann::json& j, JudgeSpec base = {});
nlohmann::json judge_to_json(const JudgeSpec& j);

}  // namespace ebb
