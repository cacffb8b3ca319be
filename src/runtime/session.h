// A conversation: its tokens and its KV cache (a chunk table into the
// engine's KV pool). A second turn runs only its new tokens. The tokens are
// the ground truth: KV can always be recomputed from them.
//
// Execution is step by step: append() records tokens, and each step() runs
// one micro-batch of the tokens not yet run and returns, so a scheduler can
// interleave sessions (run_step() in runtime/batch.h runs several sessions'
// steps as one forward pass), cancel between steps, and start restoration
// itself. feed() is append() and steps until nothing is pending.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "memory/elastic.h"
#include "memory/kv_cache.h"
#include "memory/prefix_cache.h"
#include "model/tokenizer.h"
#include "platform/allocator.h"
#include "runtime/adapters.h"

namespace ebb {

class Engine;

struct SessionOptions {
  int64_t n_ctx = 0;           // context limit in tokens; 0: min(model's training context, 4096)
  int64_t kv_chunk_size = 0;   // 0: the engine's default (Engine::session_chunk_size)
  DType kv_type = DType::kF16;  // kF16 or kF32
  // F16 KV: attention accumulates in F16 position by position, as the
  // reference engine does (to compare logits with it), instead of in F32
  // (faster, and closer to exact).
  bool f16_attention = false;
  // The prefix cache (when the engine has one): this conversation's KV is
  // looked up and recorded under this namespace (LOCAL's context
  // namespace: sessions in different namespaces never share KV).
  bool use_prefix_cache = true;
  std::string cache_namespace;
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
  // Throws ebb::Error when the context would overflow or the run fails (a
  // model file changed on disk, ...); the session then holds the tokens it
  // held before the call.
  std::span<const float> feed(std::span<const TokenId> tokens, std::vector<float>* all_logits = nullptr,
                              const ProgressFn& progress = nullptr);

  // Records a token as part of the conversation without running it yet (the
  // last sampled token of a turn); the next feed() runs it first.
  void append_pending(TokenId t);

  // Step-by-step execution.
  // Records tokens without running them. Throws ebb::Error (session
  // unchanged) on a token outside the vocabulary or a full context.
  void append(std::span<const TokenId> tokens);
  // Tokens recorded but not run yet.
  int64_t n_pending() const { return static_cast<int64_t>(tokens_.size()) - kv_->n_tokens(); }
  // Runs at most max_tokens (0: the engine's prefill batch) of the pending
  // tokens through the model as one micro-batch; returns how many ran (0
  // when none was pending). Starts restoring what elastic memory evicted
  // when needed; when the last pending token has run, waits for that restore
  // and queues whatever KV it could not bring back for recomputation (so
  // n_pending() may grow again). After an error the session keeps its
  // tokens and the next step runs what is left.
  int64_t step(int64_t max_tokens = 0);
  // The parts of a step, for run_step(): prepare makes room for the next
  // n tokens (at most n_pending()) and returns this session's share of a
  // forward pass; finish records that the pass ran.
  struct StepPart {
    KvCache* kv;
    std::span<const TokenId> tokens;
    float* logits;  // [n_vocab]: the last token's logits
    const AdapterSet* adapters;  // the turn's pinned adapter versions (empty: base)
  };
  StepPart prepare_step(int64_t n);
  void finish_step(int64_t n);
  // Reuses the first n tokens' KV of another session of this engine (same
  // chunk size and KV type) without copying it: the conversations share
  // chunks until one writes into a shared one, which it then copies first.
  // On a device the KV is copied there (DeviceForward::copy_kv).
  // This session's tokens become the other's first n; nothing is pending.
  // When n is all the other has run and its logits are at hand, they are
  // copied too, so this session samples without running a token.
  void fork_from(const Session& other, int64_t n);

  const std::vector<TokenId>& tokens() const { return tokens_; }
  int64_t n_processed() const { return kv_->n_tokens(); }
  // Logits after the last processed token are at hand.
  bool has_logits() const { return have_logits_; }
  // Tokens run through the model so far, and tokens whose KV came from the
  // prefix cache instead (both cumulative).
  int64_t tokens_run() const { return tokens_run_; }
  int64_t reused_tokens() const { return reused_tokens_; }
  // The prefix-cache key of this session's KV.
  CacheKey cache_key() const;
  // Records the full chunks of this session's KV that hold tokens[0, n)
  // (tokens: this session's, or a prefix of them) in `pc` under `key`
  // (PrefixCache::insert). On a device the chunks the cache does not hold
  // yet are read back first (runtime/device_kv.h).
  void insert_into(PrefixCache& pc, const CacheKey& key, std::span<const TokenId> tokens) const;

  // Adapters (LoRA): the set this conversation applies, by name with a
  // scale and optionally a version (0: whichever is published). It is
  // resolved to pinned versions at the start of each turn (the next
  // append()): a turn finishes on the versions it started with, and when
  // the resolved set differs from the one the KV was computed with, that KV
  // is stale and is recomputed from the tokens (or taken from the prefix
  // cache under the new key). Throws ebb::Error naming an adapter the
  // engine does not have (the binding is unchanged then).
  void set_adapters(std::vector<AdapterBinding> bindings);
  const std::vector<AdapterBinding>& adapter_bindings() const { return bindings_; }
  // The versions the current (or last) turn runs with.
  const AdapterSet& adapters() const { return active_; }
  // Between turns (nothing pending): unpins the last turn's versions, so
  // that Engine::evict can drop their tensors; the next append() pins (and
  // restores) them again. Does nothing while tokens are pending.
  void release_adapters();
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
  // When a restore is in flight and nothing is pending: waits for it, and
  // truncates the KV to what could not be restored (to be recomputed).
  void settle_restore();
  // Takes the longest cached prefix of the pending tokens from the prefix
  // cache when it covers more than the KV holds; records full chunks in it.
  void reuse_prefix();
  void record_prefix();
  void note_cost(int64_t n, double seconds);
  // Pins the bound adapters' versions for a new turn; drops the KV when it
  // was computed under another set.
  void begin_turn();

  Engine& engine_;
  SessionOptions opts_;
  std::unique_ptr<KvCache> kv_;
  std::vector<TokenId> tokens_;
  Buffer logits_;  // [n_vocab] logits after the last processed token
  bool have_logits_ = false;
  std::vector<float> scratch_rows_;  // all-logits rows of one micro-batch
  RestoreReport last_restore_;
  int64_t recomputes_ = 0;
  int64_t tokens_run_ = 0, reused_tokens_ = 0;
  int64_t recorded_chunks_ = 0;  // full chunks already recorded in the prefix cache
  bool all_rows_wanted_ = false;  // feed() with all_logits is running
  std::vector<AdapterBinding> bindings_;
  AdapterSet active_;             // pinned for the current turn
  std::vector<AdapterKey> kv_adapters_;  // the set the KV in kv_ was computed with
};

}  // namespace ebb
