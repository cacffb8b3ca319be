#include "runtime/session.h"

#include <algorithm>
#include <cstring>

#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/device_kv.h"
#include "runtime/engine.h"

namespace ebb {

Session::Session(Engine& engine, SessionOptions opts) : engine_(engine), opts_(opts) {
  const ModelConfig& c = engine_.config();
  if (opts_.n_ctx <= 0) opts_.n_ctx = std::min<int64_t>(c.n_ctx_train, 4096);
  if (opts_.kv_chunk_size <= 0) opts_.kv_chunk_size = engine_.session_chunk_size(opts_.n_ctx);
  KvCacheOptions ko;
  ko.chunk_size = opts_.kv_chunk_size;
  ko.type = opts_.kv_type;
  ko.max_tokens = opts_.n_ctx;
  ko.f16_accumulator = opts_.f16_attention;
  if (engine_.device()) {
    // The device layers' KV lives on the device (F16, F32 attention); this
    // cache keeps their positions, and the rows of the layers that run on
    // the CPU (a split: -ngl N < n_layers).
    const std::string dev = engine_.device_id();
    if (opts_.kv_type != DType::kF16) throw Error("--kv-type f32: the KV cache on " + dev + " is F16 only");
    if (opts_.f16_attention) throw Error("--f16-attention runs on the CPU only, not on " + dev);
    ko.host_layers = engine_.device()->first_layer();
  }
  kv_ = std::make_unique<KvCache>(engine_.kv_pool(), ko);
  engine_.forward().ensure_chunk_size(opts_.kv_chunk_size);
  // Appending a token seldom reallocates (the context may be far larger
  // than any conversation gets).
  tokens_.reserve(static_cast<size_t>(std::min<int64_t>(opts_.n_ctx, 1 << 16)));
  logits_ = engine_.allocator().allocate(static_cast<size_t>(c.n_vocab) * sizeof(float), MemCategory::kScratch);
  engine_.attach(this);
}

Session::~Session() { engine_.detach(this); }

std::span<const float> Session::last_logits() const {
  EBB_CHECK_MSG(have_logits_, "no logits: nothing has been run yet");
  return {logits_.as<float>(), static_cast<size_t>(engine_.config().n_vocab)};
}

void Session::append_pending(TokenId t) {
  if (static_cast<int64_t>(tokens_.size()) + 1 > opts_.n_ctx) {
    throw Error("context full: the session's context holds " + std::to_string(opts_.n_ctx) + " tokens");
  }
  tokens_.push_back(t);
}

void Session::set_adapters(std::vector<AdapterBinding> bindings) {
  engine_.adapters().resolve(bindings);  // throws on an unknown name or version
  bindings_ = std::move(bindings);
}

void Session::release_adapters() {
  if (kv_->n_tokens() == static_cast<int64_t>(tokens_.size())) active_.clear();
}

void Session::begin_turn() {
  AdapterSet set = engine_.adapters().resolve(bindings_);
  int64_t rank = 0;
  for (const ActiveAdapter& a : set) rank = std::max(rank, a.v->lora->max_rank());
  engine_.forward().ensure_lora_rank(rank);
  std::vector<AdapterKey> keys = adapter_keys(set);
  if (keys != kv_adapters_ && kv_->n_tokens() > 0) {
    // The KV was computed under other adapters (or versions, or scales):
    // stale. The tokens stay; their KV is recomputed or found in the prefix
    // cache under the new key.
    make_resident();
    kv_->truncate(0);
    have_logits_ = false;
    recorded_chunks_ = 0;
  }
  kv_adapters_ = std::move(keys);
  active_ = std::move(set);
}

void Session::append(std::span<const TokenId> new_tokens) {
  const int64_t n_vocab = engine_.config().n_vocab;
  const int64_t total = static_cast<int64_t>(tokens_.size() + new_tokens.size());
  if (total > opts_.n_ctx) {
    throw Error("context full: " + std::to_string(total) + " tokens needed, the session's context holds " +
                std::to_string(opts_.n_ctx));
  }
  for (TokenId t : new_tokens) {
    if (t < 0 || t >= n_vocab) {
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    }
  }
  begin_turn();  // may throw (an adapter unloaded): nothing has changed yet
  tokens_.insert(tokens_.end(), new_tokens.begin(), new_tokens.end());
}

CacheKey Session::cache_key() const {
  CacheKey k;
  k.ns = opts_.cache_namespace;
  k.chunk_size = kv_->options().chunk_size;
  k.kv_type = kv_->options().type;
  k.f16_accumulator = kv_->options().f16_accumulator;
  k.adapters = kv_adapters_;
  return k;
}

void Session::reuse_prefix() {
  PrefixCache* pc = engine_.prefix_cache();
  if (!pc || !opts_.use_prefix_cache) return;
  const int64_t cs = kv_->options().chunk_size;
  // At least one token must run, for the logits.
  const int64_t most = (static_cast<int64_t>(tokens_.size()) - 1) / cs * cs;
  if (most <= kv_->n_tokens()) return;
  PrefixHit hit = pc->lookup(cache_key(), tokens_, most);
  if (hit.n_tokens <= kv_->n_tokens()) return;
  reused_tokens_ += hit.n_tokens - kv_->n_tokens();
  if (DeviceForward* dev = engine_.device()) {
    // The cached chunks past what the device holds go up in place of a prefill.
    const int64_t from = kv_->n_tokens() / cs;
    upload_kv_chunks(*dev, *kv_, from, std::span(hit.chunks).subspan(static_cast<size_t>(from)));
  }
  kv_->adopt(hit.chunks);  // the host layers' chunks (every layer's on the CPU, a split's CPU layers)
  recorded_chunks_ = static_cast<int64_t>(hit.chunks.size());
}

void Session::insert_into(PrefixCache& pc, const CacheKey& key, std::span<const TokenId> tokens) const {
  DeviceForward* dev = engine_.device();
  if (!dev) {
    pc.insert(key, tokens, *kv_);
    return;
  }
  // Only the chunks the cache lacks are read back (one submission).
  const int64_t cs = kv_->options().chunk_size;
  const int64_t full = std::min<int64_t>(static_cast<int64_t>(tokens.size()), kv_->n_tokens()) / cs;
  const int64_t first = std::min(full, pc.covered(key, tokens.first(static_cast<size_t>(full * cs))) / cs);
  if (first >= full) return;
  const std::vector<std::vector<KvChunkHandle>> chunks = download_kv_chunks(*dev, *kv_, first, full, engine_.kv_pool());
  pc.insert_chunks(key, tokens, first, chunks);
}

void Session::record_prefix() {
  PrefixCache* pc = engine_.prefix_cache();
  if (!pc || !opts_.use_prefix_cache) return;
  const int64_t full = kv_->n_tokens() / kv_->options().chunk_size;
  if (full <= recorded_chunks_) return;
  insert_into(*pc, cache_key(), tokens_);
  recorded_chunks_ = full;
}

Session::StepPart Session::prepare_step(int64_t n) {
  if (!all_rows_wanted_) reuse_prefix();
  if (n_pending() == 0 && !have_logits_ && !tokens_.empty()) {
    // Everything is in the KV but the logits were dropped (after truncate or
    // load): run the last token again to get them.
    kv_->truncate(static_cast<int64_t>(tokens_.size()) - 1);
  }
  n = std::min(n, n_pending());
  EBB_CHECK(n >= 1);
  // restore_generate: restoration starts now and this step runs alongside
  // it, each layer waiting only for its own latch.
  ElasticMemory* em = engine_.elastic();
  if (em && em->restore_pending()) em->begin_restore();
  const int64_t pos = kv_->n_tokens();
  kv_->reserve(pos + n);
  return {kv_.get(), {tokens_.data() + pos, static_cast<size_t>(n)}, logits_.as<float>(), &active_};
}

void Session::finish_step(int64_t n) {
  tokens_run_ += n;
  have_logits_ = true;
  if (n_pending() == 0) {
    settle_restore();
    if (kv_->lost_from() == kv_->n_tokens()) record_prefix();
  }
}

void Session::settle_restore() {
  ElasticMemory* em = engine_.elastic();
  if (em && em->restoring()) last_restore_ = em->wait_restored();
  // KV that could not be restored (a corrupt or missing swap slot) is
  // recomputed from the session's tokens, and so is everything computed on it.
  const int64_t lost = kv_->lost_from();
  if (lost < kv_->n_tokens()) {
    kv_->truncate(lost);
    have_logits_ = false;
    ++recomputes_;
  }
}

int64_t Session::step(int64_t max_tokens) {
  const int64_t cap = max_tokens > 0 ? max_tokens : engine_.forward().max_batch();
  if (n_pending() == 0 && !have_logits_ && !tokens_.empty()) kv_->truncate(static_cast<int64_t>(tokens_.size()) - 1);
  const int64_t n = std::min({cap, n_pending(), engine_.forward().max_batch()});
  if (n == 0) {
    settle_restore();
    return 0;
  }
  const StepPart p = prepare_step(n);
  const int64_t ran = static_cast<int64_t>(p.tokens.size());
  const Stopwatch sw;
  engine_.forward().run(p.tokens, *p.kv, p.logits, false, engine_.weight_source(), p.adapters);
  note_cost(ran, sw.seconds());
  finish_step(ran);
  return ran;
}

void Session::note_cost(int64_t n, double seconds) {
  // Prefill micro-batches measure Ĉ_recompute for the prefix cache.
  if (PrefixCache* pc = engine_.prefix_cache(); pc && n >= 16) pc->note_prefill_cost(seconds / static_cast<double>(n));
}

void Session::fork_from(const Session& other, int64_t n) {
  EBB_CHECK(&other.engine_ == &engine_ && n >= 0 && n <= other.kv_->n_tokens() && &other != this);
  if (other.kv_->options().chunk_size != kv_->options().chunk_size || other.kv_->options().type != kv_->options().type) {
    throw Error("cannot share KV between sessions of different chunk sizes or KV types");
  }
  if (n > opts_.n_ctx) throw Error("context full: " + std::to_string(n) + " tokens, the session's context holds " +
                                   std::to_string(opts_.n_ctx));
  make_resident();
  if (DeviceForward* dev = engine_.device()) {
    dev->copy_kv(*other.kv_, *kv_, n);  // on the device, one submission
    kv_->share_from(*other.kv_, n);     // a split's CPU layers: shared as on the CPU
  } else {
    kv_->share_from(*other.kv_, n);
  }
  tokens_.assign(other.tokens_.begin(), other.tokens_.begin() + n);
  kv_adapters_ = other.kv_adapters_;  // the KV was computed under the other's adapters
  // At the other's end with its logits at hand: they are this session's too
  // (n choices of one prompt sample from one prefill).
  have_logits_ = n == other.kv_->n_tokens() && other.have_logits_;
  if (have_logits_)
    std::memcpy(logits_.as<float>(), other.logits_.as<float>(),
                static_cast<size_t>(engine_.config().n_vocab) * sizeof(float));
  recorded_chunks_ = std::min(other.recorded_chunks_, n / kv_->options().chunk_size);
}

std::span<const float> Session::feed(std::span<const TokenId> new_tokens, std::vector<float>* all_logits,
                                     const ProgressFn& progress) {
  const int64_t n_vocab = engine_.config().n_vocab;
  const int64_t before = static_cast<int64_t>(tokens_.size());
  append(new_tokens);  // throws before anything changes
  const int64_t total = static_cast<int64_t>(tokens_.size());
  if (n_pending() == 0 && !have_logits_ && total > 0) kv_->truncate(total - 1);
  const int64_t start = kv_->n_tokens();
  if (all_logits) all_logits->assign(static_cast<size_t>((total - start) * n_vocab), 0.0f);
  ElasticMemory* em = engine_.elastic();
  // Every row's logits are wanted: no prefix may be taken from the cache.
  struct RowsWanted {
    bool& flag;
    ~RowsWanted() { flag = false; }
  } rows_wanted{all_rows_wanted_};
  all_rows_wanted_ = all_logits != nullptr;
  try {
    run_to_end(all_logits, start, progress);
    settle_restore();
    run_to_end(all_logits, start, progress);  // what could not be restored
  } catch (...) {
    // Never leave a restore running under a session that is being torn
    // down or reused.
    if (em && em->restoring()) {
      try {
        em->wait_restored();
      } catch (const Error&) {
      }
    }
    // The failed call adds nothing: its tokens go, so a later turn does not
    // carry them; what the conversation held before stays (its KV is
    // recomputed from the tokens where it cannot be restored).
    tokens_.resize(static_cast<size_t>(before));
    if (kv_->n_tokens() > before) {
      kv_->truncate(before);
      have_logits_ = false;
    }
    throw;
  }
  return last_logits();
}

void Session::run_to_end(std::vector<float>* all_logits, int64_t rows_from, const ProgressFn& progress) {
  Forward& fwd = engine_.forward();
  const int64_t n_vocab = engine_.config().n_vocab;
  const int64_t begin = kv_->n_tokens();
  while (n_pending() > 0) {
    const StepPart p = prepare_step(std::min(fwd.max_batch(), n_pending()));
    const int64_t n = static_cast<int64_t>(p.tokens.size());
    const int64_t pos = kv_->n_tokens();
    const Stopwatch sw;
    if (all_logits && pos + n > rows_from) {
      // Rows before rows_from (recomputed ones) are not the caller's.
      scratch_rows_.resize(static_cast<size_t>(n * n_vocab));
      fwd.run(p.tokens, *p.kv, scratch_rows_.data(), true, engine_.weight_source(), p.adapters);
      for (int64_t t = std::max(pos, rows_from); t < pos + n; ++t)
        std::memcpy(all_logits->data() + (t - rows_from) * n_vocab, scratch_rows_.data() + (t - pos) * n_vocab,
                    n_vocab * sizeof(float));
      std::memcpy(logits_.as<float>(), scratch_rows_.data() + (n - 1) * n_vocab, n_vocab * sizeof(float));
    } else {
      fwd.run(p.tokens, *p.kv, p.logits, false, engine_.weight_source(), p.adapters);
    }
    note_cost(n, sw.seconds());
    finish_step(n);
    if (progress) progress(kv_->n_tokens() - begin, static_cast<int64_t>(tokens_.size()) - begin);
  }
}

void Session::make_resident() {
  ElasticMemory* em = engine_.elastic();
  if (!em || em->fully_resident()) return;
  last_restore_ = em->restore();
  if (kv_->lost_from() < kv_->n_tokens()) {
    // Recomputed by the next feed(): the tokens are all still here.
    kv_->truncate(kv_->lost_from());
    have_logits_ = false;
  }
}

void Session::truncate(int64_t n) {
  EBB_CHECK(n >= 0 && n <= static_cast<int64_t>(tokens_.size()));
  make_resident();
  tokens_.resize(static_cast<size_t>(n));
  if (kv_->n_tokens() > n) {
    kv_->truncate(n);
    have_logits_ = false;
  }
}

}  // namespace ebb
