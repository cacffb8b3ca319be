// The chat's memory and adapter commands (/lora, /memory, /evict, /limit,
// /restore): see chat_commands.h.
#include "cli/chat_commands.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/options.h"
#include "platform/error.h"

namespace ebb::cli {

// /lora                   list the loaded adapters and what this chat binds
// /lora load FILE [NAME]  load an adapter (GGUF file or PEFT directory)
// /lora bind NAME [SCALE] apply it from the next turn on
// /lora unbind NAME | all
// /lora scale NAME SCALE
void lora_command(Engine& engine, Session& session, const std::string& arg) {
  std::vector<std::string> w;
  for (size_t i = 0; i < arg.size();) {
    const size_t b = arg.find_first_not_of(" \t", i);
    if (b == std::string::npos) break;
    const size_t e = arg.find_first_of(" \t", b);
    w.push_back(arg.substr(b, e == std::string::npos ? std::string::npos : e - b));
    i = e == std::string::npos ? arg.size() : e;
  }
  std::vector<AdapterBinding> binds = session.adapter_bindings();
  auto find = [&](const std::string& name) {
    return std::find_if(binds.begin(), binds.end(), [&](const AdapterBinding& b) { return b.name == name; });
  };
  auto scale_of = [](const std::string& v) {
    char* end = nullptr;
    const float s = std::strtof(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(s)) throw Error("'" + v + "' is not a scale (a number, e.g. 0.5)");
    return s;
  };
  const std::string usage = "usage: /lora, /lora load FILE [NAME], /lora bind NAME [SCALE], /lora unbind NAME|all, "
                            "/lora scale NAME SCALE";
  if (w.empty()) {
    const std::vector<AdapterInfo> list = engine.adapters().list();
    if (list.empty()) std::fprintf(stderr, "no adapters loaded (/lora load FILE, or --lora FILE)\n");
    for (const AdapterInfo& i : list) {
      auto b = find(i.name);
      const bool bound = b != binds.end() && (b->version == 0 ? i.published : b->version == i.version);
      std::fprintf(stderr, "%s %s v%llu%s: %s, rank %lld, %s, %s%s\n", bound ? "*" : " ", i.name.c_str(),
                   static_cast<unsigned long long>(i.version), i.published ? "" : " (staged)", i.targets.c_str(),
                   static_cast<long long>(i.rank), format_bytes(i.bytes).c_str(), i.source.c_str(),
                   bound ? (" | bound at scale " + std::to_string(b->scale)).c_str() : "");
    }
    return;
  }
  const std::string& op = w[0];
  if (op == "load" && (w.size() == 2 || w.size() == 3)) {
    const AdapterInfo i = engine.adapters().load(w[1], w.size() == 3 ? w[2] : "");
    std::fprintf(stderr, "loaded %s v%llu (%s, rank %lld, %s); /lora bind %s applies it\n", i.name.c_str(),
                 static_cast<unsigned long long>(i.version), i.targets.c_str(), static_cast<long long>(i.rank),
                 format_bytes(i.bytes).c_str(), i.name.c_str());
    return;
  }
  if (op == "bind" && (w.size() == 2 || w.size() == 3)) {
    const float s = w.size() == 3 ? scale_of(w[2]) : 1.0f;
    if (auto b = find(w[1]); b != binds.end()) {
      b->scale = s;
    } else {
      binds.push_back({w[1], s});
    }
  } else if (op == "unbind" && w.size() == 2) {
    if (w[1] == "all") {
      binds.clear();
    } else {
      auto b = find(w[1]);
      if (b == binds.end()) throw Error("'" + w[1] + "' is not bound (/lora lists what is)");
      binds.erase(b);
    }
  } else if (op == "scale" && w.size() == 3) {
    auto b = find(w[1]);
    if (b == binds.end()) throw Error("'" + w[1] + "' is not bound (/lora bind " + w[1] + " " + w[2] + " binds it)");
    b->scale = scale_of(w[2]);
  } else {
    throw Error(usage);
  }
  session.set_adapters(binds);  // throws for an adapter that is not loaded
  std::string set;
  for (const AdapterBinding& b : binds) set += (set.empty() ? "" : ", ") + b.name + " x" + std::to_string(b.scale);
  std::fprintf(stderr, "adapters: %s; the conversation's KV is recomputed under them at the next turn\n",
               set.empty() ? "none (the base model)" : set.c_str());
}

void memory_command(Engine& engine, const Session& session) {
  const MemoryView m = memory_view(engine);
  std::fprintf(stderr, "context %zu/%lld tokens | weights %s | kv %s | scratch %s | total %s\n",
               session.tokens().size(), static_cast<long long>(session.n_ctx()), format_bytes(m.weights).c_str(),
               format_bytes(m.kv).c_str(), format_bytes(m.scratch).c_str(), format_bytes(m.total).c_str());
  if (ElasticMemory* em = engine.elastic()) {
    const Footprint f = engine.footprint();
    std::fprintf(stderr, "in RAM: weights %s, kv %s, compressed %s | on storage: weights %s (the model file), kv %s\n",
                 format_bytes(f.weights()).c_str(), format_bytes(f.kv()).c_str(), format_bytes(f.compressed).c_str(),
                 format_bytes(f.weights_stored).c_str(), format_bytes(f.kv_stored).c_str());
    std::fprintf(stderr, "layer W |KV chunks|   W resident, . dropped;  # resident, c compressed, s stored, z stored compressed\n%s",
                 em->residency().grid().c_str());
  }
}

// `/evict 50%` or `/evict 200MiB`: percent of what can be evicted (layer
// weights and KV in RAM).
void evict_command(Engine& engine, const std::string& arg) {
  const Footprint f = engine.footprint();
  const uint64_t evictable = f.weights() + f.kv();
  const uint64_t bytes = parse_size(arg, evictable);
  const EvictReport r = engine.evict(bytes);
  std::fprintf(stderr,
               "evicted %s of %s asked in %.1f ms (stage %s): %lld KV chunks compressed, %lld to storage, "
               "%lld weight layers dropped, %lld compressed chunks to storage; in RAM now %s\n",
               format_bytes(r.freed).c_str(), format_bytes(bytes).c_str(), r.seconds * 1e3,
               std::string(evict_stage_name(r.last_stage)).c_str(), static_cast<long long>(r.kv_to_compressed),
               static_cast<long long>(r.kv_to_storage), static_cast<long long>(r.weights_dropped),
               static_cast<long long>(r.compressed_to_storage), format_bytes(r.after.in_ram()).c_str());
  if (!r.note.empty()) std::fprintf(stderr, "note: %s\n", r.note.c_str());
}

void limit_command(Engine& engine, const std::string& arg) {
  const Footprint f = engine.footprint();
  uint64_t of = f.weights() + f.weights_stored + f.kv();  // a percentage: of weights and KV
  if (f.device) of += f.device->weights() + f.device->weights_dropped + f.device->kv + f.device->kv_parked;
  const uint64_t bytes = arg == "off" ? 0 : parse_size(arg, of);
  const EvictReport r = engine.set_memory_limit(bytes);
  if (bytes == 0) {
    std::fprintf(stderr, "no memory limit: the next answer restores everything\n");
  } else if (f.device) {
    std::fprintf(stderr,
                 "memory limit %s on %s and the host together: gave back %s now (%lld device layers); answers "
                 "restore the layers that fit and stream the rest\n",
                 format_bytes(bytes).c_str(), f.device->id.c_str(), format_bytes(r.freed).c_str(),
                 static_cast<long long>(r.weights_dropped));
  } else {
    std::fprintf(stderr, "memory limit %s: gave back %s now; answers stream the weight layers that do not fit\n",
                 format_bytes(bytes).c_str(), format_bytes(r.freed).c_str());
  }
}

void restore_command(Engine& engine) {
  if (!engine.elastic() && !engine.device())
    throw Error("elastic memory is off (budget mode); there is nothing to restore");
  const Footprint f = engine.footprint();
  const bool device_evicted = f.device && (f.device->weights_dropped > 0 || f.device->kv_parked > 0);
  if (f.weights_stored == 0 && f.kv_stored == 0 && f.compressed == 0 && !device_evicted) {
    std::fprintf(stderr, "nothing is evicted: every weight layer and KV chunk is in RAM\n");
    return;
  }
  const RestoreReport r = engine.restore();
  std::fprintf(stderr, "restored in %.1f ms: %lld weight layers, %lld chunks read, %lld decompressed, %s from storage\n",
               r.seconds * 1e3, static_cast<long long>(r.weights_loaded), static_cast<long long>(r.chunks_read),
               static_cast<long long>(r.chunks_decompressed), format_bytes(r.bytes_read).c_str());
  if (r.chunks_lost > 0)
    std::fprintf(stderr, "%lld KV chunks failed their checksum; they are recomputed on the next turn\n",
                 static_cast<long long>(r.chunks_lost));
}

}  // namespace ebb::cli
