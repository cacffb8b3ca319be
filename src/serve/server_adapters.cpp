// /v1/adapters: list, load (from --adapter-dir only), stage, publish, unload;
// stale-coverage prefill of staged versions (runtime/stale_prefill.h).
//
//   GET  /v1/adapters                  {"object": "list", "data": [{name, published_version, versions: [...]}]}
//   POST /v1/adapters/load             {"name", "publish"?: true}: NAME.gguf or the PEFT directory NAME/
//   POST /v1/adapters/{name}/stage     {"file"?: NAME}: the file read again as a staged version
//   POST /v1/adapters/{name}/publish   {"version"}: makes it the default
//   POST /v1/adapters/{name}/unload    {"version"?}: one staged version, or every version
//
// Files load only from the adapter directory, by name: a name is
// [A-Za-z0-9][A-Za-z0-9._-]{0,127} without "..", and the path it resolves to
// (symlinks followed) must lie inside the directory. Answers: 400 a bad name
// or a file the loader refuses (its message), 403 no --adapter-dir or a path
// that leads outside it, 404 an unknown file, adapter or version, 409
// unloading the published version while others remain. Registry changes
// (file reads included) run on the scheduler thread between steps
// (Scheduler::call). A version that is staged (and new) gets
// its hot prefixes prefilled in the background; an unloaded version loses
// its tasks and its prefix-cache entries.
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <future>

#include "platform/error.h"
#include "runtime/stale_prefill.h"
#include "serve/server_impl.h"

namespace ebb::serve {

using nlohmann::json;
namespace fs = std::filesystem;

struct Server::Impl::AdapterState {
  std::unique_ptr<StalePrefill> stale;
  std::atomic<int64_t> loads{0}, stages{0}, publishes{0}, unloads{0};
};

namespace {

ApiException bad_request(const std::string& message, const std::string& param, const std::string& code = "") {
  return ApiException(invalid_request(message, param, code));
}

ApiException not_found(const std::string& message, const std::string& param = "") {
  ApiError e = error_of(404, message, "invalid_request_error", "adapter_not_found");
  e.param = param;
  return ApiException(e);
}

// [A-Za-z0-9][A-Za-z0-9._-]{0,127} and no "..": a name can only name an
// entry of the adapter directory itself.
void check_file_name(const std::string& s, const char* param) {
  const auto fail = [&](const std::string& why) {
    throw bad_request("'" + std::string(param) + "' ('" + s + "') " + why +
                          ": a name is a letter or digit, then up to 127 letters, digits, '.', '_' or '-', "
                          "without '..' (it names NAME.gguf or NAME/ in --adapter-dir)",
                      param, "invalid_adapter_name");
  };
  if (s.empty() || s.size() > 128) fail("must have 1 to 128 characters");
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  if (!alnum(s[0])) fail("must start with a letter or digit");
  for (char c : s)
    if (!alnum(c) && c != '.' && c != '_' && c != '-') fail("holds a character other than letters, digits, '.', '_', '-'");
  if (s.find("..") != std::string::npos) fail("holds '..'");
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

const json* field(const json& body, const char* name) {
  if (!body.is_object()) return nullptr;
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// A body that may be empty (unload): {} then.
json optional_body(const httplib::Request& req) {
  if (req.body.find_first_not_of(" \t\r\n") == std::string::npos) return json::object();
  json b = parse_body(req);
  if (!b.is_object()) throw bad_request("the request body must be a JSON object", "");
  return b;
}

uint64_t version_field(const json& body, bool required) {
  const json* v = field(body, "version");
  if (!v) {
    if (required) throw bad_request("'version' is required (GET /v1/adapters lists the versions)", "version");
    return 0;
  }
  if (!v->is_number_integer() || v->get<int64_t>() < 1)
    throw bad_request("'version' must be an integer >= 1", "version");
  return v->get<uint64_t>();
}

std::vector<AdapterInfo> versions_of(const AdapterRegistry& reg, const std::string& name) {
  std::vector<AdapterInfo> out;
  for (const AdapterInfo& i : reg.list())
    if (i.name == name) out.push_back(i);
  return out;
}

const AdapterInfo* find_version(const std::vector<AdapterInfo>& vs, uint64_t version) {
  for (const AdapterInfo& i : vs)
    if (i.version == version) return &i;
  return nullptr;
}

}  // namespace

void Server::Impl::adapter_routes() {
  adapter_state = std::make_shared<AdapterState>();
  StalePrefillOptions stale_opts;
  stale_opts.step_seconds = opts.background_step_s;
  adapter_state->stale = std::make_unique<StalePrefill>(engine, sched, stale_opts);

  // The file or PEFT directory `file` names in the adapter directory.
  const auto resolve_file = [this](const std::string& file, const char* param) -> std::string {
    if (opts.adapter_dir.empty()) {
      throw ApiException(error_of(403,
                                  "adapters load over HTTP only from the server's adapter directory: start the "
                                  "server with --adapter-dir DIR (NAME.gguf or a PEFT directory NAME/ in it)",
                                  "invalid_request_error", "no_adapter_dir"));
    }
    check_file_name(file, param);
    std::error_code ec;
    const fs::path base = fs::canonical(opts.adapter_dir, ec);
    if (ec) throw ApiException(error_of(500, "the adapter directory '" + opts.adapter_dir + "' cannot be read: " +
                                                 ec.message(), "server_error", "adapter_dir"));
    std::vector<fs::path> candidates;
    if (file.size() > 5 && file.compare(file.size() - 5, 5, ".gguf") == 0) {
      candidates.push_back(base / file);
    } else {
      candidates.push_back(base / (file + ".gguf"));
      candidates.push_back(base / file);  // a PEFT directory
    }
    for (const fs::path& p : candidates) {
      if (!fs::exists(fs::symlink_status(p, ec))) continue;
      // Symlinks are followed: where they lead must still be inside.
      const fs::path real = fs::weakly_canonical(p, ec);
      const fs::path rel = ec ? fs::path() : real.lexically_relative(base);
      if (ec || rel.empty() || *rel.begin() == "..") {
        throw ApiException(error_of(403, "'" + file + "' leads outside the adapter directory (a symlink?); adapters "
                                    "load only from inside it", "invalid_request_error", "adapter_outside_dir"));
      }
      if (!fs::exists(real, ec)) continue;  // a dangling link
      return real.string();
    }
    throw not_found("no adapter '" + file + "' in the adapter directory (looked for " +
                        (candidates.size() == 1 ? file : file + ".gguf and the PEFT directory " + file + "/") + ")",
                    param);
  };

  // Where an adapter was read from, relative to the adapter directory (only
  // the file name for one outside it, e.g. from --lora).
  const auto source_of = [this](const std::string& source) -> std::string {
    if (source.empty()) return source;
    std::error_code ec;
    if (!opts.adapter_dir.empty()) {
      const fs::path base = fs::canonical(opts.adapter_dir, ec);
      if (!ec) {
        const fs::path rel = fs::weakly_canonical(source, ec).lexically_relative(base);
        if (!ec && !rel.empty() && *rel.begin() != "..") return rel.string();
      }
    }
    return fs::path(source).filename().string();
  };

  const auto info_json = [source_of](const AdapterInfo& a) {
    return json{{"name", a.name},
                {"version", a.version},
                {"digest", hex64(a.digest)},
                {"state", a.published ? "published" : "staged"},
                {"published", a.published},
                {"rank", a.rank},
                {"alpha", a.alpha},
                {"targets", a.targets},
                {"format", a.format},
                {"bytes", a.bytes},
                {"users", a.users},
                {"source", source_of(a.source)}};
  };

  struct Added {
    AdapterInfo info;
    bool created = false;     // a new version (not bytes an existing version already has)
    size_t warm_tasks = 0;    // stale-coverage prefill tasks submitted for it
  };
  // Loads the file between steps (the registry's load(): a file-backed
  // version, which memory pressure may evict and re-read), and plans the
  // warm-up of a new staged version in the same control step.
  const auto add_file = [this](const std::string& path, const std::string& name, bool publish) -> Added {
    StalePrefill* stale = adapter_state->stale.get();
    const Added added = sched
        .call([path, name, publish, stale](Engine& e) {
          Added a;
          const std::vector<AdapterInfo> before = versions_of(e.adapters(), name);
          try {
            a.info = e.adapters().load(path, name, publish);
          } catch (const Error& err) {
            throw bad_request(err.what(), "name", "invalid_adapter_file");
          }
          a.created = !find_version(before, a.info.version);
          if (a.created && !a.info.published) a.warm_tasks = stale->plan(name, a.info.version);
          return a;
        })
        .get();
    if (added.info.published) adapter_published(name, added.info.version);  // a load that published
    return added;
  };
  const auto added_json = [info_json](const Added& a) {
    json j = info_json(a.info);
    j["created"] = a.created;
    j["stale_prefill_tasks"] = a.warm_tasks;
    return j;
  };

  http.Get("/v1/adapters", guarded([this, info_json](const httplib::Request&, httplib::Response& res) {
             json data = json::array();
             for (const AdapterInfo& a : engine.adapters().list()) {  // sorted by name, then version
               if (data.empty() || data.back()["name"] != a.name)
                 data.push_back({{"name", a.name}, {"published_version", nullptr}, {"versions", json::array()}});
               if (a.published) data.back()["published_version"] = a.version;
               data.back()["versions"].push_back(info_json(a));
             }
             res.set_content(dump(json{{"object", "list"}, {"data", data}}), kJson);
           }));

  http.Post("/v1/adapters/load",
            guarded([this, resolve_file, add_file, added_json](const httplib::Request& req, httplib::Response& res) {
              const json body = parse_body(req);
              if (!body.is_object()) throw bad_request("the request body must be a JSON object", "");
              const json* n = field(body, "name");
              if (!n || !n->is_string()) throw bad_request("'name' must be a string: NAME.gguf or NAME/ in --adapter-dir", "name");
              const std::string name = n->get<std::string>();
              bool publish = true;
              if (const json* p = field(body, "publish")) {
                if (!p->is_boolean()) throw bad_request("'publish' must be true or false", "publish");
                publish = p->get<bool>();
              }
              // The file's stem names the adapter: "x.gguf" loads as "x".
              check_file_name(name, "name");
              const std::string stem = adapter_name_of(name);
              const std::string path = resolve_file(name, "name");
              const Added a = add_file(path, stem, publish);
              ++adapter_state->loads;
              res.set_content(dump(added_json(a)), kJson);
            }));

  // The adapter a route's path names: a valid name that is loaded.
  const auto loaded_name = [this](const httplib::Request& req) {
    const std::string name = req.matches[1].str();
    check_file_name(name, "name");
    if (versions_of(engine.adapters(), name).empty())
      throw not_found("no adapter named '" + name + "' is loaded (GET /v1/adapters lists them)", "name");
    return name;
  };

  http.Post(R"(/v1/adapters/([^/]+)/stage)", guarded([this, loaded_name, resolve_file, add_file, added_json](
                                                         const httplib::Request& req, httplib::Response& res) {
              const std::string name = loaded_name(req);
              const json body = optional_body(req);
              std::string file = name;
              if (const json* f = field(body, "file")) {
                if (!f->is_string()) throw bad_request("'file' must be a string: FILE.gguf or FILE/ in --adapter-dir", "file");
                file = f->get<std::string>();
              }
              const Added a = add_file(resolve_file(file, "file"), name, /*publish=*/false);
              ++adapter_state->stages;
              res.set_content(dump(added_json(a)), kJson);
            }));

  http.Post(R"(/v1/adapters/([^/]+)/publish)",
            guarded([this, loaded_name, info_json](const httplib::Request& req, httplib::Response& res) {
              const std::string name = loaded_name(req);
              const uint64_t version = version_field(optional_body(req), /*required=*/true);
              const AdapterInfo info = sched
                                           .call([name, version](Engine& e) {
                                             if (!find_version(versions_of(e.adapters(), name), version))
                                               throw not_found("adapter '" + name + "' has no version " +
                                                                   std::to_string(version),
                                                               "version");
                                             e.adapters().publish(name, version);
                                             return *find_version(versions_of(e.adapters(), name), version);
                                           })
                                           .get();
              ++adapter_state->publishes;
              adapter_published(name, version);  // pending handoff targets re-planned under it
              res.set_content(dump(info_json(info)), kJson);
            }));

  http.Post(R"(/v1/adapters/([^/]+)/unload)", guarded([this, loaded_name](const httplib::Request& req,
                                                                          httplib::Response& res) {
              const std::string name = loaded_name(req);
              const uint64_t version = version_field(optional_body(req), /*required=*/false);
              StalePrefill* stale = adapter_state->stale.get();
              struct Unloaded {
                std::vector<uint64_t> versions;
                size_t dropped = 0;
              };
              const Unloaded u =
                  sched
                      .call([name, version, stale](Engine& e) {
                        const std::vector<AdapterInfo> vs = versions_of(e.adapters(), name);
                        const AdapterInfo* v = version ? find_version(vs, version) : nullptr;
                        if (vs.empty()) throw not_found("no adapter named '" + name + "' is loaded", "name");
                        if (version && !v)
                          throw not_found("adapter '" + name + "' has no version " + std::to_string(version), "version");
                        if (v && v->published && vs.size() > 1) {
                          throw ApiException(error_of(409,
                                                      "version " + std::to_string(version) + " of adapter '" + name +
                                                          "' is the published one: publish another version first, "
                                                          "or unload the adapter (no version)",
                                                      "invalid_request_error", "adapter_version_published"));
                        }
                        Unloaded out;
                        for (const AdapterInfo& i : vs)
                          if (!version || i.version == version) out.versions.push_back(i.version);
                        e.adapters().unload(name, version);
                        stale->on_unloaded(name, version);
                        // The KV computed under it can never be looked up again.
                        if (PrefixCache* pc = e.prefix_cache()) {
                          for (uint64_t ver : out.versions) out.dropped += pc->drop_adapter(name, ver);
                        }
                        return out;
                      })
                      .get();
              ++adapter_state->unloads;
              res.set_content(dump(json{{"name", name}, {"unloaded_versions", u.versions}, {"dropped_cache_keys", u.dropped}}),
                              kJson);
            }));
}

void Server::Impl::adapter_staged(const std::string& name, uint64_t version, uint64_t dropped) {
  if (!adapter_state || !adapter_state->stale) return;
  if (dropped != 0) adapter_state->stale->on_unloaded(name, dropped);
  if (version != 0) {
    adapter_state->stale->plan(name, version);
    handoffs_staged(name, version);
  }
}

void Server::Impl::adapter_metrics(std::string& o) const {
  if (!adapter_state) return;
  int64_t names = 0, published = 0, staged = 0;
  std::string last;
  for (const AdapterInfo& a : engine.adapters().list()) {
    if (a.name != last) ++names;
    last = a.name;
    ++(a.published ? published : staged);
  }
  metric(o, "ebb_adapters_loaded", "gauge", "Adapter names loaded");
  sample(o, "ebb_adapters_loaded", static_cast<double>(names));
  metric(o, "ebb_adapter_versions_loaded", "gauge", "Adapter versions loaded, by state");
  sample(o, "ebb_adapter_versions_loaded" + label("state", "published"), static_cast<double>(published));
  sample(o, "ebb_adapter_versions_loaded" + label("state", "staged"), static_cast<double>(staged));
  metric(o, "ebb_adapter_operations_total", "counter", "Adapter operations over HTTP that succeeded, by operation");
  const AdapterState& s = *adapter_state;
  sample(o, "ebb_adapter_operations_total" + label("op", "load"), static_cast<double>(s.loads.load()));
  sample(o, "ebb_adapter_operations_total" + label("op", "stage"), static_cast<double>(s.stages.load()));
  sample(o, "ebb_adapter_operations_total" + label("op", "publish"), static_cast<double>(s.publishes.load()));
  sample(o, "ebb_adapter_operations_total" + label("op", "unload"), static_cast<double>(s.unloads.load()));
  const StalePrefillStats st = s.stale->stats();
  metric(o, "ebb_stale_prefill_tasks_total", "counter", "Stale-coverage prefill tasks of staged adapter versions, by outcome");
  sample(o, "ebb_stale_prefill_tasks_total" + label("outcome", "submitted"), static_cast<double>(st.tasks_submitted));
  sample(o, "ebb_stale_prefill_tasks_total" + label("outcome", "completed"), static_cast<double>(st.tasks_completed));
  sample(o, "ebb_stale_prefill_tasks_total" + label("outcome", "cancelled"), static_cast<double>(st.tasks_cancelled));
  sample(o, "ebb_stale_prefill_tasks_total" + label("outcome", "failed"), static_cast<double>(st.tasks_failed));
  metric(o, "ebb_stale_prefill_tasks_running", "gauge", "Stale-coverage prefill tasks submitted and not ended");
  sample(o, "ebb_stale_prefill_tasks_running", static_cast<double>(st.tasks_running));
  metric(o, "ebb_stale_prefill_tokens_total", "counter", "Tokens prefilled under staged adapter versions");
  sample(o, "ebb_stale_prefill_tokens_total", static_cast<double>(st.tokens_prefilled));
  metric(o, "ebb_stale_prefill_chunks_total", "counter", "KV chunks stale-coverage prefill added to the prefix cache");
  sample(o, "ebb_stale_prefill_chunks_total", static_cast<double>(st.chunks_inserted));
}

}  // namespace ebb::serve
