#include "runtime/generate.h"

#include <algorithm>

#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/engine.h"
#include "runtime/grammar/constraint.h"

namespace ebb {

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kMaxTokens: return "max_tokens";
    case StopReason::kEndOfGeneration: return "eog";
    case StopReason::kStopString: return "stop_string";
    case StopReason::kContextFull: return "context_full";
    case StopReason::kCancelled: return "cancelled";
  }
  return "?";
}

double GenerateStats::decode_tok_s() const {
  // The first token comes from the prefill's logits; the rest each cost one
  // decode step.
  return decode_seconds > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode_seconds : 0;
}

// Holds back text that might be the start of a stop string, and finds the
// first complete stop string.
class Generation::StopMatcher {
 public:
  explicit StopMatcher(const std::vector<std::string>& stops) : stops_(stops) {}

  // Adds text; returns the prefix that is now safe to emit. Sets stopped()
  // when a stop string is complete (the text from it on is discarded).
  std::string push(std::string_view piece) {
    held_ += piece;
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) {
      if (s.empty()) continue;
      const size_t at = held_.find(s);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
      stopped_ = true;
      std::string out = held_.substr(0, cut);
      held_.clear();
      return out;
    }
    // Keep the longest suffix that is a proper prefix of a stop string.
    size_t keep = 0;
    for (const std::string& s : stops_) {
      for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
      }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
  std::string flush() { return std::exchange(held_, {}); }
  bool stopped() const { return stopped_; }

 private:
  const std::vector<std::string>& stops_;
  std::string held_;
  bool stopped_ = false;
};

Generation::Generation(Session& session, std::span<const TokenId> prompt, const GenerateOptions& opts,
                       TextFn on_text)
    : session_(session),
      opts_(opts),
      on_text_(std::move(on_text)),
      // Constructing the sampler validates its options before any work is done.
      sampler_(opts.sampling, session.engine().config().n_vocab),
      decoder_(session.engine().tokenizer(), /*at_start=*/false),
      stops_(std::make_unique<StopMatcher>(opts_.stop_strings)),
      run_before_(session.tokens_run()),
      reused_before_(session.reused_tokens()) {
  session_.append(prompt);  // throws with the session unchanged when it does not fit
  // Penalties see the conversation so far.
  for (TokenId t : session_.tokens()) sampler_.accept(t);
  decoder_.show_special(opts_.shown_special_tokens);
  // The grammar sees only what is generated from here on.
  if (opts_.constraint) sampler_.set_constraint(opts_.constraint);
}

Generation::~Generation() = default;

bool Generation::step() {
  if (done_) return false;
  if (cancelled_) {
    finish(StopReason::kCancelled);
    return false;
  }
  if (session_.n_pending() > 0 || !session_.has_logits()) {
    if (!prefilled_ && progress_from_ < 0) progress_from_ = session_.n_processed();
    session_.step();
    if (!prefilled_ && opts_.prefill_progress) {
      const int64_t total = static_cast<int64_t>(session_.tokens().size());
      opts_.prefill_progress(session_.n_processed() - progress_from_, total - progress_from_);
    }
  }
  after_forward();
  return !done_;
}

void Generation::after_forward() {
  if (done_) return;
  if (cancelled_) {
    finish(StopReason::kCancelled);
    return;
  }
  if (session_.n_pending() > 0) return;  // more prefill, or a recompute
  if (!prefilled_) {
    // The prompt is in: logits for the first token are ready.
    prefilled_ = true;
    st_.prompt_tokens = session_.tokens_run() - run_before_;
    st_.cached_tokens = session_.reused_tokens() - reused_before_;
    st_.prefill_seconds = clock_.seconds();
  }
  sample_next();
}

void Generation::sample_next() {
  if (static_cast<int64_t>(st_.tokens.size()) >= opts_.max_tokens) {
    finish(StopReason::kMaxTokens);
    return;
  }
  const TokenId t = sampler_.sample(session_.last_logits());
  if (st_.tokens.empty()) decode_start_ = clock_.seconds();
  if (static_cast<int64_t>(session_.tokens().size()) + 1 > session_.n_ctx()) {
    finish(StopReason::kContextFull);  // t is neither shown nor kept
    return;
  }
  sampler_.accept(t);
  if (opts_.on_token) {
    if (opts_.logprobs >= 0) {
      const int top = static_cast<int>(std::min<int64_t>(opts_.logprobs, session_.engine().config().n_vocab));
      step_logprobs(session_.last_logits(), t, top, step_lp_);
    } else {
      step_lp_.id = t;
    }
    opts_.on_token(step_lp_);
  }
  st_.tokens.push_back(t);
  st_.generated_tokens = static_cast<int64_t>(st_.tokens.size());
  const Tokenizer& tok = session_.engine().tokenizer();
  // A grammar that is complete allows tokens without text (control tokens)
  // besides EOG; one of them ends a constrained output as EOG would, rather
  // than running on without text to max_tokens.
  const grammar::GrammarConstraint* c = sampler_.constraint();
  const bool eog = opts_.stop_at_eog &&
                   (tok.is_eog(t) || (c && c->is_complete() && tok.token_to_piece(t).empty()));
  const bool stop_token = std::find(opts_.stop_tokens.begin(), opts_.stop_tokens.end(), t) != opts_.stop_tokens.end();
  if (!eog && !stop_token) emit(stops_->push(decoder_.push(t)));
  // The token is kept either way: it runs next step, or first next turn.
  session_.append_pending(t);
  if (eog) finish(StopReason::kEndOfGeneration);
  else if (stop_token || stops_->stopped()) finish(StopReason::kStopString);
  else if (cancelled_) finish(StopReason::kCancelled);
  else if (st_.generated_tokens == opts_.max_tokens) finish(StopReason::kMaxTokens);
}

void Generation::emit(const std::string& text) {
  if (text.empty() || cancelled_) return;
  if (st_.ttft_seconds == 0) st_.ttft_seconds = clock_.seconds();
  st_.text += text;
  if (on_text_ && !on_text_(text)) cancelled_ = true;
}

void Generation::cancel() { cancelled_ = true; }

void Generation::finish(StopReason why) {
  if (done_) return;
  st_.stop = why;
  if (!prefilled_) {
    st_.prompt_tokens = session_.tokens_run() - run_before_;
    st_.cached_tokens = session_.reused_tokens() - reused_before_;
    st_.prefill_seconds = clock_.seconds();
  }
  if (!stops_->stopped()) emit(stops_->push(decoder_.flush()) + stops_->flush());
  st_.decode_seconds = st_.generated_tokens > 0 ? clock_.seconds() - decode_start_ : 0;
  if (st_.ttft_seconds == 0) st_.ttft_seconds = clock_.seconds();
  done_ = true;
}

GenerateStats generate(Session& session, std::span<const TokenId> prompt, const GenerateOptions& opts,
                       const TextFn& on_text) {
  Generation g(session, prompt, opts, on_text);
  while (g.step()) {
  }
  return g.stats();
}

}  // namespace ebb
