// A conversation: its tokens and its KV cache. A second turn runs only its
// new tokens. The tokens are the ground truth: KV can always be recomputed
// from them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "memory/elastic.h"
#include "memory/kv_cache.h"
#include "model/tokenizer.h"
#include "platform/allocator.h"

namespace ebb {

class Engine;

struct SessionOptions {
  int64_t n_ctx = 0;           // context limit in tokens; 0: min(model's training context, 4096)
  int64_t kv_chunk_size = 0;   // 0: the engine's default
  DType kv_type = DType::kF16;  // kF16 or kF32
  // F16 KV: attention accumulates in F16 position by position, as the
  // reference engine does (to compare logits with it), instead of in F32
  // (faster, and closer to exact).
  bool f16_attention = false;
};

// Progress of a long prefill: (tokens done, tokens total).
using ProgressFn = std::function<void(int64_t, int64_t)>;

class Session {
 public:
  Session(Engine& engine, SessionOptions opts = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Appends tokens to the conversation and runs every token not yet run
  // (including pending ones, see append_pending) through the model in
  // micro-batches. Returns the logits after the last token ([n_vocab]).
  // When all_logits is given it receives the logits after each token of
  // this call ([n_new, n_vocab], pending tokens included).
  // Throws ebb::Error when the context would overflow; the session is then
  // unchanged.
  std::span<const float> feed(std::span<const TokenId> tokens, std::vector<float>* all_logits = nullptr,
                              const ProgressFn& progress = nullptr);

  // Records a token as part of the conversation without running it yet (the
  // last sampled token of a turn); the next feed() runs it first.
  void append_pending(TokenId t);

  const std::vector<TokenId>& tokens() const { return tokens_; }
  int64_t n_processed() const { return kv_->n_tokens(); }
  int64_t n_ctx() const { return opts_.n_ctx; }
  std::span<const float> last_logits() const;

  // Forgets everything after the first n tokens (n <= tokens().size()).
  void truncate(int64_t n);
  void clear() { truncate(0); }

  // Saves tokens and KV to a file whose header records the model's
  // identity; load() refuses a file from another model with a message.
  void save(const std::string& path) const;
  void load(const std::string& path);

  const KvCache& kv() const { return *kv_; }
  KvCache& kv() { return *kv_; }
  const SessionOptions& options() const { return opts_; }
  uint64_t scratch_bytes() const { return logits_.size(); }
  Engine& engine() { return engine_; }
  // The last restore this session waited for, and how many times KV that
  // could not be restored was recomputed.
  const RestoreReport& last_restore() const { return last_restore_; }
  int64_t recomputes() const { return recomputes_; }
  // Restores whatever elastic memory evicted (save/load/truncate need it).
  void make_resident();

 private:
  // Runs tokens [kv n_tokens, tokens.size()); rows of all_logits start at
  // position rows_from.
  void run_to_end(std::vector<float>* all_logits, int64_t rows_from, const ProgressFn& progress);

  Engine& engine_;
  SessionOptions opts_;
  std::unique_ptr<KvCache> kv_;
  std::vector<TokenId> tokens_;
  Buffer logits_;  // [n_vocab] logits after the last processed token
  bool have_logits_ = false;
  std::vector<float> scratch_rows_;  // all-logits rows of one micro-batch
  RestoreReport last_restore_;
  int64_t recomputes_ = 0;
};

}  // namespace ebb
