// The engine's LoRA adapters (DESIGN.md "Adapters"; LOCAL §2.2, §5.1): each
// adapter is a name with immutable versions. A version holds the adapter's
// tensors and the digest of its bytes, so a reload of changed bytes under
// the same name is a new version and never reuses the old version's KV.
//
//   load/add ─► a new version, published (the default) or staged
//   staged   ─► used only by sessions that ask for it by version number
//   publish  ─► becomes the default atomically; turns already running keep
//               the version they started with (they hold it)
//   unload   ─► no new turn can bind it; the tensors go when the last turn
//               that holds them ends
//   evict    ─► (evict_unused) the tensors of versions no session or turn
//               holds are dropped when the version was read from a file; the
//               version stays (name, number, digest, published), and the
//               next resolve() that pins it re-reads the file, checking that
//               its digest is still the version's (a changed file is an
//               error, never other weights under the same version). Versions
//               made in memory (training's, add()) have no file to come back
//               from and stay resident: they are small beside KV, and the
//               trainer writes its own checkpoints.
//
// A session binds an adapter set (names, scales, optional versions) and
// resolves it at the start of each turn to pinned versions (AdapterSet);
// the prefix cache keys KV by exactly those versions and scales.
//
// Thread-safe: the server and the trainer may load, stage and publish
// while sessions resolve.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "memory/prefix_cache.h"
#include "model/lora.h"

namespace ebb {

struct AdapterVersion {
  std::string name;
  uint64_t version = 0;
  std::shared_ptr<const LoraAdapter> lora;
};

// What a session asks for. version 0: the published version.
struct AdapterBinding {
  std::string name;
  float scale = 1.0f;
  uint64_t version = 0;
};

// One resolved adapter of a step: a pinned version and its user scale.
struct ActiveAdapter {
  std::shared_ptr<const AdapterVersion> v;
  float scale = 1.0f;
};
// Sorted by name; empty: the base model alone.
using AdapterSet = std::vector<ActiveAdapter>;

// The prefix-cache key part of a resolved set.
std::vector<AdapterKey> adapter_keys(const AdapterSet& set);
// A process-independent identity of keys (names, digests, scales; not the
// version numbers, which each process counts anew); 0 for none.
uint64_t adapter_identity(const std::vector<AdapterKey>& keys);

// The name an adapter file gets by default: its file (or directory) name
// without ".gguf".
std::string adapter_name_of(const std::string& path);

// Throws ebb::Error when `name` cannot name an adapter (1 to 128 of
// letters, digits, '-', '_', '.').
void check_adapter_name(const std::string& name);

struct AdapterInfo {
  std::string name;
  uint64_t version = 0;
  uint64_t digest = 0;
  bool published = false;  // the default version of its name
  std::string source;
  std::string format;
  std::string targets;  // "q k v o gate up down"
  int64_t rank = 0;     // largest rank of its pairs
  float alpha = 0;
  uint64_t bytes = 0;   // in memory now (0 while evicted)
  long users = 0;       // turns and sessions holding this version now
  bool evicted = false;  // its tensors were dropped; resolve() re-reads them
};

struct AdapterEvictReport {
  uint64_t bytes = 0;    // adapter tensor bytes freed
  int64_t versions = 0;  // versions whose tensors were dropped
};

class AdapterRegistry {
 public:
  AdapterRegistry(const ModelConfig& config, Allocator& alloc) : config_(config), alloc_(alloc) {}
  AdapterRegistry(const AdapterRegistry&) = delete;
  AdapterRegistry& operator=(const AdapterRegistry&) = delete;

  // Reads an adapter file or PEFT directory (load_lora) as a new version of
  // `name` ("" : the file's stem) and returns that version. A file whose
  // digest equals an existing version of the name returns that version.
  // publish: it becomes the default now; else it is staged.
  // Throws ebb::Error naming the file and what is wrong.
  AdapterInfo load(const std::string& path, std::string name = "", bool publish = true);
  // Reads a file as version `version` of `name` (a server restoring the
  // versions it made before a restart, under their numbers; later versions
  // of the name count on from the highest). publish, or the name's first
  // version: it becomes the default. Throws ebb::Error naming the file, or
  // when that version exists.
  AdapterInfo load_version(const std::string& path, const std::string& name, uint64_t version, bool publish);
  // Adds tensors made in memory (a training commit) as a new version.
  AdapterInfo add(const std::string& name, std::unique_ptr<LoraAdapter> lora, bool publish);
  // Makes a staged version the default. Throws when it does not exist.
  void publish(const std::string& name, uint64_t version);
  // Removes a name (every version) or one staged version; turns holding a
  // version finish on it. Throws when it does not exist, or when the
  // version is the published one while others remain (publish another first).
  void unload(const std::string& name, uint64_t version = 0);

  // Pins the versions a binding asks for, restoring evicted ones (their
  // files are re-read, under the registry's lock). Throws ebb::Error naming
  // an unknown adapter or version, or an evicted version whose file is gone
  // or changed since it was loaded.
  AdapterSet resolve(std::span<const AdapterBinding> bindings) const;

  // Drops the tensors of file-backed versions nobody holds, largest first,
  // until at least `bytes` are freed or none is left (bytes 0: none).
  AdapterEvictReport evict_unused(uint64_t bytes);
  // Tensor bytes of the evicted versions (what restoring them would read).
  uint64_t evicted_bytes() const;

  std::vector<AdapterInfo> list() const;
  bool empty() const;

  // Called after unload() or evict_unused() dropped a version, outside the
  // registry's lock (an engine on a device frees its copies of versions
  // nobody holds any more). Set once, before the registry is shared.
  void set_on_drop(std::function<void()> f) { on_drop_ = std::move(f); }

 private:
  // One version: its tensors (v), or while evicted only what it was.
  struct Slot {
    std::shared_ptr<const AdapterVersion> v;  // null while evicted
    bool from_file = false;                   // load(): can be evicted and re-read
    AdapterInfo was;                          // while evicted: its info (source, digest, bytes it had)
  };
  struct Entry {
    std::map<uint64_t, Slot> versions;
    uint64_t published = 0;
    uint64_t next = 1;
  };
  void unload_locked(const std::string& name, uint64_t version);
  AdapterEvictReport evict_unused_locked(uint64_t bytes);
  AdapterInfo add_locked(const std::string& name, std::unique_ptr<LoraAdapter> lora, bool publish, bool from_file);
  static AdapterInfo info(const AdapterVersion& v, bool published, long users);
  static AdapterInfo info(const Slot& s, bool published);
  // Re-reads an evicted slot's file (checking its digest) into s.v.
  void restore_locked(Slot& s) const;

  const ModelConfig& config_;
  Allocator& alloc_;
  mutable std::mutex mu_;
  // mutable: resolve() (const: it changes no version) restores tensors.
  mutable std::map<std::string, Entry> entries_;
  std::function<void()> on_drop_;
};

}  // namespace ebb
