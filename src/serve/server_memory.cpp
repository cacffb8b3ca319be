// Elastic memory over HTTP:
//
//   GET  /v1/memory           footprint by category and state, per-layer bytes,
//                             the limit, counters and the residency map
//   GET  /v1/memory/history   memory by state (and tok/s, queues) once a
//                             second for the last ten minutes; ?since=T
//                             gives the samples after unix time T only
//   POST /v1/memory/evict     {"bytes": N | "200MiB" | "25%"} or {"fraction": f}
//   POST /v1/memory/restore   everything evicted comes back now
//   POST /v1/memory/limit     {"bytes": N | "512MiB" | "40%" | "off"}; 0 or "off" removes it
//   POST /v1/memory/trim      {"level": "running_low" | 10}: Android's onTrimMemory
//
// Every engine access runs on the scheduler thread through sched.call, at
// the next step boundary: a generation running meanwhile goes on, and its
// next step starts restoring what it needs (Session::prepare_step). The
// history is sampled by a thread of its own from the scheduler's snapshot
// (Scheduler::metrics), which never waits for the engine.
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <optional>
#include <stop_token>
#include <thread>

#include "memory/budget_plan.h"
#include "platform/error.h"
#include "platform/wall_clock.h"
#include "serve/server_impl.h"

namespace ebb::serve {

using nlohmann::json;

namespace {

// Android's onTrimMemory levels (ComponentCallbacks2.TRIM_MEMORY_*) and the
// share of the footprint total each gives back. Eviction frees what it can
// of what is asked, so 1.0 is "everything evictable" (weight layers and KV;
// the globals, scratch and adapters stay). The running levels come while
// the app is in use: give a little (moderate), a quarter (low), half
// (critical). UI_HIDDEN: the app's window went away, a quarter. The
// background levels say how near the app is to being killed: half
// (background), three quarters (moderate), all (complete).
struct TrimLevel {
  int level;
  const char* name;
  double fraction;
};
constexpr TrimLevel kTrimLevels[] = {
    {5, "running_moderate", 0.10}, {10, "running_low", 0.25}, {15, "running_critical", 0.50},
    {20, "ui_hidden", 0.25},       {40, "background", 0.50},  {60, "moderate", 0.75},
    {80, "complete", 1.00},
};

std::string trim_levels_list() {
  std::string s;
  for (const TrimLevel& t : kTrimLevels)
    s += (s.empty() ? "" : ", ") + std::string(t.name) + " (" + std::to_string(t.level) + ")";
  return s;
}

// One point of /v1/memory/history: bytes by state, and the scheduler's load.
struct MemorySample {
  double t = 0;  // unix seconds
  uint64_t weights = 0, globals = 0, kv = 0;        // resident
  uint64_t compressed = 0;                          // compressed KV in RAM
  uint64_t other = 0;                               // scratch, I/O buffers, adapters, training
  uint64_t kv_stored = 0, weights_stored = 0;       // not in RAM
  uint64_t total = 0;                               // in RAM
  double tok_s = 0;                                 // tokens generated per second since the previous sample
  double decode_tok_s = 0;                          // the scheduler's EMA over foreground rounds
  int64_t fg_waiting = 0, fg_running = 0, bg_waiting = 0;
  int64_t generated_tokens = 0, requests_completed = 0;
};

json sample_json(const MemorySample& s) {
  return {{"t", s.t},
          {"weights", s.weights},
          {"globals", s.globals},
          {"kv", s.kv},
          {"compressed", s.compressed},
          {"other", s.other},
          {"kv_stored", s.kv_stored},
          {"weights_stored", s.weights_stored},
          {"total", s.total},
          {"tok_s", s.tok_s},
          {"decode_tok_s", s.decode_tok_s},
          {"fg_waiting", s.fg_waiting},
          {"fg_running", s.fg_running},
          {"bg_waiting", s.bg_waiting},
          {"generated_tokens", s.generated_tokens},
          {"requests_completed", s.requests_completed}};
}

json footprint_json(const Footprint& f) {
  return {{"weights", f.weights()},       {"globals", f.globals},       {"kv", f.kv()},
          {"kv_spare", f.kv_spare},       {"scratch", f.scratch},         {"compressed", f.compressed}, {"io_buffers", f.io_buffers},
          {"adapters", f.adapters},       {"training", f.training},     {"kv_stored", f.kv_stored},
          {"weights_stored", f.weights_stored}, {"kv_parked", f.kv_parked}, {"total", f.total()}};
}

json elastic_footprint_json(const ElasticFootprint& e) {
  return {{"weights_resident", e.weights_resident}, {"weights_stored", e.weights_stored},
          {"kv_resident", e.kv_resident},           {"compressed", e.compressed},
          {"kv_stored", e.kv_stored},               {"stream_window", e.stream_window},
          {"kv_spare", e.kv_spare},
          {"in_ram", e.in_ram()}};
}

json evict_json(const EvictReport& r) {
  return {{"requested", r.requested},
          {"freed", r.freed},
          {"kv_to_compressed", r.kv_to_compressed},
          {"kv_to_storage", r.kv_to_storage},
          {"weights_dropped", r.weights_dropped},
          {"compressed_to_storage", r.compressed_to_storage},
          {"last_stage", std::string(evict_stage_name(r.last_stage))},
          {"seconds", r.seconds},
          {"note", r.note},
          {"after", elastic_footprint_json(r.after)}};
}

json restore_json(const RestoreReport& r) {
  return {{"seconds", r.seconds},
          {"alloc_s", r.alloc_s},
          {"read_s", r.read_s},
          {"decompress_s", r.decompress_s},
          {"stall_s", r.stall_s},
          {"bytes_read", r.bytes_read},
          {"weights_loaded", r.weights_loaded},
          {"chunks_read", r.chunks_read},
          {"chunks_decompressed", r.chunks_decompressed},
          {"chunks_lost", r.chunks_lost}};
}

// The routes evict, restore and limit the host's elastic memory or, on a
// device, the device engine's layers and KV (Engine::evict, restore,
// set_memory_limit); only budget mode has neither.
void elastic_or_throw(Engine& e) {
  if (e.elastic() || e.device()) return;
  ApiError err = error_of(409,
                          "elastic memory is off (budget mode: --memory-budget streams the weights instead); "
                          "nothing can be evicted, restored or limited here",
                          "invalid_request_error", "elastic_memory_off");
  throw ApiException(err);
}

// The footprint a fraction or percentage is of: the host's total and, on a
// device engine, the device's too.
uint64_t footprint_total(const Footprint& f) { return f.total() + (f.device ? f.device->total() : 0); }

// A size field: a whole number of bytes >= min_bytes, or text parse_size
// reads ("512MiB", "1.5G", "40%"); the text is checked here and resolved
// against the engine's footprint on the scheduler thread.
struct SizeArg {
  std::optional<uint64_t> bytes;
  std::string text;
  uint64_t resolve(uint64_t percent_of) const { return bytes ? *bytes : parse_size(text, percent_of); }
};

SizeArg size_arg(const json& v, const char* field, uint64_t min_bytes) {
  SizeArg a;
  const std::string f = field;
  if (v.is_number_unsigned() || v.is_number_integer()) {
    if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)
      throw ApiException(invalid_request("'" + f + "' must not be negative", f));
    a.bytes = v.get<uint64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < 0 || d != std::floor(d) || d > 1.8e19)
      throw ApiException(invalid_request("'" + f + "' must be a whole number of bytes (or a string such as \"512MiB\")", f));
    a.bytes = static_cast<uint64_t>(d);
  } else if (v.is_string()) {
    a.text = v.get<std::string>();
    try {
      (void)parse_size(a.text, 100);
    } catch (const Error& e) {
      throw ApiException(invalid_request("'" + f + "': " + e.what(), f));
    }
  } else {
    throw ApiException(invalid_request("'" + f + "' must be a number of bytes or a string such as \"512MiB\"", f));
  }
  if (a.bytes && *a.bytes < min_bytes)
    throw ApiException(invalid_request("'" + f + "' must be at least " + std::to_string(min_bytes), f));
  return a;
}

json object_body(const httplib::Request& req) {
  if (req.body.empty()) return json::object();
  json b = parse_body(req);
  if (!b.is_object()) throw ApiException(invalid_request("the request body must be a JSON object", ""));
  return b;
}

// What one call on the scheduler thread reads for GET /v1/memory.
struct MemoryRead {
  Footprint f;
  bool elastic = false;
  ElasticFootprint ef;
  std::optional<ResidencyMap> map;  // none while a restore runs (its workers change the states)
  uint64_t limit = 0;
  uint64_t device_held = 0;  // on a device: what its memory limit counts (DeviceForward::held)
  bool streaming = false, restore_pending = false, restoring = false;
};

}  // namespace

struct Server::Impl::MemoryState {
  static constexpr double kIntervalS = 1.0;
  static constexpr size_t kCapacity = 600;  // ten minutes at one a second

  Scheduler& sched;
  mutable std::mutex mu;
  std::deque<MemorySample> history;
  std::map<std::string, int64_t> evictions;  // by route: evict, trim, limit
  uint64_t evicted_bytes = 0, restored_bytes = 0;
  int64_t restores = 0;
  std::map<int, int64_t> trims;   // by level
  uint64_t limit = 0;             // as last read from the engine
  bool elastic = false, known = false;
  ResidencyMap last_map;          // shown while a restore runs
  // Last: stopped and joined before the rest goes.
  std::jthread sampler;

  explicit MemoryState(Scheduler& s) : sched(s) {
    sampler = std::jthread([this](std::stop_token st) { run(st); });
  }

  void note_engine(bool el, uint64_t lim) {
    std::lock_guard lock(mu);
    elastic = el;
    limit = lim;
    known = true;
  }

  void run(std::stop_token st) {
    // The limit and whether elastic memory is on, once (the routes keep
    // them current): read on the scheduler thread like everything else.
    try {
      auto f = sched.call([](Engine& e) {
        return std::pair<bool, uint64_t>(e.elastic() != nullptr || e.device() != nullptr, e.memory_limit());
      });
      while (!st.stop_requested() && f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      }
      if (!st.stop_requested()) {
        const auto [el, lim] = f.get();
        note_engine(el, lim);
      }
    } catch (const std::exception&) {
      // The scheduler has ended: nothing to read.
    }
    std::mutex wait_mu;
    std::condition_variable_any cv;
    std::optional<MemorySample> prev;
    while (!st.stop_requested()) {
      const MemorySample s = take(prev);
      {
        std::lock_guard lock(mu);
        history.push_back(s);
        if (history.size() > kCapacity) history.pop_front();
      }
      prev = s;
      std::unique_lock lock(wait_mu);
      cv.wait_for(lock, st, std::chrono::duration<double>(kIntervalS), [] { return false; });
    }
  }

  MemorySample take(const std::optional<MemorySample>& prev) const {
    const SchedulerMetrics m = sched.metrics();
    const Footprint& f = m.footprint;
    MemorySample s;
    s.t = unix_now();
    s.weights = f.weights();
    s.globals = f.globals;
    s.kv = f.kv();
    s.compressed = f.compressed;
    s.other = f.scratch + f.kv_spare + f.io_buffers + f.adapters + f.training;
    s.kv_stored = f.kv_stored;
    s.weights_stored = f.weights_stored;
    s.total = f.total();
    s.decode_tok_s = m.decode_tok_s;
    s.fg_waiting = m.fg_waiting;
    s.fg_running = m.fg_running;
    s.bg_waiting = m.bg_waiting;
    s.generated_tokens = m.generated_tokens;
    s.requests_completed = m.fg_completed;
    if (prev && s.t > prev->t)
      s.tok_s = static_cast<double>(s.generated_tokens - prev->generated_tokens) / (s.t - prev->t);
    return s;
  }

  void evicted(const char* route, const EvictReport& r) {
    std::lock_guard lock(mu);
    ++evictions[route];
    evicted_bytes += r.freed;
  }

  json counters() const {
    std::lock_guard lock(mu);
    int64_t n = 0;
    for (const auto& [route, k] : evictions) n += k;
    json by_route = json::object();
    for (const auto& [route, k] : evictions) by_route[route] = k;
    json t = json::object();
    for (const TrimLevel& l : kTrimLevels) {
      auto it = trims.find(l.level);
      t[l.name] = it == trims.end() ? 0 : it->second;
    }
    return {{"evictions", n},         {"evictions_by_route", by_route}, {"evicted_bytes", evicted_bytes},
            {"restores", restores},   {"restored_bytes", restored_bytes}, {"trims", t}};
  }
};

namespace {

std::string memory_json(const MemoryRead& r, const json& counters, bool map_stale) {
  const Footprint& f = r.f;
  json j = {{"object", "memory"},
            {"elastic", r.elastic},
            {"memory_limit", r.limit},
            {"streaming", r.streaming},
            {"restore_pending", r.restore_pending},
            {"restoring", r.restoring},
            {"footprint", footprint_json(f)},
            // In RAM as it is (weights, globals, KV), compressed (in RAM),
            // working memory (scratch, spare KV buffers, I/O buffers,
            // adapters, training),
            // and on storage (not in RAM, not in the total).
            {"by_state",
             {{"resident", f.weights() + f.globals + f.kv() + f.kv_parked},
              {"compressed", f.compressed},
              {"working", f.scratch + f.kv_spare + f.io_buffers + f.adapters + f.training},
              {"stored", f.kv_stored + f.weights_stored}}},
            {"counters", counters}};
  if (r.elastic && !f.device) j["elastic_footprint"] = elastic_footprint_json(r.ef);
  // The compute device's memory, apart from the host's above ("cpu": none).
  if (f.device) {
    const DeviceFootprint& d = *f.device;
    j["device"] = {{"id", d.id},
                   {"name", d.name},
                   {"weights", d.weights()},
                   {"weights_dropped", d.weights_dropped},  // evicted layers' device bytes (not held)
                   {"globals", d.globals},
                   {"kv", d.kv},
                   {"kv_parked", d.kv_parked},  // host bytes: evicted from the device, back at the session's next step
                   {"adapters", d.adapters},
                   {"scratch", d.scratch},
                   {"total", d.total()},
                   // What the memory limit counts: the device's buffers and the
                   // host's part (a split's layers and KV, parked KV, staging).
                   {"held", r.device_held},
                   {"ledger",
                    {{"slab_bytes", d.ledger.slab_bytes},
                     {"buffer_bytes", d.ledger.buffer_bytes},
                     {"n_slabs", d.ledger.n_slabs},
                     {"n_buffers", d.ledger.n_buffers}}}};
  } else {
    j["device"] = {{"id", "cpu"}};
  }
  json states = json::object();
  for (UnitState s : {UnitState::kResident, UnitState::kCompressed, UnitState::kStored, UnitState::kStoredCompressed,
                      UnitState::kLost})
    states[std::string(1, unit_state_char(s))] = std::string(unit_state_name(s));
  j["states"] = states;
  json layers = json::array();
  const ResidencyMap* map = r.map ? &*r.map : nullptr;
  for (size_t l = 0; l < f.weights_per_layer.size(); ++l) {
    json L = {{"layer", l},
              {"weights_bytes", f.weights_per_layer[l]},
              {"kv_bytes", l < f.kv_per_layer.size() ? f.kv_per_layer[l] : 0}};
    if (f.device && l < f.device->weights_per_layer.size()) L["device_weights_bytes"] = f.device->weights_per_layer[l];
    if (map && l < map->weights.size()) {
      L["weights"] = std::string(unit_state_name(map->weights[l]));
      L["weights_char"] = std::string(1, unit_state_char(map->weights[l]));
      std::string kv;
      if (l < map->kv.size())
        for (UnitState s : map->kv[l]) kv += unit_state_char(s);
      L["kv"] = kv;  // one char per chunk, in the order of `states`
    }
    layers.push_back(std::move(L));
  }
  j["layers"] = std::move(layers);
  // A restore was running at the step boundary: the map is the last one
  // read before it (its workers change the states as they go).
  j["residency_stale"] = map_stale;
  if (map) j["grid"] = map->grid();
  return dump(j);
}

}  // namespace

void Server::Impl::memory_routes() {
  memory_state = std::make_shared<MemoryState>(sched);
  MemoryState& ms = *memory_state;

  http.Get("/v1/memory", guarded([this, &ms](const httplib::Request&, httplib::Response& res) {
             MemoryRead r = on_engine(sched, [](Engine& e) {
               MemoryRead r;
               r.f = e.footprint();
               if (DeviceForward* d = e.device()) {
                 r.elastic = true;  // evict, restore and limit work on the device
                 r.limit = d->memory_limit();
                 r.device_held = d->held();
                 r.streaming = d->n_streamed_last_step() > 0;
               }
               if (ElasticMemory* em = e.elastic()) {
                 r.elastic = true;
                 r.ef = em->footprint();
                 r.limit = em->memory_limit();
                 r.streaming = em->streaming();
                 r.restore_pending = em->restore_pending();
                 r.restoring = em->restoring();
                 if (!r.restoring) r.map = em->residency();
               }
               return r;
             });
             bool stale = false;
             {
               std::lock_guard lock(ms.mu);
               ms.elastic = r.elastic;
               ms.limit = r.limit;
               ms.known = true;
               if (r.map) {
                 ms.last_map = *r.map;
               } else if (r.elastic && !r.f.device) {
                 r.map = ms.last_map;
                 stale = true;
               }
             }
             res.set_content(memory_json(r, ms.counters(), stale), kJson);
           }));

  http.Get("/v1/memory/history", guarded([&ms](const httplib::Request& req, httplib::Response& res) {
             double since = -1;
             if (req.has_param("since")) {
               const std::string v = req.get_param_value("since");
               char* end = nullptr;
               since = std::strtod(v.c_str(), &end);
               if (v.empty() || *end != '\0' || !std::isfinite(since))
                 throw ApiException(invalid_request("'since' must be a unix time in seconds", "since"));
             }
             json samples = json::array();
             {
               std::lock_guard lock(ms.mu);
               for (const MemorySample& s : ms.history)
                 if (s.t > since) samples.push_back(sample_json(s));
             }
             res.set_content(dump(json{{"object", "memory.history"},
                                       {"interval_s", MemoryState::kIntervalS},
                                       {"capacity", MemoryState::kCapacity},
                                       {"samples", samples}}),
                             kJson);
           }));

  http.Post("/v1/memory/evict", guarded([this, &ms](const httplib::Request& req, httplib::Response& res) {
              const json b = object_body(req);
              const bool has_bytes = b.contains("bytes"), has_fraction = b.contains("fraction");
              if (has_bytes == has_fraction)
                throw ApiException(invalid_request(
                    has_bytes ? "give 'bytes' or 'fraction', not both"
                              : "'bytes' (a number of bytes, or a size such as \"200MiB\" or \"25%\" of the footprint "
                                "total) or 'fraction' (of the footprint total, in (0, 1]) is required",
                    "bytes"));
              SizeArg size;
              double fraction = 0;
              if (has_bytes) {
                size = size_arg(b["bytes"], "bytes", 1);
              } else {
                const json& v = b["fraction"];
                if (!v.is_number() || !(v.get<double>() > 0 && v.get<double>() <= 1))
                  throw ApiException(invalid_request("'fraction' must be a number in (0, 1] (of the footprint total)",
                                                     "fraction"));
                fraction = v.get<double>();
              }
              json out = on_engine(sched, [size, fraction, has_bytes](Engine& e) {
                elastic_or_throw(e);
                const uint64_t before = footprint_total(e.footprint());
                const uint64_t bytes =
                    has_bytes ? size.resolve(before) : static_cast<uint64_t>(std::llround(fraction * before));
                const EvictReport r = e.evict(std::max<uint64_t>(bytes, 1));
                json j = evict_json(r);
                j["object"] = "memory.evict";
                j["footprint_before"] = before;
                j["footprint_after"] = footprint_total(e.footprint());
                return j;
              });
              EvictReport r;
              r.freed = out["freed"].get<uint64_t>();
              ms.evicted("evict", r);
              res.set_content(dump(out), kJson);
            }));

  http.Post("/v1/memory/restore", guarded([this, &ms](const httplib::Request& req, httplib::Response& res) {
              (void)object_body(req);
              json out = on_engine(sched, [](Engine& e) {
                elastic_or_throw(e);
                const Footprint before = e.footprint();
                json j;
                const bool device_evicted =
                    before.device && (before.device->weights_dropped > 0 || before.device->kv_parked > 0);
                if (before.weights_stored == 0 && before.kv_stored == 0 && before.compressed == 0 && !device_evicted &&
                    !(e.elastic() && e.elastic()->restoring())) {
                  j = restore_json(RestoreReport{});
                  j["note"] = "nothing is evicted: every weight layer and KV chunk is in RAM";
                } else {
                  j = restore_json(e.restore());
                  j["note"] = "";
                }
                const Footprint after = e.footprint();
                // Host weights and KV, and on a device its layers and KV.
                auto held = [](const Footprint& f) {
                  return f.weights() + f.kv() + (f.device ? f.device->weights() + f.device->kv : 0);
                };
                const uint64_t was = held(before), now = held(after);
                j["object"] = "memory.restore";
                j["restored_bytes"] = now > was ? now - was : 0;
                j["footprint_before"] = before.total();
                j["footprint_after"] = after.total();
                return j;
              });
              {
                std::lock_guard lock(ms.mu);
                ++ms.restores;
                ms.restored_bytes += out["restored_bytes"].get<uint64_t>();
              }
              res.set_content(dump(out), kJson);
            }));

  http.Post("/v1/memory/limit", guarded([this, &ms](const httplib::Request& req, httplib::Response& res) {
              const json b = object_body(req);
              if (!b.contains("bytes"))
                throw ApiException(invalid_request(
                    "'bytes' is required: the bytes of weights, KV and compressed KV allowed in RAM (a number, a "
                    "size such as \"512MiB\" or \"40%\" of weights and KV, or 0 or \"off\" for no limit)",
                    "bytes"));
              SizeArg size;
              if (b["bytes"].is_string() && b["bytes"].get<std::string>() == "off") {
                size.bytes = 0;
              } else {
                size = size_arg(b["bytes"], "bytes", 0);
              }
              json out = on_engine(sched, [size](Engine& e) {
                elastic_or_throw(e);
                const Footprint f = e.footprint();
                // A percentage is of weights and KV (on a device: its layers, dropped or not, and KV too).
                const uint64_t of = f.weights() + f.weights_stored + f.kv() +
                                    (f.device ? f.device->weights() + f.device->weights_dropped + f.device->kv +
                                                    f.device->kv_parked
                                              : 0);
                uint64_t bytes = 0;
                try {
                  bytes = size.resolve(of);
                } catch (const Error& x) {
                  throw ApiException(invalid_request(std::string("'bytes': ") + x.what(), "bytes"));
                }
                if (bytes == 0 && !size.bytes)
                  throw ApiException(invalid_request("'bytes' comes to 0 bytes; give 0 or \"off\" to remove the limit",
                                                     "bytes"));
                EvictReport r;
                try {
                  r = e.set_memory_limit(bytes);
                } catch (const Error& x) {  // a limit no step could run under (a device), naming the sizes
                  throw ApiException(invalid_request(x.what(), "bytes"));
                }
                return json{{"object", "memory.limit"},
                            {"memory_limit", e.memory_limit()},
                            {"evict", evict_json(r)},
                            {"footprint_before", footprint_total(f)},
                            {"footprint_after", footprint_total(e.footprint())}};
              });
              {
                std::lock_guard lock(ms.mu);
                ms.limit = out["memory_limit"].get<uint64_t>();
                ms.elastic = ms.known = true;
              }
              EvictReport r;
              r.freed = out["evict"]["freed"].get<uint64_t>();
              if (r.freed > 0) ms.evicted("limit", r);
              res.set_content(dump(out), kJson);
            }));

  http.Post("/v1/memory/trim", guarded([this, &ms](const httplib::Request& req, httplib::Response& res) {
              const json b = object_body(req);
              if (!b.contains("level"))
                throw ApiException(invalid_request("'level' is required: one of " + trim_levels_list(), "level"));
              const json& v = b["level"];
              const TrimLevel* level = nullptr;
              for (const TrimLevel& t : kTrimLevels) {
                if (v.is_number_integer() && v.get<int64_t>() == t.level) level = &t;
                if (v.is_string()) {
                  std::string s = v.get<std::string>();
                  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                  if (s.rfind("trim_memory_", 0) == 0) s.erase(0, 12);
                  if (s == t.name) level = &t;
                }
              }
              if (!level)
                throw ApiException(invalid_request(
                    "'level' " + dump(v) + " is not an onTrimMemory level: one of " + trim_levels_list(), "level"));
              const TrimLevel t = *level;
              json out = on_engine(sched, [t](Engine& e) {
                elastic_or_throw(e);
                const uint64_t before = footprint_total(e.footprint());
                const uint64_t bytes = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(t.fraction * before)));
                const EvictReport r = e.evict(bytes);
                return json{{"object", "memory.trim"},
                            {"level", t.level},
                            {"name", t.name},
                            {"fraction", t.fraction},
                            {"bytes", bytes},
                            {"evict", evict_json(r)},
                            {"footprint_before", before},
                            {"footprint_after", footprint_total(e.footprint())}};
              });
              EvictReport r;
              r.freed = out["evict"]["freed"].get<uint64_t>();
              ms.evicted("trim", r);
              {
                std::lock_guard lock(ms.mu);
                ++ms.trims[t.level];
              }
              res.set_content(dump(out), kJson);
            }));
}

void Server::Impl::memory_metrics(std::string& o) const {
  if (!memory_state) return;
  const MemoryState& ms = *memory_state;
  std::lock_guard lock(ms.mu);
  metric(o, "ebb_memory_evictions_total", "counter", "Evictions asked for over HTTP, by route (evict, trim, limit)");
  for (const char* route : {"evict", "trim", "limit"}) {
    auto it = ms.evictions.find(route);
    sample(o, "ebb_memory_evictions_total" + label("route", route),
           static_cast<double>(it == ms.evictions.end() ? 0 : it->second));
  }
  metric(o, "ebb_memory_evicted_bytes_total", "counter", "Bytes given back by evictions asked for over HTTP");
  sample(o, "ebb_memory_evicted_bytes_total", static_cast<double>(ms.evicted_bytes));
  metric(o, "ebb_memory_restores_total", "counter", "Restores asked for over HTTP (POST /v1/memory/restore)");
  sample(o, "ebb_memory_restores_total", static_cast<double>(ms.restores));
  metric(o, "ebb_memory_restored_bytes_total", "counter", "Bytes of weights and KV those restores brought back");
  sample(o, "ebb_memory_restored_bytes_total", static_cast<double>(ms.restored_bytes));
  metric(o, "ebb_memory_trim_total", "counter", "POST /v1/memory/trim calls by onTrimMemory level");
  for (const TrimLevel& t : kTrimLevels) {
    auto it = ms.trims.find(t.level);
    sample(o, "ebb_memory_trim_total" + label("level", t.name),
           static_cast<double>(it == ms.trims.end() ? 0 : it->second));
  }
  metric(o, "ebb_memory_limit_bytes", "gauge", "Bytes of weights, KV and compressed KV allowed in RAM (0: no limit)");
  sample(o, "ebb_memory_limit_bytes", static_cast<double>(ms.limit));
  metric(o, "ebb_memory_elastic", "gauge", "1 when elastic memory (evict, restore, limit) is on");
  sample(o, "ebb_memory_elastic", ms.elastic ? 1 : 0);
}

}  // namespace ebb::serve
