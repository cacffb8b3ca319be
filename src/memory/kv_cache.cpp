#include "memory/kv_cache.h"

#include <algorithm>
#include <string>
#include <unistd.h>

#include "platform/error.h"

namespace ebb {

namespace {

uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : UINT64_MAX;
}

}  // namespace

KvCache::KvCache(KvPool& pool, KvCacheOptions opts) : pool_(pool), opts_(opts) {
  if (opts_.type != DType::kF16 && opts_.type != DType::kF32) {
    throw Error("KV cache type must be F16 or F32, not " + std::string(dtype_name(opts_.type)));
  }
  if (opts_.chunk_size < 1 || opts_.chunk_size > (1 << 20)) {
    throw Error("KV chunk size " + std::to_string(opts_.chunk_size) + " is outside [1, 1048576]");
  }
  if (opts_.max_tokens < 1) throw Error("context size must be at least 1 token");
  const KvShape& s = pool_.shape();
  if (opts_.host_layers < -1 || opts_.host_layers > s.n_layer) {
    throw Error("KV host layers " + std::to_string(opts_.host_layers) + " is outside [0, " +
                std::to_string(s.n_layer) + "] (or -1: all)");
  }
  n_host_ = opts_.host_layers < 0 ? s.n_layer : opts_.host_layers;
  row_bytes_ = static_cast<uint64_t>(s.n_kv_heads * s.head_dim) * (opts_.type == DType::kF16 ? 2 : 4);
  // Tables grow with the context; a context whose chunk tables alone would
  // not fit in memory is refused now rather than failing later.
  const uint64_t max_chunks = static_cast<uint64_t>((opts_.max_tokens + opts_.chunk_size - 1) / opts_.chunk_size);
  const uint64_t table_bytes = max_chunks * static_cast<uint64_t>(s.n_layer) * (sizeof(KvChunkHandle) + sizeof(KvChunkRef));
  if (table_bytes > physical_memory() / 4) {
    throw Error("a context of " + std::to_string(opts_.max_tokens) + " tokens needs " +
                std::to_string(table_bytes >> 20) + " MiB of KV chunk tables alone, more than this machine can hold");
  }
  const uint64_t full = max_chunks * static_cast<uint64_t>(n_host_) * chunk_alloc_bytes();
  capacity_share_ = static_cast<int64_t>(std::min<uint64_t>(full, INT64_MAX / 4));
  pool_.add_capacity(capacity_share_);
  tables_.resize(static_cast<size_t>(s.n_layer));
  refs_.resize(static_cast<size_t>(s.n_layer));
}

KvCache::~KvCache() {
  tables_.clear();  // handles go back to the pool
  pool_.add_capacity(-capacity_share_);
}

void KvCache::set_n_tokens(int64_t n) {
  EBB_CHECK(n >= 0 && n <= opts_.max_tokens);
  if (n_host_ > 0) {
    for (int64_t l = 0; l < n_host_; ++l) EBB_CHECK(static_cast<int64_t>(tables_[l].size()) * opts_.chunk_size >= n);
    // Rows below n are written now (the forward pass wrote them).
    for (int64_t c = n_tokens_ / opts_.chunk_size; c * opts_.chunk_size < n; ++c) {
      const int64_t rows = std::min(opts_.chunk_size, n - c * opts_.chunk_size);
      for (int64_t l = 0; l < n_host_; ++l) tables_[l][c]->rows = std::max(tables_[l][c]->rows, rows);
    }
  }
  n_tokens_ = n;
}

void KvCache::reserve(int64_t n) {
  if (n > opts_.max_tokens) {
    throw Error("context full: " + std::to_string(n) + " tokens requested, the session's context holds " +
                std::to_string(opts_.max_tokens));
  }
  if (n <= n_tokens_ || n_host_ == 0) return;
  const int64_t cs = opts_.chunk_size;
  const size_t need = static_cast<size_t>((n + cs - 1) / cs);
  // Copy-on-write: the chunk the next rows land in, when someone else holds
  // it (a shared partial chunk, or a full one after truncate).
  const size_t first = static_cast<size_t>(n_tokens_ / cs);
  for (int64_t l = 0; l < n_host_; ++l) {
    auto& t = tables_[l];
    for (size_t c = first; c < std::min(need, t.size()); ++c)
      if (t[c].shared()) t[c] = pool_.copy(*t[c]);
  }
  // Every layer's new chunks in one mapping: a chat turn that crosses a
  // chunk boundary faults them in by huge pages at once (for Qwen3-0.6B's 28
  // layers, 28 MiB in about 2 ms instead of 7 ms page by page).
  std::vector<int32_t> layers;
  for (int64_t l = 0; l < n_host_; ++l)
    for (size_t c = tables_[l].size(); c < need; ++c) layers.push_back(static_cast<int32_t>(l));
  if (layers.empty()) return;
  std::vector<KvChunkHandle> fresh = pool_.create(layers, cs, opts_.type, true);
  size_t next = 0;
  for (int64_t l = 0; l < n_host_; ++l)
    while (tables_[l].size() < need) tables_[l].push_back(std::move(fresh[next++]));
}

void KvCache::truncate(int64_t n) {
  EBB_CHECK(n >= 0);
  if (n < n_tokens_) n_tokens_ = n;
  // A device's rows past n are rewritten before they are read.
  const int64_t cs = opts_.chunk_size;
  const size_t keep = static_cast<size_t>((n + cs - 1) / cs);
  for (int64_t l = 0; l < n_host_; ++l) {
    auto& t = tables_[l];
    if (t.size() > keep) t.resize(keep);
    // A chunk only this cache holds forgets the rows past n.
    if (keep > 0 && !t[keep - 1].shared()) t[keep - 1]->rows = std::min(t[keep - 1]->rows, n - int64_t(keep - 1) * cs);
  }
}

void* KvCache::k_row(int64_t layer, int64_t pos) {
  const size_t c = static_cast<size_t>(pos / opts_.chunk_size);
  EBB_CHECK(c < tables_[layer].size() && tables_[layer][c]->resident());
  return tables_[layer][c]->storage.as<uint8_t>() + (pos % opts_.chunk_size) * row_bytes_;
}

void* KvCache::v_row(int64_t layer, int64_t pos) {
  const size_t c = static_cast<size_t>(pos / opts_.chunk_size);
  EBB_CHECK(c < tables_[layer].size() && tables_[layer][c]->resident());
  return tables_[layer][c]->storage.as<uint8_t>() + (opts_.chunk_size + pos % opts_.chunk_size) * row_bytes_;
}

const KvChunkRef* KvCache::chunks(int64_t layer) const {
  const auto& t = tables_[layer];
  auto& r = refs_[layer];
  r.resize(t.size());
  for (size_t c = 0; c < t.size(); ++c) r[c] = t[c]->ref();
  return r.data();
}

uint64_t KvCache::layer_bytes(int64_t layer) const {
  uint64_t b = 0;
  for (const KvChunkHandle& h : tables_[layer])
    if (h->resident()) b += h->storage.size();
  return b;
}

uint64_t KvCache::total_bytes() const {
  uint64_t t = 0;
  for (int64_t l = 0; l < shape().n_layer; ++l) t += layer_bytes(l);
  return t;
}

bool KvCache::all_resident() const {
  for (const auto& t : tables_)
    for (const KvChunkHandle& h : t)
      if (!h->resident()) return false;
  return true;
}

int64_t KvCache::chunk_tokens(int64_t c) const {
  return std::clamp<int64_t>(n_tokens_ - c * opts_.chunk_size, 0, opts_.chunk_size);
}

int64_t KvCache::lost_from() const {
  int64_t from = n_tokens_;
  for (const auto& t : tables_)
    for (size_t c = 0; c < t.size(); ++c)
      if (t[c]->lost.load()) from = std::min(from, static_cast<int64_t>(c) * opts_.chunk_size);
  return from;
}

void KvCache::share_from(const KvCache& other, int64_t n) {
  EBB_CHECK_MSG(n_host_ == other.n_host_, "KV caches of different splits of the layers are not shared");
  EBB_CHECK(&other.pool_ == &pool_ && other.opts_.chunk_size == opts_.chunk_size && other.opts_.type == opts_.type);
  EBB_CHECK(n >= 0 && n <= other.n_tokens_ && n <= opts_.max_tokens);
  const size_t k = static_cast<size_t>((n + opts_.chunk_size - 1) / opts_.chunk_size);
  for (size_t l = 0; l < static_cast<size_t>(n_host_); ++l)
    tables_[l].assign(other.tables_[l].begin(), other.tables_[l].begin() + static_cast<std::ptrdiff_t>(k));
  n_tokens_ = n;
}

void KvCache::adopt(std::span<const std::vector<KvChunkHandle>> chunks) {
  const int64_t n = static_cast<int64_t>(chunks.size()) * opts_.chunk_size;
  EBB_CHECK(n <= opts_.max_tokens);
  for (auto& t : tables_) t.clear();
  for (const std::vector<KvChunkHandle>& c : chunks) {
    EBB_CHECK(c.size() == tables_.size());
    for (size_t l = 0; l < static_cast<size_t>(n_host_); ++l) {
      EBB_CHECK(c[l]->chunk_size == opts_.chunk_size && c[l]->type == opts_.type && c[l]->rows == opts_.chunk_size);
      tables_[l].push_back(c[l]);
    }
  }
  n_tokens_ = n;
}

}  // namespace ebb
