#include "memory/cache_store.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>

#include "platform/checksum.h"
#include "platform/error.h"
#include "platform/hash.h"

namespace ebb {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'E', 'B', 'B', 'K', 'V', 'C', '\0', '\1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kMaxAdapters = 8;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;  // the whole header region, a multiple of 4 KiB
  uint64_t fingerprint;   // the model's identity
  uint64_t key_hash;      // namespace, adapters (names, versions, digests, scales), geometry
  uint64_t node_id;       // key and every token up to this node's end
  int64_t chunk_size;
  uint32_t kv_type;
  uint32_t f16_accumulator;
  uint32_t n_layer, n_kv_heads, head_dim, n_adapters;
  uint64_t alloc_bytes;  // per layer in the payload
  uint64_t chunk_bytes;  // checksummed per layer
  uint64_t adapter_digests[kMaxAdapters];
  uint32_t header_crc;   // CRC-32C of the header region with this field zero
  uint32_t reserved;
};
// Followed by int32 tokens[chunk_size] and uint32 layer_crc[n_layer].

uint64_t header_bytes_for(int64_t chunk_size, int64_t n_layer) {
  return align_up(sizeof(Header) + static_cast<uint64_t>(chunk_size) * 4 + static_cast<uint64_t>(n_layer) * 4);
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<uint8_t, AlignedFree>;

AlignedBytes aligned_bytes(uint64_t n) {
  void* p = std::aligned_alloc(kDirectAlign, align_up(std::max<uint64_t>(n, 1)));
  if (!p) throw Error("out of memory for a " + std::to_string(n) + "-byte cache file header");
  std::memset(p, 0, align_up(std::max<uint64_t>(n, 1)));
  return AlignedBytes(static_cast<uint8_t*>(p));
}

// Every element finite (F16 or F32 rows).
bool all_finite(const uint8_t* p, uint64_t bytes, DType type) {
  if (type == DType::kF16) {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    for (uint64_t i = 0; i < bytes / 2; ++i)
      if ((h[i] & 0x7C00u) == 0x7C00u) return false;
  } else {
    const auto* f = reinterpret_cast<const uint32_t*>(p);
    for (uint64_t i = 0; i < bytes / 4; ++i)
      if ((f[i] & 0x7F800000u) == 0x7F800000u) return false;
  }
  return true;
}

// Opens for writing, with O_DIRECT where the filesystem takes it.
int open_write(const std::string& path) {
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path + ": cannot create cache file: " + std::strerror(errno));
  return fd;
}

}  // namespace

uint64_t CacheStore::chain(uint64_t prev, std::span<const int32_t> chunk_tokens) {
  return fnv1a64(chunk_tokens.data(), chunk_tokens.size_bytes(), prev);
}

CacheStore::CacheStore(CacheStoreOptions opts, KvShape shape) : opts_(std::move(opts)), shape_(shape) {
  if (opts_.dir.empty()) throw Error("the persistent KV cache needs a directory");
  std::error_code ec;
  fs::create_directories(opts_.dir, ec);
  if (ec || !fs::is_directory(opts_.dir)) {
    throw Error(opts_.dir + ": cannot use as the KV cache directory: " + (ec ? ec.message() : "not a directory"));
  }
  // A crash mid-write leaves a temporary file: never a node.
  for (const auto& e : fs::directory_iterator(opts_.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".kv.tmp")) fs::remove(e.path(), ec);
    else if (name.ends_with(".kv") && e.is_regular_file(ec)) bytes_ += e.file_size(ec);
  }
  IoOptions io;
  io.queue_depth = 8;
  io.max_request = uint64_t{4} << 20;
  io_ = std::make_unique<IoEngine>(io);
  enforce_limit();
}

CacheStore::~CacheStore() = default;

std::string CacheStore::path_of(uint64_t node_id) const {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.kv", static_cast<unsigned long long>(node_id));
  return opts_.dir + "/" + name;
}

bool CacheStore::contains(uint64_t node_id) const { return fs::exists(path_of(node_id)); }

void CacheStore::reject(const std::string& path, const std::string& why) {
  ++stats_.rejected;
  stats_.last_error = path + ": " + why + "; the KV is recomputed";
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (fs::remove(path, ec)) bytes_ -= std::min(bytes_, ec ? 0 : size);
}

void CacheStore::write(uint64_t node_id, uint64_t key_hash, std::span<const uint64_t> adapter_digests,
                       std::span<const int32_t> chunk_tokens, std::span<const KvChunkHandle> kv) {
  const std::string path = path_of(node_id);
  if (fs::exists(path)) return;
  EBB_CHECK(static_cast<int64_t>(kv.size()) == shape_.n_layer && !kv.empty());
  const KvChunk& c0 = *kv[0];
  const uint64_t hb = header_bytes_for(c0.chunk_size, shape_.n_layer);
  AlignedBytes hdr = aligned_bytes(hb);
  auto* h = reinterpret_cast<Header*>(hdr.get());
  std::memcpy(h->magic, kMagic, 8);
  h->version = kVersion;
  h->header_bytes = static_cast<uint32_t>(hb);
  h->fingerprint = opts_.model_fingerprint;
  h->key_hash = key_hash;
  h->node_id = node_id;
  h->chunk_size = c0.chunk_size;
  h->kv_type = static_cast<uint32_t>(c0.type);
  h->n_layer = static_cast<uint32_t>(shape_.n_layer);
  h->n_kv_heads = static_cast<uint32_t>(shape_.n_kv_heads);
  h->head_dim = static_cast<uint32_t>(shape_.head_dim);
  h->n_adapters = static_cast<uint32_t>(std::min(adapter_digests.size(), kMaxAdapters));
  for (size_t i = 0; i < h->n_adapters; ++i) h->adapter_digests[i] = adapter_digests[i];
  h->alloc_bytes = c0.alloc_bytes();
  h->chunk_bytes = c0.chunk_bytes();
  auto* toks = reinterpret_cast<int32_t*>(hdr.get() + sizeof(Header));
  std::copy(chunk_tokens.begin(), chunk_tokens.end(), toks);
  auto* crcs = reinterpret_cast<uint32_t*>(toks + c0.chunk_size);
  std::vector<IoRequest> reqs;
  const std::string tmp = path + ".tmp";
  int fd = -1;
  try {
    fd = open_write(tmp);
    reqs.push_back({fd, 0, hdr.get(), hb, true});
    for (size_t l = 0; l < kv.size(); ++l) {
      const KvChunk& c = *kv[l];
      EBB_CHECK(c.resident() && c.storage.size() >= c.alloc_bytes());
      crcs[l] = crc32c(c.storage.data(), c.chunk_bytes());
      reqs.push_back({fd, hb + l * c.alloc_bytes(), const_cast<void*>(c.storage.data()), c.alloc_bytes(), true});
    }
    h->header_crc = crc32c(hdr.get(), hb);
    io_->run(reqs, tmp);
    if (::close(std::exchange(fd, -1)) != 0) throw Error(tmp + ": close failed: " + std::strerror(errno));
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      throw Error(tmp + ": cannot rename into place: " + std::strerror(errno));
    }
  } catch (const Error& e) {
    // A full disk or a failing device: the node stays in RAM only, and no
    // partial file is left to hold the disk full.
    if (fd >= 0) ::close(fd);
    std::error_code ec;
    fs::remove(tmp, ec);
    ++stats_.write_failures;
    stats_.last_error = e.what();
    return;
  }
  const uint64_t size = hb + kv.size() * c0.alloc_bytes();
  bytes_ += size;
  ++stats_.written;
  stats_.bytes_written += size;
  enforce_limit();
}

std::optional<std::vector<KvChunkHandle>> CacheStore::read(uint64_t node_id, uint64_t key_hash,
                                                           std::span<const int32_t> chunk_tokens,
                                                           int64_t chunk_size, DType type, bool f16_accumulator,
                                                           KvPool& pool) {
  const std::string path = path_of(node_id);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return std::nullopt;
  if (!fs::is_regular_file(st)) {
    ++stats_.rejected;
    stats_.last_error = path + ": not a regular file; ignored";
    return std::nullopt;
  }
  (void)f16_accumulator;
  try {
    DirectFile f = DirectFile::open_read(path);
    const uint64_t hb = header_bytes_for(chunk_size, shape_.n_layer);
    if (f.size() < hb) {
      reject(path, "truncated (" + std::to_string(f.size()) + " bytes, the header alone is " + std::to_string(hb) + ")");
      return std::nullopt;
    }
    AlignedBytes hdr = aligned_bytes(hb);
    io_->run(std::vector<IoRequest>{{f.fd(), 0, hdr.get(), hb, false}}, path);
    f.drop_cache(0, hb);
    auto* h = reinterpret_cast<Header*>(hdr.get());
    const uint32_t crc = h->header_crc;
    h->header_crc = 0;
    if (std::memcmp(h->magic, kMagic, 8) != 0 || h->version != kVersion) {
      reject(path, "not an ebb KV cache file of version " + std::to_string(kVersion));
      return std::nullopt;
    }
    if (crc32c(hdr.get(), hb) != crc) {
      reject(path, "header checksum mismatch");
      return std::nullopt;
    }
    if (h->fingerprint != opts_.model_fingerprint) {
      reject(path, "written for another model");
      return std::nullopt;
    }
    const uint64_t row_bytes = static_cast<uint64_t>(shape_.n_kv_heads * shape_.head_dim) * (type == DType::kF16 ? 2 : 4);
    const uint64_t chunk_bytes = 2 * row_bytes * static_cast<uint64_t>(chunk_size);
    const uint64_t alloc = align_up(chunk_bytes);
    if (h->key_hash != key_hash || h->node_id != node_id || h->chunk_size != chunk_size ||
        h->kv_type != static_cast<uint32_t>(type) || h->n_layer != shape_.n_layer ||
        h->n_kv_heads != shape_.n_kv_heads || h->head_dim != shape_.head_dim || h->header_bytes != hb ||
        h->alloc_bytes != alloc || h->chunk_bytes != chunk_bytes) {
      reject(path, "written under another key or KV geometry");
      return std::nullopt;
    }
    const auto* toks = reinterpret_cast<const int32_t*>(hdr.get() + sizeof(Header));
    if (!std::equal(chunk_tokens.begin(), chunk_tokens.end(), toks)) {
      reject(path, "holds other tokens");
      return std::nullopt;
    }
    const uint64_t want = hb + static_cast<uint64_t>(shape_.n_layer) * alloc;
    if (f.size() != want) {
      reject(path, "size " + std::to_string(f.size()) + " bytes, expected " + std::to_string(want) + " (truncated?)");
      return std::nullopt;
    }
    const auto* crcs = reinterpret_cast<const uint32_t*>(toks + chunk_size);
    std::vector<int32_t> layers(static_cast<size_t>(shape_.n_layer));
    for (size_t l = 0; l < layers.size(); ++l) layers[l] = static_cast<int32_t>(l);
    std::vector<KvChunkHandle> kv = pool.create(layers, chunk_size, type);
    std::vector<IoRequest> reqs;
    for (size_t l = 0; l < kv.size(); ++l) reqs.push_back({f.fd(), hb + l * alloc, kv[l]->storage.data(), alloc, false});
    coalesce_requests(reqs);
    io_->run(reqs, path);
    f.drop_cache(hb, want - hb);
    for (size_t l = 0; l < kv.size(); ++l) {
      const uint8_t* p = kv[l]->storage.as<const uint8_t>();
      if (crc32c(p, chunk_bytes) != crcs[l]) {
        reject(path, "checksum mismatch in layer " + std::to_string(l));
        return std::nullopt;
      }
      if (!all_finite(p, chunk_bytes, type)) {
        reject(path, "non-finite K or V in layer " + std::to_string(l));
        return std::nullopt;
      }
      kv[l]->rows = chunk_size;
    }
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // most recently used
    ++stats_.read;
    stats_.bytes_read += want;
    return kv;
  } catch (const Error& e) {
    reject(path, e.what());
    return std::nullopt;
  }
}

void CacheStore::enforce_limit() {
  if (opts_.max_bytes == 0 || bytes_ <= opts_.max_bytes) return;
  struct Entry {
    fs::file_time_type when;
    fs::path path;
    uint64_t size;
  };
  std::vector<Entry> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(opts_.dir, ec))
    if (e.path().extension() == ".kv" && e.is_regular_file(ec))
      files.push_back({e.last_write_time(ec), e.path(), e.file_size(ec)});
  std::sort(files.begin(), files.end(), [](const Entry& a, const Entry& b) { return a.when < b.when; });
  uint64_t total = 0;
  for (const Entry& e : files) total += e.size;
  for (const Entry& e : files) {
    if (total <= opts_.max_bytes) break;
    if (fs::remove(e.path, ec)) {
      total -= e.size;
      ++stats_.evicted;
    }
  }
  bytes_ = total;
}

}  // namespace ebb
