#include "memory/kv_cache.h"

#include <algorithm>
#include <string>

#include "platform/error.h"

namespace ebb {

KvCache::KvCache(KvShape shape, KvCacheOptions opts, Allocator* alloc)
    : shape_(shape), opts_(opts), alloc_(alloc) {
  if (opts_.type != DType::kF16 && opts_.type != DType::kF32) {
    throw Error("KV cache type must be F16 or F32, not " + std::string(dtype_name(opts_.type)));
  }
  if (opts_.chunk_size < 1 || opts_.chunk_size > (1 << 20)) {
    throw Error("KV chunk size " + std::to_string(opts_.chunk_size) + " is outside [1, 1048576]");
  }
  if (opts_.max_tokens < 1) throw Error("context size must be at least 1 token");
  row_bytes_ = static_cast<uint64_t>(shape_.n_kv_heads * shape_.head_dim) * (opts_.type == DType::kF16 ? 2 : 4);
  const size_t max_chunks = static_cast<size_t>((opts_.max_tokens + opts_.chunk_size - 1) / opts_.chunk_size);
  storage_.resize(shape_.n_layer);
  tables_.resize(shape_.n_layer);
  n_alloc_.assign(shape_.n_layer, 0);
  n_resident_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(shape_.n_layer));
  meta_.resize(shape_.n_layer);
  for (int64_t l = 0; l < shape_.n_layer; ++l) {
    // Tables are sized once so that growing the context never reallocates them.
    storage_[l].resize(max_chunks);
    tables_[l].resize(max_chunks);
    meta_[l].resize(max_chunks);
  }
}

void KvCache::set_n_tokens(int64_t n) {
  EBB_CHECK(n >= 0 && n <= opts_.max_tokens);
  for (int64_t l = 0; l < shape_.n_layer; ++l)
    EBB_CHECK(static_cast<int64_t>(n_alloc_[l]) * opts_.chunk_size >= n);
  n_tokens_ = n;
}

void KvCache::reserve(int64_t n) {
  if (n > opts_.max_tokens) {
    throw Error("context full: " + std::to_string(n) + " tokens requested, the session's context holds " +
                std::to_string(opts_.max_tokens) + " (raise --ctx)");
  }
  const size_t need = static_cast<size_t>((n + opts_.chunk_size - 1) / opts_.chunk_size);
  size_t missing = 0;
  for (int64_t l = 0; l < shape_.n_layer; ++l) missing += need - std::min(need, n_alloc_[l]);
  if (missing == 0) return;
  // Every layer's new chunks in one mapping: a chat turn that crosses a
  // chunk boundary faults them in by huge pages at once (for Qwen3-0.6B's 28
  // layers, 28 MiB in about 2 ms instead of 7 ms page by page).
  std::vector<Buffer> bufs = alloc_->allocate_group(missing, chunk_alloc_bytes(), MemCategory::kKvCache, true);
  size_t next = 0;
  for (int64_t l = 0; l < shape_.n_layer; ++l) {
    while (n_alloc_[l] < need) {
      const size_t c = n_alloc_[l];
      put_chunk(l, static_cast<int64_t>(c), std::move(bufs[next++]));
      meta_[l][c] = {};
      ++n_alloc_[l];
    }
  }
}

void KvCache::truncate(int64_t n) {
  EBB_CHECK(n >= 0);
  if (n < n_tokens_) n_tokens_ = n;
  const size_t keep = static_cast<size_t>((n + opts_.chunk_size - 1) / opts_.chunk_size);
  for (int64_t l = 0; l < shape_.n_layer; ++l) {
    while (n_alloc_[l] > keep) {
      --n_alloc_[l];
      EBB_CHECK_MSG(chunk_resident(l, n_alloc_[l]), "truncating an evicted KV chunk: restore first");
      (void)take_chunk(l, n_alloc_[l]);
      meta_[l][n_alloc_[l]] = {};
    }
  }
}

void* KvCache::k_row(int64_t layer, int64_t pos) {
  const int64_t c = pos / opts_.chunk_size;
  EBB_CHECK(c < static_cast<int64_t>(n_alloc_[layer]) && chunk_resident(layer, c));
  return storage_[layer][c].as<uint8_t>() + (pos % opts_.chunk_size) * row_bytes_;
}

void* KvCache::v_row(int64_t layer, int64_t pos) {
  const int64_t c = pos / opts_.chunk_size;
  EBB_CHECK(c < static_cast<int64_t>(n_alloc_[layer]) && chunk_resident(layer, c));
  return storage_[layer][c].as<uint8_t>() + (opts_.chunk_size + pos % opts_.chunk_size) * row_bytes_;
}

uint64_t KvCache::total_bytes() const {
  uint64_t t = 0;
  for (int64_t l = 0; l < shape_.n_layer; ++l) t += n_resident_[l].load() * chunk_alloc_bytes();
  return t;
}

Buffer KvCache::take_chunk(int64_t layer, int64_t chunk) {
  EBB_CHECK(chunk_resident(layer, chunk));
  Buffer b = std::move(storage_[layer][chunk]);
  tables_[layer][chunk] = {};
  --n_resident_[layer];
  return b;
}

std::vector<Buffer> KvCache::new_chunk_buffers(size_t n) const {
  return alloc_->allocate_group(n, chunk_alloc_bytes(), MemCategory::kKvCache);
}

void KvCache::put_chunk(int64_t layer, int64_t chunk, Buffer b) {
  EBB_CHECK(!chunk_resident(layer, chunk) && b.size() >= chunk_bytes());
  storage_[layer][chunk] = std::move(b);
  uint8_t* base = storage_[layer][chunk].as<uint8_t>();
  tables_[layer][chunk] = KvChunkRef{base, base + row_bytes_ * opts_.chunk_size};
  meta_[layer][chunk].state = UnitState::kResident;
  ++n_resident_[layer];
}

bool KvCache::all_resident() const {
  for (int64_t l = 0; l < shape_.n_layer; ++l)
    if (n_resident_[l].load() != n_alloc_[l]) return false;
  return true;
}

int64_t KvCache::chunk_tokens(int64_t chunk) const {
  return std::clamp<int64_t>(n_tokens_ - chunk * opts_.chunk_size, 0, opts_.chunk_size);
}

}  // namespace ebb
