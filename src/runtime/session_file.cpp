// Session files: a header that identifies the model, the tokens, and the KV
// of every processed position, row by row (so a file loads into a session of
// any chunk size). Layout (little-endian):
//   magic "EBBSESS\0", u32 version, u64 model fingerprint, u32 n_layer,
//   u32 n_kv_heads, u32 head_dim, u32 n_vocab, u32 kv type, u64 n_tokens,
//   u64 n_processed, (version 2:) u64 adapter identity, i32 tokens[n_tokens],
//   per layer: K rows [n_processed, kv_dim], V rows [n_processed, kv_dim],
//   u64 FNV-1a checksum of everything before it.
//
// The adapter identity (FNV-1a over each adapter's name, digest and scale;
// 0 for the base model, and for version 1 files) says which adapters the KV
// was computed with: loaded into a session bound to others, the tokens are
// kept and the KV is recomputed.
//
// A session whose KV is on a compute device reads it back to save it and
// writes it up to load it (DeviceForward::read_kv / write_kv; a split's CPU
// layers are the host cache's rows): the file is the same, so one saved on a
// device, on a split or on the CPU loads on any of them.
//
// Saving writes NAME.tmp and renames it into place; every failure removes
// NAME.tmp (a full disk stays as full as it was). Loading opens without
// blocking and refuses anything but a regular file (a FIFO would block the
// chat forever), and refuses KV that holds NaN or Inf under a valid checksum
// (the next turn's attention would abort on it).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "platform/error.h"
#include "platform/fp16.h"
#include "runtime/engine.h"
#include "runtime/session.h"

namespace ebb {
namespace {

constexpr char kMagic[8] = {'E', 'B', 'B', 'S', 'E', 'S', 'S', '\0'};
constexpr uint32_t kVersion = 2;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t n_layer;
  uint64_t fingerprint;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t n_vocab;
  uint32_t kv_type;
  uint64_t n_tokens;
  uint64_t n_processed;
};

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

class HashedWriter {
 public:
  HashedWriter(FILE* f, const std::string& path) : f_(f), path_(path) {}
  void write(const void* p, size_t n) {
    hash(p, n);
    if (std::fwrite(p, 1, n, f_) != n) throw Error(path_ + ": write failed (disk full?)");
  }
  uint64_t digest() const { return h_; }
  void hash(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 0x100000001b3ull;
  }

 private:
  FILE* f_;
  const std::string& path_;
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// Opens `path` for reading without blocking (a FIFO or a device is refused,
// not waited on) and checks that it is a regular file.
File open_regular(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open session file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error(path + ": cannot stat session file: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file; a session file must be one");
  }
  FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    const int e = errno;
    ::close(fd);
    throw Error(path + ": cannot open session file: " + std::strerror(e));
  }
  return File(f);
}

// Index of the first value of a row that is NaN or infinite, or -1.
int64_t first_non_finite(const void* row, int64_t n, DType type) {
  if (type == DType::kF16) {
    const auto* h = static_cast<const uint16_t*>(row);
    for (int64_t i = 0; i < n; ++i)
      if ((h[i] & 0x7c00) == 0x7c00) return i;  // exponent all ones: Inf or NaN
  } else {
    const auto* f = static_cast<const float*>(row);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(f[i])) return i;
  }
  return -1;
}

}  // namespace

void Session::save(const std::string& path) const {
  // Evicted KV is brought back first; that changes residency, not the session.
  const_cast<Session*>(this)->make_resident();
  const ModelConfig& c = engine_.config();
  const std::string tmp = path + ".tmp";
  File f(std::fopen(tmp.c_str(), "wb"));
  if (!f) throw Error(path + ": cannot create session file: " + std::strerror(errno));
  try {
    HashedWriter w(f.get(), path);
    Header h{};
    std::memcpy(h.magic, kMagic, 8);
    h.version = kVersion;
    h.fingerprint = engine_.model_fingerprint();
    h.n_layer = static_cast<uint32_t>(c.n_layer);
    h.n_kv_heads = static_cast<uint32_t>(c.n_head_kv);
    h.head_dim = static_cast<uint32_t>(c.head_dim);
    h.n_vocab = static_cast<uint32_t>(c.n_vocab);
    h.kv_type = static_cast<uint32_t>(kv_->options().type);
    h.n_tokens = tokens_.size();
    h.n_processed = static_cast<uint64_t>(kv_->n_tokens());
    w.write(&h, sizeof(h));
    const uint64_t ad = adapter_identity(kv_adapters_);
    w.write(&ad, sizeof(ad));
    w.write(tokens_.data(), tokens_.size() * sizeof(TokenId));
    auto& kv = const_cast<KvCache&>(*kv_);
    if (DeviceForward* dev = engine_.device()) {
      // Read back from the device: the file is the same as the CPU's (F16 rows).
      const int64_t n = kv.n_tokens();
      const size_t layer = static_cast<size_t>(n * c.kv_dim());
      std::vector<uint16_t> k(layer * static_cast<size_t>(c.n_layer)), v(k.size());  // [n_layer, n, kv_dim]
      dev->read_kv(kv, 0, n, k.data(), v.data());
      for (int64_t l = 0; l < c.n_layer; ++l) {
        if (kv.on_host(l)) {  // a split's CPU layers: the host cache's rows (F16 there too)
          for (int64_t p = 0; p < n; ++p) w.write(kv.k_row(l, p), kv.row_bytes());
          for (int64_t p = 0; p < n; ++p) w.write(kv.v_row(l, p), kv.row_bytes());
          continue;
        }
        w.write(k.data() + l * layer, layer * 2);
        w.write(v.data() + l * layer, layer * 2);
      }
    } else {
      for (int64_t l = 0; l < c.n_layer; ++l) {
        for (int64_t p = 0; p < kv.n_tokens(); ++p) w.write(kv.k_row(l, p), kv.row_bytes());
        for (int64_t p = 0; p < kv.n_tokens(); ++p) w.write(kv.v_row(l, p), kv.row_bytes());
      }
    }
    const uint64_t d = w.digest();
    if (std::fwrite(&d, 1, sizeof(d), f.get()) != sizeof(d) || std::fflush(f.get()) != 0) {
      throw Error(path + ": write failed (disk full?)");
    }
    // fclose can still fail (delayed allocation, NFS); its result counts.
    if (std::fclose(f.release()) != 0) throw Error(path + ": write failed on close (disk full?)");
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(path + ": cannot rename session file into place: " + std::strerror(errno));
  } catch (...) {
    f.reset();
    std::remove(tmp.c_str());
    throw;
  }
}

void Session::load(const std::string& path) {
  make_resident();
  const ModelConfig& c = engine_.config();
  File f = open_regular(path);
  HashedWriter hasher(nullptr, path);
  auto read = [&](void* p, size_t n, const char* what) {
    if (std::fread(p, 1, n, f.get()) != n) throw Error(path + ": session file truncated in " + std::string(what));
    hasher.hash(p, n);
  };
  Header h{};
  read(&h, sizeof(h), "header");
  if (std::memcmp(h.magic, kMagic, 8) != 0) throw Error(path + ": not an ebb session file (bad magic)");
  if (h.version != kVersion && h.version != 1) {
    throw Error(path + ": session file version " + std::to_string(h.version) + " is not supported (expected 1 to " +
                std::to_string(kVersion) + ")");
  }
  if (h.fingerprint != engine_.model_fingerprint() || h.n_layer != c.n_layer || h.n_kv_heads != c.n_head_kv ||
      h.head_dim != c.head_dim || h.n_vocab != c.n_vocab) {
    throw Error(path + ": session was saved with a different model (fingerprint " + std::to_string(h.fingerprint) +
                ", this model is " + std::to_string(engine_.model_fingerprint()) + "); refusing to load it");
  }
  if (h.kv_type != static_cast<uint32_t>(DType::kF16) && h.kv_type != static_cast<uint32_t>(DType::kF32)) {
    throw Error(path + ": session file has an invalid KV type " + std::to_string(h.kv_type));
  }
  if (h.n_processed > h.n_tokens || h.n_tokens > static_cast<uint64_t>(opts_.n_ctx)) {
    throw Error(path + ": session holds " + std::to_string(h.n_tokens) + " tokens; this session's context is " +
                std::to_string(opts_.n_ctx) + " (raise --ctx)");
  }
  uint64_t file_adapters = 0;
  if (h.version >= 2) read(&file_adapters, sizeof(file_adapters), "header");
  std::vector<TokenId> toks(h.n_tokens);
  read(toks.data(), toks.size() * sizeof(TokenId), "tokens");
  for (TokenId t : toks) {
    if (t < 0 || t >= c.n_vocab) throw Error(path + ": session file holds an invalid token id " + std::to_string(t));
  }
  // Load into a fresh cache of the file's KV type (on a device: F16, into
  // host rows first), then swap it in, so a bad file leaves the session as
  // it was.
  KvCacheOptions ko = kv_->options();
  DeviceForward* dev = engine_.device();
  const DType file_type = static_cast<DType>(h.kv_type);
  if (!dev) ko.type = file_type;
  const int64_t np = static_cast<int64_t>(h.n_processed), kvd = c.kv_dim();
  const uint64_t file_row = static_cast<uint64_t>(kvd) * (file_type == DType::kF16 ? 2 : 4);
  auto kv = std::make_unique<KvCache>(engine_.kv_pool(), ko);
  // Whatever the device took for the fresh cache goes with it when the load fails.
  struct DeviceRelease {
    DeviceForward* dev;
    const KvCache* kv;
    ~DeviceRelease() {
      if (dev && kv) dev->release(kv);
    }
  } device_release{dev, kv.get()};
  std::vector<uint8_t> rows;  // on a device: [n_layer][K, V][np, kv_dim] of the file's type
  if (dev) {
    rows.resize(static_cast<size_t>(2 * c.n_layer * np) * file_row);
    read(rows.data(), rows.size(), "K and V rows");
  } else {
    kv->reserve(np);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      for (int64_t p = 0; p < np; ++p) read(kv->k_row(l, p), kv->row_bytes(), "K rows");
      for (int64_t p = 0; p < np; ++p) read(kv->v_row(l, p), kv->row_bytes(), "V rows");
    }
  }
  const uint64_t expect = hasher.digest();
  uint64_t stored = 0;
  if (std::fread(&stored, 1, sizeof(stored), f.get()) != sizeof(stored)) {
    throw Error(path + ": session file truncated in checksum");
  }
  if (stored != expect) throw Error(path + ": session file checksum mismatch (file is corrupt)");
  // A valid checksum only says the file is what was written: KV with NaN or
  // Inf (written by a bad turn, or crafted) is refused before any turn uses it.
  auto row_at = [&](int64_t l, int64_t p, bool is_k) -> const void* {
    if (dev) return rows.data() + (static_cast<uint64_t>((2 * l + (is_k ? 0 : 1)) * np + p)) * file_row;
    return is_k ? kv->k_row(l, p) : kv->v_row(l, p);
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (int64_t p = 0; p < np; ++p) {
      for (const bool is_k : {true, false}) {
        const int64_t i = first_non_finite(row_at(l, p, is_k), kvd, dev ? file_type : ko.type);
        if (i >= 0) {
          throw Error(path + ": session file holds a non-finite " + (is_k ? "K" : "V") + " value at layer " +
                      std::to_string(l) + ", position " + std::to_string(p) + " (element " + std::to_string(i) +
                      "); refusing to load it");
        }
      }
    }
  }
  if (dev) {
    // The rows go up from the file's bytes; the device keeps F16, so a file
    // of F32 rows (saved on the CPU with an F32 cache) is rounded once.
    auto to_f16 = [&](const void* src, uint16_t* dst, size_t count) {
      if (file_type == DType::kF16) {
        std::memcpy(dst, src, count * 2);
      } else {
        const auto* f32 = static_cast<const float*>(src);
        for (size_t i = 0; i < count; ++i) dst[i] = fp32_to_fp16(f32[i]);
      }
    };
    dev->write_kv(*kv, 0, np, [&](int64_t l, bool v, int64_t p, int64_t n, uint16_t* dst) {
      to_f16(row_at(l, p, !v), dst, static_cast<size_t>(n * kvd));  // a layer's K (or V) rows are consecutive
    });
    // A split's CPU layers: into the host cache's chunks (F16 too).
    kv->reserve(np);
    for (int64_t l = 0; l < kv->n_host_layers(); ++l) {
      for (int64_t p = 0; p < np; ++p) {
        to_f16(row_at(l, p, true), static_cast<uint16_t*>(kv->k_row(l, p)), static_cast<size_t>(kvd));
        to_f16(row_at(l, p, false), static_cast<uint16_t*>(kv->v_row(l, p)), static_cast<size_t>(kvd));
      }
    }
  }
  kv->set_n_tokens(np);
  // The adapters this session is bound to now: KV made under others is
  // stale (the tokens are what matters; their KV is recomputed).
  std::vector<AdapterKey> now = adapter_keys(engine_.adapters().resolve(bindings_));
  if (adapter_identity(now) != file_adapters) kv->truncate(0);
  if (dev) dev->release(kv_.get());  // the old cache's device KV goes with it
  device_release.kv = nullptr;
  kv_ = std::move(kv);
  kv_adapters_ = std::move(now);
  opts_.kv_type = ko.type;
  tokens_ = std::move(toks);
  have_logits_ = false;
  recorded_chunks_ = 0;
}

}  // namespace ebb
