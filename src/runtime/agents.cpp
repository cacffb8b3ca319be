// Agents: checks, JSON and the persisted registry (agents.h).
#include "runtime/agents.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "runtime/grammar/grammar.h"
#include "runtime/judge.h"

namespace ebb {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kFields[] = {"name",  "role",     "system_prompt", "namespace", "adapter", "adapter_version",
                                   "tools", "feedback", "learn",         "object",    "created_at", "updated_at",
                                   "adapter_policy", "judge"};
constexpr size_t kMaxShort = 256;  // bytes of role, namespace, adapter, a tool name

bool name_char(char c, bool first) {
  const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  return alnum || (!first && (c == '.' || c == '_' || c == '-'));
}

std::string str(const json& j, const char* f, size_t max) {
  const json& v = j[f];
  if (!v.is_string()) throw AgentError(f, std::string("'") + f + "' must be a string");
  std::string s = v.get<std::string>();
  if (s.size() > max)
    throw AgentError(f, std::string("'") + f + "' is longer than " + std::to_string(max) + " bytes");
  return s;
}

bool adapter_name_ok(const std::string& s) {
  bool ok = !s.empty() && s.size() <= 128 && name_char(s[0], true);
  for (char c : s) ok = ok && name_char(c, false);
  return ok;
}

}  // namespace

json judge_to_json(const JudgeSpec& j) {
  return json{{"kind", j.kind},
              {"prompt", j.prompt.empty() ? json(nullptr) : json(j.prompt)},
              {"adapter", j.adapter.empty() ? json(nullptr) : json(j.adapter)},
              {"grammar", j.grammar},
              {"max_tokens", j.max_tokens}};
}

// The "judge" field over `base`: {"kind", "prompt"?, "adapter"?, "grammar"?, "max_tokens"?}.
JudgeSpec judge_from_json(const json& j, JudgeSpec base) {
  if (j.is_string()) return judge_from_json(json{{"kind", j}}, base);  // "judge": "rule" for short
  if (!j.is_object()) throw AgentError("judge", "'judge' must be an object {\"kind\", \"prompt\", \"adapter\", ...}");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "kind" && it.key() != "prompt" && it.key() != "adapter" && it.key() != "grammar" &&
        it.key() != "max_tokens")
      throw AgentError("judge." + it.key(), "'judge." + it.key() +
                                               "' is not a field of a judge (kind, prompt, adapter, grammar, max_tokens)");
  const auto given = [&](const char* f) { return j.contains(f) && !j[f].is_null(); };
  const auto text = [&](const char* f, size_t max) {
    const json& v = j[f];
    if (!v.is_string()) throw AgentError(std::string("judge.") + f, std::string("'judge.") + f + "' must be a string");
    if (v.get<std::string>().size() > max)
      throw AgentError(std::string("judge.") + f,
                       std::string("'judge.") + f + "' is longer than " + std::to_string(max) + " bytes");
    return v.get<std::string>();
  };
  if (given("kind")) {
    base.kind = text("kind", 16);
    if (base.kind != "rule" && base.kind != "client" && base.kind != "prompt")
      throw AgentError("judge.kind", "'judge.kind' must be \"rule\", \"client\" or \"prompt\"");
  }
  if (j.contains("prompt")) base.prompt = given("prompt") ? text("prompt", 64 * 1024) : "";
  if (j.contains("adapter")) {
    base.adapter = given("adapter") ? text("adapter", 128) : "";
    if (!base.adapter.empty() && !adapter_name_ok(base.adapter))
      throw AgentError("judge.adapter", "'judge.adapter' must be an adapter name: [A-Za-z0-9][A-Za-z0-9._-]{0,127}");
  }
  if (j.contains("grammar")) base.grammar = given("grammar") ? text("grammar", 16 * 1024) : "";
  if (given("max_tokens")) {
    const json& v = j["max_tokens"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 64)
      throw AgentError("judge.max_tokens", "'judge.max_tokens' must be an integer in [1, 64]");
    base.max_tokens = v.get<int64_t>();
  }
  if (base.kind == "prompt") {
    if (base.prompt.empty())
      throw AgentError("judge.prompt", "a judge of kind \"prompt\" needs 'judge.prompt' (a template with {prompt}, "
                                       "{response}, {feedback})");
    try {
      check_judge_template(base.prompt);
    } catch (const Error& e) {
      throw AgentError("judge.prompt", std::string("'judge.prompt': ") + e.what());
    }
  }
  if (!base.grammar.empty()) {
    try {
      grammar::Grammar::parse(base.grammar);
    } catch (const Error& e) {
      throw AgentError("judge.grammar", std::string("'judge.grammar' is not a grammar this server can use: ") + e.what());
    }
  }
  base.set = true;
  return base;
}

void check_agent_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64 && name_char(name[0], true);
  for (char c : name) ok = ok && name_char(c, false);
  if (!ok)
    throw AgentError("name", "'name' ('" + name +
                                 "') must be 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or digit");
}

json agent_to_json(const AgentSpec& a) {
  return json{{"object", "agent"},
              {"name", a.name},
              {"role", a.role},
              {"system_prompt", a.system_prompt},
              {"namespace", a.cache_namespace()},
              {"adapter", a.adapter.empty() ? json(nullptr) : json(a.adapter)},
              {"adapter_version", a.adapter_version ? json(a.adapter_version) : json(nullptr)},
              {"adapter_policy", a.adapter.empty() ? "none" : a.adapter_version ? "pinned" : "follow_published"},
              {"tools", a.tools},
              {"feedback", a.feedback},
              {"learn", a.learn},
              {"judge", a.judge.set ? judge_to_json(a.judge) : json(nullptr)},  // null: the server's default
              {"created_at", a.created_at},
              {"updated_at", a.updated_at}};
}

AgentSpec agent_from_json(const json& j, AgentSpec a, bool create, const AgentLimits& limits) {
  if (!j.is_object()) throw AgentError("", "the body must be a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* f : kFields) known = known || it.key() == f;
    if (!known)
      throw AgentError(it.key(), "'" + it.key() +
                                     "' is not a field of an agent (name, role, system_prompt, namespace, adapter, "
                                     "adapter_version, tools, feedback, learn, judge)");
  }
  const auto given = [&](const char* f) { return j.contains(f) && !j[f].is_null(); };
  if (create) {
    if (!given("name")) throw AgentError("name", "'name' is required");
    a.name = str(j, "name", 64);
    check_agent_name(a.name);
  } else if (given("name") && str(j, "name", 64) != a.name) {
    throw AgentError("name", "'name' cannot change (delete the agent and create it anew)");
  }
  if (given("role")) a.role = str(j, "role", kMaxShort);
  if (j.contains("system_prompt")) a.system_prompt = given("system_prompt") ? str(j, "system_prompt", limits.max_system_prompt) : "";
  if (j.contains("namespace")) {
    a.ns = given("namespace") ? str(j, "namespace", kMaxShort) : "";
  }
  if (j.contains("adapter")) {
    a.adapter = given("adapter") ? str(j, "adapter", 128) : "";
    if (!a.adapter.empty()) {
      bool ok = name_char(a.adapter[0], true);
      for (char c : a.adapter) ok = ok && name_char(c, false);
      if (!ok) throw AgentError("adapter", "'adapter' must be an adapter name: [A-Za-z0-9][A-Za-z0-9._-]{0,127}");
    }
    if (!j.contains("adapter_version")) a.adapter_version = 0;
  }
  if (j.contains("adapter_version")) {
    const json& v = j["adapter_version"];
    if (v.is_null() || v == "published") {
      a.adapter_version = 0;
    } else if (v.is_number_integer() && v.get<int64_t>() >= 1) {
      a.adapter_version = v.get<uint64_t>();
    } else {
      throw AgentError("adapter_version",
                       "'adapter_version' must be an integer >= 1 (pinned) or null / \"published\" (follow the "
                       "published version)");
    }
    if (a.adapter_version && a.adapter.empty())
      throw AgentError("adapter_version", "'adapter_version' needs an 'adapter'");
  }
  if (given("adapter_policy")) {
    const std::string p = str(j, "adapter_policy", 32);
    if (p == "follow_published") {
      if (j.contains("adapter_version") && !j["adapter_version"].is_null() && j["adapter_version"] != "published")
        throw AgentError("adapter_policy", "'adapter_policy' follow_published contradicts 'adapter_version'");
      a.adapter_version = 0;
    } else if (p == "pinned") {
      if (!a.adapter_version) throw AgentError("adapter_policy", "'adapter_policy' pinned needs 'adapter_version'");
    } else if (p == "none") {
      if (!a.adapter.empty()) throw AgentError("adapter_policy", "'adapter_policy' none contradicts 'adapter'");
    } else {
      throw AgentError("adapter_policy", "'adapter_policy' must be \"follow_published\", \"pinned\" or \"none\"");
    }
  }
  if (given("tools")) {
    const json& t = j["tools"];
    if (!t.is_array()) throw AgentError("tools", "'tools' must be an array of tool names");
    if (t.size() > limits.max_tools)
      throw AgentError("tools", "'tools' has more than " + std::to_string(limits.max_tools) + " entries");
    a.tools.clear();
    for (const json& x : t) {
      if (!x.is_string() || x.get<std::string>().empty() || x.get<std::string>().size() > 64)
        throw AgentError("tools", "'tools' entries must be names of 1 to 64 bytes");
      a.tools.push_back(x.get<std::string>());
    }
  }
  if (given("feedback")) {
    a.feedback = str(j, "feedback", 16);
    if (a.feedback != "rule" && a.feedback != "explicit" && a.feedback != "off")
      throw AgentError("feedback", "'feedback' must be \"rule\", \"explicit\" or \"off\"");
  }
  if (given("learn")) {
    if (!j["learn"].is_boolean()) throw AgentError("learn", "'learn' must be true or false");
    a.learn = j["learn"].get<bool>();
  }
  if (j.contains("judge")) a.judge = given("judge") ? judge_from_json(j["judge"], a.judge) : JudgeSpec{};
  if (a.learn && a.adapter.empty())
    throw AgentError("adapter", "a learning agent needs an 'adapter' (the name its versions are trained under)");
  if (a.learn && a.adapter_version)
    throw AgentError("adapter_version", "a learning agent follows its published version: drop 'adapter_version'");
  return a;
}

AgentRegistry::AgentRegistry(std::string path, AgentLimits limits, std::string* note)
    : path_(std::move(path)), limits_(limits) {
  if (path_.empty()) return;
  std::error_code ec;
  if (!fs::exists(path_, ec)) return;
  try {
    std::ifstream in(path_);
    if (!in) throw Error("cannot be opened: " + std::string(std::strerror(errno)));
    std::stringstream ss;
    ss << in.rdbuf();
    const json j = json::parse(ss.str());
    if (!j.is_object() || j.value("format", "") != "ebb-agents" || !j.contains("agents") || !j["agents"].is_array())
      throw Error("is not an ebb agents file (no {\"format\": \"ebb-agents\", \"agents\": [...]})");
    std::map<std::string, AgentSpec> loaded;
    for (const json& x : j["agents"]) {
      AgentSpec a = agent_from_json(x, AgentSpec{}, true, limits_);
      a.created_at = x.value("created_at", int64_t{0});
      a.updated_at = x.value("updated_at", int64_t{0});
      if (loaded.count(a.name)) throw Error("holds agent '" + a.name + "' twice");
      loaded.emplace(a.name, std::move(a));
    }
    agents_ = std::move(loaded);
  } catch (const std::exception& e) {
    const std::string aside = path_ + ".corrupt-" + std::to_string(std::time(nullptr));
    fs::rename(path_, aside, ec);
    if (note)
      *note = "the agents file '" + path_ + "' " + e.what() + "; it was moved to '" + (ec ? "(could not move it)" : aside) +
              "' and the server starts with no agents";
    agents_.clear();
  }
}

void AgentRegistry::save_locked() const {
  if (path_.empty()) return;
  json arr = json::array();
  for (const auto& [name, a] : agents_) arr.push_back(agent_to_json(a));
  // namespace "" is written as its effective value; reading it back keeps it.
  const std::string text = json{{"format", "ebb-agents"}, {"version", 1}, {"agents", arr}}.dump(1) + "\n";
  const std::string tmp = path_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error("cannot write the agents file '" + tmp + "': " + std::strerror(errno));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool flushed = std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  std::fclose(f);
  std::error_code ec;
  if (!wrote || !flushed) {
    fs::remove(tmp, ec);
    throw Error("cannot write the agents file '" + tmp + "' (disk full?)");
  }
  fs::rename(tmp, path_, ec);
  if (ec) throw Error("cannot rename '" + tmp + "' to '" + path_ + "': " + ec.message());
}

AgentRegistry::Status AgentRegistry::create(const AgentSpec& a) {
  std::lock_guard lock(mu_);
  if (agents_.count(a.name)) return Status::kExists;
  if (agents_.size() >= limits_.max_agents) return Status::kFull;
  agents_[a.name] = a;
  try {
    save_locked();
  } catch (...) {
    agents_.erase(a.name);
    throw;
  }
  return Status::kOk;
}

AgentRegistry::Status AgentRegistry::update(const AgentSpec& a) {
  std::lock_guard lock(mu_);
  auto it = agents_.find(a.name);
  if (it == agents_.end()) return Status::kNotFound;
  const AgentSpec old = it->second;
  it->second = a;
  try {
    save_locked();
  } catch (...) {
    it->second = old;
    throw;
  }
  return Status::kOk;
}

AgentRegistry::Status AgentRegistry::remove(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = agents_.find(name);
  if (it == agents_.end()) return Status::kNotFound;
  const AgentSpec old = it->second;
  agents_.erase(it);
  try {
    save_locked();
  } catch (...) {
    agents_[name] = old;
    throw;
  }
  return Status::kOk;
}

std::optional<AgentSpec> AgentRegistry::get(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = agents_.find(name);
  if (it == agents_.end()) return std::nullopt;
  return it->second;
}

std::vector<AgentSpec> AgentRegistry::list() const {
  std::lock_guard lock(mu_);
  std::vector<AgentSpec> out;
  for (const auto& [n, a] : agents_) out.push_back(a);
  return out;
}

}  // namespace ebb
