#include "memory/prefix_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "memory/cache_store.h"
#include "memory/kv_cache.h"
#include "platform/error.h"
#include "platform/hash.h"

namespace ebb {

struct PrefixCache::Node {
  Root* root = nullptr;
  Node* parent = nullptr;
  std::vector<int32_t> tokens;     // [chunk_size] the chunk's token ids
  uint64_t token_hash = 0;
  std::vector<KvChunkHandle> kv;   // [n_layer]; empty for a root's sentinel
  std::vector<std::unique_ptr<Node>> children;
  int64_t depth_tokens = 0;        // prefix length at this node's end
  uint64_t id = 0;                 // key hash chained over every token to the end (CacheStore)
  double heat = 0;                 // H_P as of access `last`
  uint64_t last = 0;
};

struct PrefixCache::Root {
  CacheKey key;
  Node node;  // sentinel: the empty prefix
};

uint64_t CacheKey::hash() const {
  uint64_t h = fnv1a64(ns.data(), ns.size());
  for (const AdapterKey& a : adapters) {
    h = fnv1a64(a.name.data(), a.name.size(), h);
    h = fnv1a64(&a.version, sizeof(a.version), h);
    h = fnv1a64(&a.digest, sizeof(a.digest), h);
    h = fnv1a64(&a.scale, sizeof(a.scale), h);
  }
  h = fnv1a64(&chunk_size, sizeof(chunk_size), h);
  h = fnv1a64(&kv_type, sizeof(kv_type), h);
  return fnv1a64(&f16_accumulator, sizeof(f16_accumulator), h);
}

std::string CacheKey::adapter_state() const {
  if (adapters.empty()) return "base";
  std::string s;
  for (const AdapterKey& a : adapters)
    s += a.name + "@" + std::to_string(a.version) + ":" + std::to_string(a.digest) + "*" + std::to_string(a.scale) + ";";
  return s;
}

PrefixCache::PrefixCache(int64_t n_layer, PrefixCacheOptions opts, CacheStore* store, KvPool* pool)
    : n_layer_(n_layer), opts_(opts), store_(store), pool_(pool) {
  EBB_CHECK(!store_ || pool_);
  if (!(opts_.lambda > 0 && opts_.lambda < 1)) throw Error("prefix cache heat decay must lie in (0, 1)");
  if (opts_.l_max < 1) throw Error("prefix cache length cap must be at least 1 token");
}

PrefixCache::~PrefixCache() = default;

double PrefixCache::decay(double h, uint64_t last) const {
  return h * std::pow(opts_.lambda, static_cast<double>(clock_ - last));
}

double PrefixCache::adapter_heat(const std::string& state, bool touch) {
  AdapterHeat& a = adapter_heat_[state];
  const double h = decay(a.heat, a.last);
  if (!touch) return h;
  a.heat = opts_.lambda * h + (1 - opts_.lambda);
  a.last = clock_;
  return a.heat;
}

PrefixCache::Root& PrefixCache::root_for(const CacheKey& key) {
  for (auto& r : roots_)
    if (r->key == key) return *r;
  auto r = std::make_unique<Root>();
  r->key = key;
  r->node.root = r.get();
  r->node.id = key.hash();
  roots_.push_back(std::move(r));
  return *roots_.back();
}

namespace {

uint64_t tokens_hash(std::span<const int32_t> t) { return fnv1a64(t.data(), t.size_bytes()); }

bool any_lost(const std::vector<KvChunkHandle>& kv) {
  for (const KvChunkHandle& h : kv)
    if (h->lost.load()) return true;
  return false;
}

}  // namespace

// The child of `at` whose chunk holds exactly these tokens (h: their hash).
PrefixCache::Node* PrefixCache::find_child(Node& at, std::span<const int32_t> chunk, uint64_t h) {
  for (auto& ch : at.children)
    if (ch->token_hash == h && std::equal(chunk.begin(), chunk.end(), ch->tokens.begin())) return ch.get();
  return nullptr;
}

PrefixHit PrefixCache::lookup(const CacheKey& key, std::span<const int32_t> tokens, int64_t max_tokens) {
  ++clock_;
  ++stats_.lookups;
  PrefixHit hit;
  Root* root = nullptr;
  for (auto& r : roots_)
    if (r->key == key) root = r.get();
  const std::string state = key.adapter_state();
  adapter_heat(state, true);
  if (!root && store_) root = &root_for(key);
  if (!root) return hit;
  const int64_t cs = key.chunk_size;
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(tokens.size()), max_tokens);
  std::vector<Node*> path;
  Node* at = &root->node;
  for (int64_t c = 0; (c + 1) * cs <= limit; ++c) {
    const std::span<const int32_t> chunk = tokens.subspan(static_cast<size_t>(c * cs), static_cast<size_t>(cs));
    const uint64_t h = tokens_hash(chunk);
    Node* next = find_child(*at, chunk, h);
    if (!next && store_) {
      // RAM ends here; the persistent tier may hold the next chunk.
      const uint64_t id = CacheStore::chain(at->id, chunk);
      std::optional<std::vector<KvChunkHandle>> kv =
          store_->read(id, key.hash(), chunk, cs, key.kv_type, key.f16_accumulator, *pool_);
      if (kv) {
        auto node = std::make_unique<Node>();
        node->root = root;
        node->parent = at;
        node->tokens.assign(chunk.begin(), chunk.end());
        node->token_hash = h;
        node->depth_tokens = (c + 1) * cs;
        node->id = id;
        node->last = clock_;
        node->kv = std::move(*kv);
        next = node.get();
        at->children.push_back(std::move(node));
        ++stats_.read_from_store;
      }
    }
    if (!next) break;
    if (any_lost(next->kv)) {
      // A restore could not bring this KV back: it and everything after it
      // in the tree are gone (their KV was computed on it).
      ++stats_.rejected_lost;
      auto& sib = at->children;
      sib.erase(std::find_if(sib.begin(), sib.end(), [&](const auto& p) { return p.get() == next; }));
      break;
    }
    path.push_back(next);
    hit.chunks.push_back(next->kv);
    at = next;
  }
  hit.n_tokens = static_cast<int64_t>(path.size()) * cs;
  // Heat along the matched path only (no global scan).
  const double lm = static_cast<double>(opts_.l_max);
  const double missing = std::min<double>(static_cast<double>(tokens.size()) - hit.n_tokens, lm) / lm;
  for (Node* n : path) {
    const double u = std::min<double>(static_cast<double>(n->depth_tokens), lm) / lm;
    const double s = n->kv[0].shared() ? 1.0 : 0.0;  // a live session holds it too
    n->heat = opts_.lambda * decay(n->heat, n->last) + (1 - opts_.lambda) * (u + opts_.beta * missing + opts_.chi * s);
    n->last = clock_;
  }
  if (hit.n_tokens > 0) {
    ++stats_.hits;
    stats_.hit_tokens += hit.n_tokens;
  }
  return hit;
}

void PrefixCache::insert(const CacheKey& key, std::span<const int32_t> tokens, const KvCache& kv) {
  const int64_t cs = key.chunk_size;
  EBB_CHECK(kv.options().chunk_size == cs && kv.options().type == key.kv_type);
  EBB_CHECK(kv.shape().n_layer == n_layer_);
  EBB_CHECK_MSG(kv.all_on_host(), "KV on a device goes in through insert_chunks");
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(tokens.size()), kv.n_tokens());
  insert_walk(key, tokens, n / cs, 0, [&](int64_t l, int64_t c) {
    EBB_CHECK(kv.chunk(l, c).rows >= cs);
    return kv.handle(l, c);
  });
}

void PrefixCache::insert_chunks(const CacheKey& key, std::span<const int32_t> tokens, int64_t first,
                                std::span<const std::vector<KvChunkHandle>> chunks) {
  const int64_t cs = key.chunk_size;
  const int64_t n_chunks = first + static_cast<int64_t>(chunks.size());
  EBB_CHECK(first >= 0 && n_chunks * cs <= static_cast<int64_t>(tokens.size()));
  insert_walk(key, tokens, n_chunks, first, [&](int64_t l, int64_t c) {
    const KvChunkHandle& h = chunks[static_cast<size_t>(c - first)][static_cast<size_t>(l)];
    EBB_CHECK(h->chunk_size == cs && h->type == key.kv_type && h->rows >= cs);
    return h;
  });
}

void PrefixCache::insert_walk(const CacheKey& key, std::span<const int32_t> tokens, int64_t n_chunks, int64_t first,
                              const std::function<KvChunkHandle(int64_t, int64_t)>& handle) {
  const int64_t cs = key.chunk_size;
  Root& root = root_for(key);
  Node* at = &root.node;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const std::span<const int32_t> chunk = tokens.subspan(static_cast<size_t>(c * cs), static_cast<size_t>(cs));
    const uint64_t h = tokens_hash(chunk);
    Node* next = find_child(*at, chunk, h);
    if (c < first && (!next || any_lost(next->kv))) break;  // no KV of it at hand: nothing can hang below
    if (next && any_lost(next->kv)) {
      // Replace KV a restore lost by the caller's (recomputed) chunks.
      for (int64_t l = 0; l < n_layer_; ++l) next->kv[l] = handle(l, c);
    }
    if (!next) {
      auto node = std::make_unique<Node>();
      node->root = &root;
      node->parent = at;
      node->tokens.assign(chunk.begin(), chunk.end());
      node->token_hash = h;
      node->depth_tokens = (c + 1) * cs;
      node->id = CacheStore::chain(at->id, chunk);
      node->last = clock_;
      node->kv.reserve(static_cast<size_t>(n_layer_));
      bool resident = true;
      for (int64_t l = 0; l < n_layer_; ++l) {
        node->kv.push_back(handle(l, c));
        resident = resident && node->kv.back()->resident();
      }
      next = node.get();
      at->children.push_back(std::move(node));
      ++stats_.inserted_chunks;
      if (store_ && resident) {
        std::vector<uint64_t> digests;
        for (const AdapterKey& a : key.adapters) digests.push_back(a.digest);
        store_->write(next->id, key.hash(), digests, chunk, next->kv);
      }
    }
    at = next;
  }
  if (opts_.max_bytes > 0) trim(opts_.max_bytes);
}

void PrefixCache::note_prefill_cost(double seconds_per_token) {
  if (!(seconds_per_token > 0) || !std::isfinite(seconds_per_token)) return;
  sec_per_token_ = sec_per_token_ == 0 ? seconds_per_token : 0.8 * sec_per_token_ + 0.2 * seconds_per_token;
}

namespace {

// Resident bytes of the chunks only the cache holds.
uint64_t node_private_bytes(const std::vector<KvChunkHandle>& kv) {
  uint64_t b = 0;
  for (const KvChunkHandle& h : kv)
    if (!h.shared() && h->resident()) b += h->storage.size();
  return b;
}

template <class Node, class F>
void for_each_node(Node& n, const F& f) {
  for (auto& c : n.children) {
    f(*c);
    for_each_node(*c, f);
  }
}

}  // namespace

double PrefixCache::heat_kv(const Node& n) const {
  const double lm = static_cast<double>(opts_.l_max);
  const auto it = adapter_heat_.find(n.root->key.adapter_state());
  const double ha = it == adapter_heat_.end() ? 0 : decay(it->second.heat, it->second.last);
  return (opts_.epsilon + decay(n.heat, n.last)) * (opts_.epsilon + ha) *
         (1 + opts_.alpha_l * std::min<double>(static_cast<double>(n.depth_tokens), lm) / lm);
}

double PrefixCache::keep_priority(const Node& n) const {
  const double hkv = heat_kv(n);
  // Ĉ_recompute: the node's tokens at the measured prefill cost (1 ms a
  // token until a prefill has been measured).
  const double per_token = sec_per_token_ > 0 ? sec_per_token_ : 1e-3;
  const double c = per_token * static_cast<double>(n.tokens.size());
  const double b_mib = static_cast<double>(node_private_bytes(n.kv)) / (1 << 20);
  return hkv * c / std::max(1.0, b_mib);
}

void PrefixCache::remove_leaf(Node* n) {
  EBB_CHECK(n->children.empty() && n->parent);
  auto& sib = n->parent->children;
  sib.erase(std::find_if(sib.begin(), sib.end(), [&](const auto& p) { return p.get() == n; }));
}

uint64_t PrefixCache::trim(uint64_t bytes) {
  const uint64_t start = private_bytes();
  uint64_t now = start;
  while (now > bytes) {
    // The leaf with the lowest keep priority that frees something; ties
    // go to the larger one.
    Node* victim = nullptr;
    double best = std::numeric_limits<double>::infinity();
    uint64_t best_b = 0;
    for (auto& r : roots_)
      for_each_node(r->node, [&](Node& n) {
        if (!n.children.empty()) return;
        const uint64_t b = node_private_bytes(n.kv);
        if (b == 0) return;
        const double k = keep_priority(n);
        if (k < best || (k == best && b > best_b)) {
          best = k;
          best_b = b;
          victim = &n;
        }
      });
    if (!victim) break;
    remove_leaf(victim);
    ++stats_.dropped_chunks;
    now -= std::min(now, best_b);
  }
  return start - now;
}

void PrefixCache::drop(const CacheKey& key) {
  roots_.erase(std::remove_if(roots_.begin(), roots_.end(), [&](const auto& r) { return r->key == key; }),
               roots_.end());
}

void PrefixCache::clear() { roots_.clear(); }

uint64_t PrefixCache::private_bytes() const {
  uint64_t b = 0;
  for (const auto& r : roots_) for_each_node(r->node, [&](const Node& n) { b += node_private_bytes(n.kv); });
  return b;
}

int64_t PrefixCache::n_nodes() const {
  int64_t k = 0;
  for (const auto& r : roots_) for_each_node(r->node, [&](const Node&) { ++k; });
  return k;
}

std::vector<PrefixCache::NodeInfo> PrefixCache::nodes() const {
  std::vector<NodeInfo> out;
  for (const auto& r : roots_)
    for_each_node(r->node, [&](const Node& n) {
      out.push_back({n.depth_tokens, decay(n.heat, n.last), heat_kv(n), keep_priority(n), node_private_bytes(n.kv)});
    });
  std::sort(out.begin(), out.end(), [](const NodeInfo& a, const NodeInfo& b) { return a.keep < b.keep; });
  return out;
}

std::vector<PrefixCache::HotPrefix> PrefixCache::hot_prefixes(const std::function<bool(const CacheKey&)>& want,
                                                              size_t k) const {
  struct Candidate {
    const Node* n;
    double hkv;
  };
  std::vector<Candidate> cands;
  for (const auto& r : roots_) {
    if (!want(r->key)) continue;
    for_each_node(r->node, [&](const Node& n) {
      if (decay(n.heat, n.last) > 0) cands.push_back({&n, heat_kv(n)});
    });
  }
  // Hottest first; among equals the deeper (it covers more).
  std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    return a.hkv != b.hkv ? a.hkv > b.hkv : a.n->depth_tokens > b.n->depth_tokens;
  });
  const auto on_path = [](const Node* anc, const Node* n) {  // anc is n or one of its ancestors
    for (; n; n = n->parent)
      if (n == anc) return true;
    return false;
  };
  std::vector<Candidate> chosen;  // the end node of each prefix, and the prefix's heat
  for (const Candidate& c : cands) {
    bool placed = false;
    for (Candidate& t : chosen) {
      if (on_path(c.n, t.n)) {  // already covered
        placed = true;
        break;
      }
      if (on_path(t.n, c.n)) {  // extends a prefix taken: the deeper end covers both
        t.n = c.n;
        placed = true;
        break;
      }
    }
    if (!placed && chosen.size() < k) chosen.push_back(c);
  }
  std::vector<HotPrefix> out;
  for (const Candidate& c : chosen) {
    HotPrefix p;
    p.key = c.n->root->key;
    p.heat_kv = c.hkv;
    std::vector<const Node*> path;
    for (const Node* n = c.n; n && n->parent; n = n->parent) path.push_back(n);
    for (auto it = path.rbegin(); it != path.rend(); ++it)
      p.tokens.insert(p.tokens.end(), (*it)->tokens.begin(), (*it)->tokens.end());
    out.push_back(std::move(p));
  }
  return out;
}

int64_t PrefixCache::covered(const CacheKey& key, std::span<const int32_t> tokens) const {
  const Root* root = nullptr;
  for (const auto& r : roots_)
    if (r->key == key) root = r.get();
  if (!root) return 0;
  const int64_t cs = key.chunk_size;
  Node* at = const_cast<Node*>(&root->node);  // find_child does not change the tree
  int64_t n = 0;
  for (int64_t c = 0; (c + 1) * cs <= static_cast<int64_t>(tokens.size()); ++c) {
    const std::span<const int32_t> chunk = tokens.subspan(static_cast<size_t>(c * cs), static_cast<size_t>(cs));
    Node* next = find_child(*at, chunk, tokens_hash(chunk));
    if (!next || any_lost(next->kv)) break;
    n += cs;
    at = next;
  }
  return n;
}

size_t PrefixCache::drop_adapter(const std::string& name, uint64_t version) {
  const size_t before = roots_.size();
  roots_.erase(std::remove_if(roots_.begin(), roots_.end(),
                              [&](const auto& r) {
                                for (const AdapterKey& a : r->key.adapters)
                                  if (a.name == name && (version == 0 || a.version == version)) return true;
                                return false;
                              }),
               roots_.end());
  return before - roots_.size();
}

}  // namespace ebb
