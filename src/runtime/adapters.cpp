#include "runtime/adapters.h"

#include <algorithm>
#include <cstdio>

#include "platform/error.h"
#include "platform/hash.h"

namespace ebb {

std::vector<AdapterKey> adapter_keys(const AdapterSet& set) {
  std::vector<AdapterKey> keys;
  keys.reserve(set.size());
  for (const ActiveAdapter& a : set) keys.push_back({a.v->name, a.v->version, a.v->lora->digest, a.scale});
  return keys;
}

uint64_t adapter_identity(const std::vector<AdapterKey>& keys) {
  if (keys.empty()) return 0;
  uint64_t h = kFnv1a64Offset;
  for (const AdapterKey& k : keys) {
    h = fnv1a64(k.name.data(), k.name.size() + 1, h);  // with the terminating NUL
    h = fnv1a64(&k.digest, sizeof k.digest, h);
    h = fnv1a64(&k.scale, sizeof k.scale, h);
  }
  return h == 0 ? 1 : h;
}

std::string adapter_name_of(const std::string& path) {
  std::string s = path;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const size_t slash = s.rfind('/');
  if (slash != std::string::npos) s = s.substr(slash + 1);
  if (s.size() > 5 && s.compare(s.size() - 5, 5, ".gguf") == 0) s.resize(s.size() - 5);
  return s;
}

void check_adapter_name(const std::string& name) {
  if (name.empty() || name.size() > 128) throw Error("adapter name '" + name + "' must have 1 to 128 characters");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.';
    if (!ok) {
      throw Error("adapter name '" + name + "' may hold only letters, digits, '-', '_' and '.' (it names KV in "
                  "the prefix cache and models in the server)");
    }
  }
}

AdapterInfo AdapterRegistry::info(const AdapterVersion& v, bool published, long users) {
  AdapterInfo i;
  i.name = v.name;
  i.version = v.version;
  i.digest = v.lora->digest;
  i.published = published;
  i.source = v.lora->source;
  i.format = v.lora->format;
  i.targets = v.lora->targets_summary();
  i.rank = v.lora->max_rank();
  i.alpha = v.lora->alpha;
  i.bytes = v.lora->bytes();
  i.users = users;
  return i;
}

AdapterInfo AdapterRegistry::info(const Slot& s, bool published) {
  if (s.v) return info(*s.v, published, s.v.use_count() - 1);
  AdapterInfo i = s.was;
  i.published = published;
  i.bytes = 0;
  i.users = 0;
  i.evicted = true;
  return i;
}

void AdapterRegistry::restore_locked(Slot& s) const {
  const AdapterInfo& w = s.was;
  std::unique_ptr<LoraAdapter> lora;
  try {
    lora = load_lora(w.source, config_, alloc_);
  } catch (const Error& e) {
    throw Error("adapter '" + w.name + "' version " + std::to_string(w.version) +
                " was evicted and cannot be read back from '" + w.source + "': " + e.what());
  }
  if (lora->digest != w.digest) {
    char got[17], want[17];
    std::snprintf(want, sizeof want, "%016llx", static_cast<unsigned long long>(w.digest));
    std::snprintf(got, sizeof got, "%016llx", static_cast<unsigned long long>(lora->digest));
    throw Error("adapter '" + w.name + "' version " + std::to_string(w.version) + " was evicted and its file '" +
                w.source + "' has changed since it was loaded (digest " + got + ", the version's is " + want +
                "): load the file again to make it a new version");
  }
  auto v = std::make_shared<AdapterVersion>();
  v->name = w.name;
  v->version = w.version;
  v->lora = std::shared_ptr<const LoraAdapter>(std::move(lora));
  s.v = std::move(v);
}

AdapterInfo AdapterRegistry::load(const std::string& path, std::string name, bool publish) {
  if (name.empty()) name = adapter_name_of(path);
  check_adapter_name(name);
  // Read outside the lock: files may be large, and sessions resolve meanwhile.
  std::unique_ptr<LoraAdapter> lora = load_lora(path, config_, alloc_);
  std::lock_guard<std::mutex> lock(mu_);
  return add_locked(name, std::move(lora), publish, /*from_file=*/true);
}

AdapterInfo AdapterRegistry::load_version(const std::string& path, const std::string& name, uint64_t version,
                                          bool publish) {
  check_adapter_name(name);
  if (version == 0) throw Error("adapter '" + name + "': version 0 is not a version");
  std::unique_ptr<LoraAdapter> lora = load_lora(path, config_, alloc_);
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[name];
  if (e.versions.count(version))
    throw Error("adapter '" + name + "' has a version " + std::to_string(version) + " already ('" + path + "')");
  auto v = std::make_shared<AdapterVersion>();
  v->name = name;
  v->version = version;
  v->lora = std::shared_ptr<const LoraAdapter>(std::move(lora));
  e.versions.emplace(version, Slot{v, /*from_file=*/true, {}});
  e.next = std::max(e.next, version + 1);
  if (publish || e.published == 0) e.published = version;
  return info(*v, e.published == version, 0);
}

AdapterInfo AdapterRegistry::add(const std::string& name, std::unique_ptr<LoraAdapter> lora, bool publish) {
  check_adapter_name(name);
  EBB_CHECK(lora != nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  return add_locked(name, std::move(lora), publish, /*from_file=*/false);
}

AdapterInfo AdapterRegistry::add_locked(const std::string& name, std::unique_ptr<LoraAdapter> lora, bool publish,
                                        bool from_file) {
  Entry& e = entries_[name];
  for (auto& [ver, slot] : e.versions) {
    const uint64_t digest = slot.v ? slot.v->lora->digest : slot.was.digest;
    if (digest == lora->digest) {  // the same bytes: the same version
      if (publish) e.published = ver;
      if (!slot.v) {  // evicted: the bytes just read are its tensors
        auto v = std::make_shared<AdapterVersion>();
        v->name = name;
        v->version = ver;
        v->lora = std::shared_ptr<const LoraAdapter>(std::move(lora));
        slot.v = std::move(v);
      }
      return info(slot, e.published == ver);
    }
  }
  auto v = std::make_shared<AdapterVersion>();
  v->name = name;
  v->version = e.next++;
  v->lora = std::shared_ptr<const LoraAdapter>(std::move(lora));
  e.versions.emplace(v->version, Slot{v, from_file, {}});
  // The first version of a name is its default even when staged: a name
  // without a default could not be bound by name.
  if (publish || e.published == 0) e.published = v->version;
  return info(*v, e.published == v->version, 0);
}

void AdapterRegistry::publish(const std::string& name, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error("no adapter named '" + name + "' is loaded");
  if (!it->second.versions.count(version)) {
    throw Error("adapter '" + name + "' has no version " + std::to_string(version));
  }
  it->second.published = version;
}

void AdapterRegistry::unload(const std::string& name, uint64_t version) {
  unload_locked(name, version);  // throws when there is nothing to unload
  if (on_drop_) on_drop_();      // outside the lock: the listener may take its own
}

void AdapterRegistry::unload_locked(const std::string& name, uint64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error("no adapter named '" + name + "' is loaded");
  Entry& e = it->second;
  if (version == 0) {
    entries_.erase(it);
    return;
  }
  if (!e.versions.count(version)) throw Error("adapter '" + name + "' has no version " + std::to_string(version));
  if (e.versions.size() == 1) {
    entries_.erase(it);
    return;
  }
  if (e.published == version) {
    throw Error("version " + std::to_string(version) + " of adapter '" + name +
                "' is the published one: publish another version first, or unload the adapter");
  }
  e.versions.erase(version);
}

AdapterSet AdapterRegistry::resolve(std::span<const AdapterBinding> bindings) const {
  AdapterSet set;
  std::lock_guard<std::mutex> lock(mu_);
  for (const AdapterBinding& b : bindings) {
    auto it = entries_.find(b.name);
    if (it == entries_.end()) throw Error("no adapter named '" + b.name + "' is loaded");
    Entry& e = it->second;
    const uint64_t ver = b.version ? b.version : e.published;
    auto v = e.versions.find(ver);
    if (v == e.versions.end()) throw Error("adapter '" + b.name + "' has no version " + std::to_string(ver));
    if (!v->second.v) restore_locked(v->second);
    set.push_back({v->second.v, b.scale});
  }
  std::sort(set.begin(), set.end(), [](const ActiveAdapter& x, const ActiveAdapter& y) { return x.v->name < y.v->name; });
  for (size_t i = 1; i < set.size(); ++i) {
    if (set[i].v->name == set[i - 1].v->name) throw Error("adapter '" + set[i].v->name + "' is bound twice");
  }
  return set;
}

std::vector<AdapterInfo> AdapterRegistry::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AdapterInfo> out;
  for (const auto& [name, e] : entries_)
    for (const auto& [ver, slot] : e.versions) out.push_back(info(slot, e.published == ver));
  return out;
}

AdapterEvictReport AdapterRegistry::evict_unused(uint64_t bytes) {
  const AdapterEvictReport r = evict_unused_locked(bytes);
  if (r.versions > 0 && on_drop_) on_drop_();
  return r;
}

AdapterEvictReport AdapterRegistry::evict_unused_locked(uint64_t bytes) {
  AdapterEvictReport r;
  std::lock_guard<std::mutex> lock(mu_);
  // Candidates: file-backed, resident, held by the registry alone.
  std::vector<std::pair<uint64_t, Slot*>> idle;
  for (auto& [name, e] : entries_)
    for (auto& [ver, slot] : e.versions)
      if (slot.from_file && slot.v && slot.v.use_count() == 1) idle.push_back({slot.v->lora->bytes(), &slot});
  std::stable_sort(idle.begin(), idle.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  for (auto& [b, slot] : idle) {
    if (r.bytes >= bytes) break;
    slot->was = info(*slot->v, false, 0);
    slot->v.reset();  // the last reference: the tensors go back to the allocator
    r.bytes += b;
    ++r.versions;
  }
  return r;
}

uint64_t AdapterRegistry::evicted_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t b = 0;
  for (const auto& [name, e] : entries_)
    for (const auto& [ver, slot] : e.versions)
      if (!slot.v) b += slot.was.bytes;
  return b;
}

bool AdapterRegistry::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.empty();
}

}  // namespace ebb
