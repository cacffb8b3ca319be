#include "runtime/generate.h"

#include <algorithm>

#include "platform/error.h"
#include "platform/timer.h"
#include "runtime/engine.h"

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

namespace {

// Holds back text that might be the start of a stop string, and finds the
// first complete stop string.
class StopMatcher {
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

}  // namespace

GenerateStats generate(Session& session, std::span<const TokenId> prompt, const GenerateOptions& opts,
                       const TextFn& on_text) {
  Engine& engine = session.engine();
  const Tokenizer& tok = engine.tokenizer();
  GenerateStats st;
  const Stopwatch clock;

  // Constructing the sampler validates its options before any work is done.
  Sampler sampler(opts.sampling, engine.config().n_vocab);
  const int64_t before = session.n_processed();
  std::span<const float> logits = session.feed(prompt, nullptr, opts.prefill_progress);
  st.prompt_tokens = session.n_processed() - before;
  st.prefill_seconds = clock.seconds();

  // Penalties see the conversation so far.
  for (TokenId t : session.tokens()) sampler.accept(t);

  StreamDecoder decoder(tok, /*at_start=*/false);
  StopMatcher stops(opts.stop_strings);
  double decode_start = 0;
  bool cancelled = false;
  auto emit = [&](const std::string& text) {
    if (text.empty() || cancelled) return;
    if (st.ttft_seconds == 0) st.ttft_seconds = clock.seconds();
    st.text += text;
    if (on_text && !on_text(text)) cancelled = true;
  };

  for (int64_t i = 0; i < opts.max_tokens; ++i) {
    const TokenId t = sampler.sample(logits);
    if (i == 0) decode_start = clock.seconds();
    if (static_cast<int64_t>(session.tokens().size()) + 1 > session.n_ctx()) {
      st.stop = StopReason::kContextFull;  // t is neither shown nor kept
      break;
    }
    sampler.accept(t);
    st.tokens.push_back(t);
    st.generated_tokens = static_cast<int64_t>(st.tokens.size());
    const bool eog = opts.stop_at_eog && tok.is_eog(t);
    if (!eog) emit(stops.push(decoder.push(t)));
    if (eog || stops.stopped() || cancelled || i + 1 == opts.max_tokens) {
      // The turn ends here; the last token is kept and runs next turn.
      session.append_pending(t);
      st.stop = eog ? StopReason::kEndOfGeneration
                : stops.stopped() ? StopReason::kStopString
                : cancelled ? StopReason::kCancelled
                : StopReason::kMaxTokens;
      break;
    }
    const TokenId one[1] = {t};
    logits = session.feed(one);
  }
  if (!stops.stopped()) emit(stops.push(decoder.flush()) + stops.flush());
  st.decode_seconds = st.generated_tokens > 0 ? clock.seconds() - decode_start : 0;
  if (st.ttft_seconds == 0) st.ttft_seconds = clock.seconds();
  return st;
}

}  // namespace ebb
