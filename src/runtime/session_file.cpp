// Session files: a header that identifies the model, the tokens, and the KV
// of every processed position, row by row (so a file loads into a session of
// any chunk size). Layout (little-endian):
//   magic "EBBSESS\0", u32 version, u64 model fingerprint, u32 n_layer,
//   u32 n_kv_heads, u32 head_dim, u32 n_vocab, u32 kv type, u64 n_tokens,
//   u64 n_processed, i32 tokens[n_tokens],
//   per layer: K rows [n_processed, kv_dim], V rows [n_processed, kv_dim],
//   u64 FNV-1a checksum of everything before it.
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/session.h"

namespace ebb {
namespace {

constexpr char kMagic[8] = {'E', 'B', 'B', 'S', 'E', 'S', 'S', '\0'};
constexpr uint32_t kVersion = 1;

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

}  // namespace

void Session::save(const std::string& path) const {
  // Evicted KV is brought back first; that changes residency, not the session.
  const_cast<Session*>(this)->make_resident();
  const ModelConfig& c = engine_.config();
  const std::string tmp = path + ".tmp";
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    if (!f) throw Error(path + ": cannot create session file: " + std::strerror(errno));
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
    w.write(tokens_.data(), tokens_.size() * sizeof(TokenId));
    auto& kv = const_cast<KvCache&>(*kv_);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      for (int64_t p = 0; p < kv.n_tokens(); ++p) w.write(kv.k_row(l, p), kv.row_bytes());
      for (int64_t p = 0; p < kv.n_tokens(); ++p) w.write(kv.v_row(l, p), kv.row_bytes());
    }
    const uint64_t d = w.digest();
    if (std::fwrite(&d, 1, sizeof(d), f.get()) != sizeof(d) || std::fflush(f.get()) != 0) {
      throw Error(path + ": write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(path + ": cannot rename session file into place: " + std::strerror(errno));
  }
}

void Session::load(const std::string& path) {
  make_resident();
  const ModelConfig& c = engine_.config();
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw Error(path + ": cannot open session file: " + std::strerror(errno));
  HashedWriter hasher(nullptr, path);
  auto read = [&](void* p, size_t n, const char* what) {
    if (std::fread(p, 1, n, f.get()) != n) throw Error(path + ": session file truncated in " + std::string(what));
    hasher.hash(p, n);
  };
  Header h{};
  read(&h, sizeof(h), "header");
  if (std::memcmp(h.magic, kMagic, 8) != 0) throw Error(path + ": not an ebb session file (bad magic)");
  if (h.version != kVersion) {
    throw Error(path + ": session file version " + std::to_string(h.version) + " is not supported (expected " +
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
  std::vector<TokenId> toks(h.n_tokens);
  read(toks.data(), toks.size() * sizeof(TokenId), "tokens");
  for (TokenId t : toks) {
    if (t < 0 || t >= c.n_vocab) throw Error(path + ": session file holds an invalid token id " + std::to_string(t));
  }
  // Load into a fresh cache of the file's KV type, then swap it in, so a bad
  // file leaves the session as it was.
  KvCacheOptions ko = kv_->options();
  ko.type = static_cast<DType>(h.kv_type);
  auto kv = std::make_unique<KvCache>(engine_.kv_pool(), ko);
  kv->reserve(static_cast<int64_t>(h.n_processed));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    for (uint64_t p = 0; p < h.n_processed; ++p) read(kv->k_row(l, p), kv->row_bytes(), "K rows");
    for (uint64_t p = 0; p < h.n_processed; ++p) read(kv->v_row(l, p), kv->row_bytes(), "V rows");
  }
  kv->set_n_tokens(static_cast<int64_t>(h.n_processed));
  const uint64_t expect = hasher.digest();
  uint64_t stored = 0;
  if (std::fread(&stored, 1, sizeof(stored), f.get()) != sizeof(stored)) {
    throw Error(path + ": session file truncated in checksum");
  }
  if (stored != expect) throw Error(path + ": session file checksum mismatch (file is corrupt)");
  kv_ = std::move(kv);
  opts_.kv_type = ko.type;
  tokens_ = std::move(toks);
  have_logits_ = false;
}

}  // namespace ebb
