#include "runtime/session.h"

#include <algorithm>
#include <cstring>

#include "platform/error.h"
#include "runtime/engine.h"

namespace ebb {

Session::Session(Engine& engine, SessionOptions opts) : engine_(engine), opts_(opts) {
  const ModelConfig& c = engine_.config();
  if (opts_.n_ctx <= 0) opts_.n_ctx = std::min<int64_t>(c.n_ctx_train, 4096);
  if (opts_.kv_chunk_size <= 0) opts_.kv_chunk_size = engine_.options().kv_chunk_size;
  KvCacheOptions ko;
  ko.chunk_size = opts_.kv_chunk_size;
  ko.type = opts_.kv_type;
  ko.max_tokens = opts_.n_ctx;
  ko.f16_accumulator = opts_.f16_attention;
  kv_ = std::make_unique<KvCache>(KvShape{c.n_layer, c.n_head_kv, c.head_dim}, ko, &engine_.allocator());
  engine_.forward().ensure_chunk_size(opts_.kv_chunk_size);
  tokens_.reserve(static_cast<size_t>(opts_.n_ctx));  // appending a token never reallocates
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
    throw Error("context full: the session's context holds " + std::to_string(opts_.n_ctx) + " tokens (raise --ctx)");
  }
  tokens_.push_back(t);
}

std::span<const float> Session::feed(std::span<const TokenId> new_tokens, std::vector<float>* all_logits,
                                     const ProgressFn& progress) {
  const int64_t n_vocab = engine_.config().n_vocab;
  const int64_t total = static_cast<int64_t>(tokens_.size() + new_tokens.size());
  if (total > opts_.n_ctx) {
    throw Error("context full: " + std::to_string(total) + " tokens needed, the session's context holds " +
                std::to_string(opts_.n_ctx) + " (raise --ctx)");
  }
  for (TokenId t : new_tokens) {
    if (t < 0 || t >= n_vocab) {
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    }
  }
  kv_->reserve(total);  // plan: all chunks this call needs, before running
  tokens_.insert(tokens_.end(), new_tokens.begin(), new_tokens.end());

  ElasticMemory* em = engine_.elastic();
  // restore_generate: restoration starts now and this request's prefill runs
  // alongside it, each layer waiting only for its own latch.
  if (em && em->restore_pending()) em->begin_restore();
  if (kv_->n_tokens() == total && !have_logits_ && total > 0) {
    // Everything is in the KV but the logits were dropped (after truncate or
    // load): run the last token again to get them.
    kv_->set_n_tokens(total - 1);
  }
  const int64_t start = kv_->n_tokens();
  if (all_logits) all_logits->assign(static_cast<size_t>((total - start) * n_vocab), 0.0f);
  try {
    run_to_end(all_logits, start, progress);
    if (em && em->restoring()) last_restore_ = em->wait_restored();
  } catch (...) {
    // The tokens stay; the next feed runs what is left. Never leave a
    // restore running under a session that is being torn down or reused.
    if (em && em->restoring()) {
      try {
        em->wait_restored();
      } catch (const Error&) {
      }
    }
    throw;
  }
  // KV that could not be restored (a corrupt or missing swap slot) is
  // recomputed from the session's tokens, and so is everything computed on it.
  if (kv_->lost_from() < kv_->n_tokens()) {
    const int64_t from = kv_->lost_from();
    kv_->clear_lost();
    kv_->truncate(from);
    kv_->reserve(total);
    ++recomputes_;
    run_to_end(all_logits, start, progress);
  }
  kv_->clear_lost();
  return last_logits();
}

void Session::run_to_end(std::vector<float>* all_logits, int64_t rows_from, const ProgressFn& progress) {
  Forward& fwd = engine_.forward();
  const int64_t n_vocab = engine_.config().n_vocab;
  const int64_t total = static_cast<int64_t>(tokens_.size());
  const int64_t begin = kv_->n_tokens();
  int64_t pos = begin;
  while (pos < total) {
    const int64_t n = std::min(fwd.max_batch(), total - pos);
    std::span<const TokenId> batch(tokens_.data() + pos, static_cast<size_t>(n));
    if (all_logits && pos + n > rows_from) {
      // Rows before rows_from (recomputed ones) are not the caller's.
      scratch_rows_.resize(static_cast<size_t>(n * n_vocab));
      fwd.run(batch, *kv_, scratch_rows_.data(), true, engine_.weight_source());
      for (int64_t t = std::max(pos, rows_from); t < pos + n; ++t)
        std::memcpy(all_logits->data() + (t - rows_from) * n_vocab, scratch_rows_.data() + (t - pos) * n_vocab,
                    n_vocab * sizeof(float));
      std::memcpy(logits_.as<float>(), scratch_rows_.data() + (n - 1) * n_vocab, n_vocab * sizeof(float));
    } else {
      fwd.run(batch, *kv_, logits_.as<float>(), false, engine_.weight_source());
    }
    pos += n;
    have_logits_ = true;
    if (progress) progress(pos - begin, total - begin);
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
  kv_->clear_lost();
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
