#include "runtime/grammar/constraint.h"

#include <algorithm>

#include "platform/error.h"

namespace ebb::grammar {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocab,
                                     ConstraintOptions opts)
    : vocab_(std::move(vocab)), opts_(std::move(opts)), matcher_(std::move(grammar), opts_.limits) {
  EBB_CHECK(vocab_ != nullptr);
  if (opts_.lazy && opts_.trigger_tokens.empty() && opts_.trigger_words.empty())
    throw Error("grammar constraint: lazy, but no trigger token or word");
  for (const std::string& w : opts_.trigger_words) {
    if (w.empty()) throw Error("grammar constraint: an empty trigger word");
    max_word_ = std::max(max_word_, w.size());
  }
  active_ = !opts_.lazy;
  depth_states_.resize(vocab_->max_depth() + 1);
  depth_chain_.resize(vocab_->max_depth() + 1);
  chain_.reserve(vocab_->max_depth() + 2);
  chain_u_.reserve(vocab_->max_depth() + 2);
  chain_ascii_.reserve(vocab_->max_depth() + 2);
  chain_non_ascii_.reserve(vocab_->max_depth() + 2);
  mask_cache_.resize(opts_.mask_cache_entries);
}

GrammarConstraint::GrammarConstraint(const GrammarConstraint& o)
    : vocab_(o.vocab_),
      opts_(o.opts_),
      matcher_(o.matcher_.copy()),
      active_(o.active_),
      recent_(o.recent_),
      max_word_(o.max_word_),
      depth_states_(o.depth_states_),
      depth_chain_(o.depth_chain_),
      mask_cache_(o.mask_cache_),
      use_clock_(o.use_clock_) {}

void GrammarConstraint::reset() {
  matcher_.reset();
  active_ = !opts_.lazy;
  recent_.clear();
}

bool GrammarConstraint::allows(int32_t token) {
  if (!active_) return true;
  if (token < 0 || token >= vocab_->n_vocab()) return false;
  const bool complete = matcher_.is_accepting();
  if (vocab_->is_eog(token)) return complete;
  const std::string_view p = vocab_->piece(token);
  if (p.empty()) return complete;
  return matcher_.run(matcher_.state(), p) != GrammarMatcher::kReject;
}

size_t GrammarConstraint::fill_mask(std::span<uint8_t> allowed) {
  if (!active_) {
    std::fill(allowed.begin(), allowed.end(), uint8_t{1});
    return allowed.size();
  }
  const GrammarMatcher::StateId state = matcher_.state();
  for (CachedMask& c : mask_cache_) {
    if (c.state != state || c.n_ids != allowed.size()) continue;
    c.last_use = ++use_clock_;
    for (size_t w = 0; w < c.bits.size(); ++w) {
      const uint64_t word = c.bits[w];
      const size_t base = w * 64, end = std::min(base + 64, allowed.size());
      if (word == 0) {
        std::fill(allowed.begin() + static_cast<ptrdiff_t>(base), allowed.begin() + static_cast<ptrdiff_t>(end), uint8_t{0});
      } else {
        for (size_t i = base; i < end; ++i) allowed[i] = static_cast<uint8_t>((word >> (i - base)) & 1);
      }
    }
    return c.count;
  }
  std::fill(allowed.begin(), allowed.end(), uint8_t{0});
  const size_t n_ids = std::min(allowed.size(), static_cast<size_t>(vocab_->n_vocab()));
  const auto& nodes = vocab_->nodes();
  const int32_t* toks = vocab_->node_tokens().data();
  const auto& below = vocab_->below();
  const auto& below_flags = vocab_->below_flags();
  GrammarMatcher::StateId* states = depth_states_.data();
  states[0] = state;
  const auto& height = vocab_->height();
  int32_t* cpos = depth_chain_.data();
  cpos[0] = 0;
  build_chain(state);
  size_t count = 0, visited = 0;
  const size_t n = nodes.size();
  for (size_t i = 0; i < n; ++visited) {
    const TokenTrie::Node& nd = nodes[i];
    const GrammarMatcher::StateId t = matcher_.step(states[nd.depth - 1], nd.byte);
    if (t == GrammarMatcher::kReject) {
      i = nd.subtree_end;  // no token below this prefix can be taken
      continue;
    }
    // Where t is on the chain: back at the start, or one uniform ASCII
    // character further than the parent.
    int32_t q = -1;
    const int32_t p = cpos[nd.depth - 1];
    if (t == state) {
      q = 0;
    } else if (p >= 0 && p <= chain_last_ && nd.byte != 0 && nd.byte < 0x80 &&
               ((chain_u_[static_cast<size_t>(p)].ascii[nd.byte >> 6] >> (nd.byte & 63)) & 1)) {
      q = chain_loops_ && p == chain_last_ ? p : p + 1;
    }
    cpos[nd.depth] = q;
    if (q >= 0 && q <= chain_last_ && nd.subtree_end > i + 1) {
      // Take the subtree whole if the chain from q takes every byte below
      // for as many characters as the subtree is deep.
      const bool non_ascii = below_flags[i] & TokenTrie::kBelowNonAscii;
      const auto& a = chain_ascii_[static_cast<size_t>(q)];
      const bool ok = (chain_loops_ || q + static_cast<int64_t>(height[i]) - 1 <= chain_last_) &&
                      (below[i][0] & ~a[0]) == 0 && (below[i][1] & ~a[1]) == 0 &&
                      (!non_ascii || ((below_flags[i] & TokenTrie::kBelowUtf8) && chain_non_ascii_[static_cast<size_t>(q)]));
      if (ok) {
        const uint32_t end = vocab_->subtree_tok_end(i);
        for (uint32_t k = nd.tok_begin; k < end; ++k) {
          const auto id = static_cast<size_t>(toks[k]);
          if (id < n_ids) {
            allowed[id] = 1;
            ++count;
          }
        }
        i = nd.subtree_end;
        continue;
      }
    }
    states[nd.depth] = t;
    for (uint32_t k = nd.tok_begin; k < nd.tok_end; ++k) {
      const auto id = static_cast<size_t>(toks[k]);
      if (id < n_ids) {
        allowed[id] = 1;
        ++count;
      }
    }
    ++i;
  }
  if (matcher_.is_accepting()) {
    for (const int32_t id : vocab_->eog_tokens())
      if (static_cast<size_t>(id) < n_ids) allowed[static_cast<size_t>(id)] = 1, ++count;
    for (const int32_t id : vocab_->empty_tokens())
      if (static_cast<size_t>(id) < n_ids) allowed[static_cast<size_t>(id)] = 1, ++count;
  }
  // Keep the mask of a wide state (packing costs about as much as walking
  // a tenth of the trie, so only walks of more than that are kept).
  if (!mask_cache_.empty() && visited > n / 10) {
    CachedMask* slot = &mask_cache_[0];
    for (CachedMask& c : mask_cache_)
      if (c.last_use < slot->last_use) slot = &c;
    slot->state = state;
    slot->n_ids = allowed.size();
    slot->count = count;
    slot->last_use = ++use_clock_;
    slot->bits.assign((allowed.size() + 63) / 64, 0);
    for (size_t i = 0; i < allowed.size(); ++i) slot->bits[i / 64] |= uint64_t{allowed[i]} << (i % 64);
  }
  return count;
}

void GrammarConstraint::build_chain(GrammarMatcher::StateId start) {
  chain_.clear();
  chain_u_.clear();
  chain_loops_ = false;
  // Follow uniform successors until one has none, loops, or the chain is as
  // long as the longest token.
  for (GrammarMatcher::StateId s = start; s != GrammarMatcher::kReject && chain_.size() <= vocab_->max_depth();) {
    chain_.push_back(s);
    chain_u_.push_back(matcher_.uniform(s));
    const GrammarMatcher::StateId next = chain_u_.back().next;
    if (next == s) {
      chain_loops_ = true;
      break;
    }
    s = next;
  }
  // The last position with a successor.
  chain_last_ = static_cast<int64_t>(chain_.size()) - 1;
  if (!chain_loops_ && chain_last_ >= 0 && chain_u_.back().next == GrammarMatcher::kReject) --chain_last_;
  chain_ascii_.resize(chain_.size());
  chain_non_ascii_.resize(chain_.size());
  std::array<uint64_t, 2> a = {~uint64_t{0}, ~uint64_t{0}};
  bool na = true;
  for (int64_t j = chain_last_; j >= 0; --j) {
    const auto& u = chain_u_[static_cast<size_t>(j)];
    a[0] &= u.ascii[0];
    a[1] &= u.ascii[1];
    na = na && u.non_ascii;
    chain_ascii_[static_cast<size_t>(j)] = a;
    chain_non_ascii_[static_cast<size_t>(j)] = na;
  }
}

void GrammarConstraint::activate_with(std::string_view text) {
  active_ = true;
  recent_.clear();
  if (!matcher_.accept_bytes(text))
    throw Error("grammar constraint: the grammar refuses the text from its lazy trigger on: \"" + std::string(text) +
                "\" (a lazy grammar must begin with its trigger)");
}

void GrammarConstraint::accept(int32_t token) {
  if (token < 0 || token >= vocab_->n_vocab()) {
    if (!active_) return;
    throw Error("grammar constraint: token " + std::to_string(token) + " is outside the vocabulary");
  }
  const std::string_view p = vocab_->piece(token);
  if (!active_) {
    if (std::find(opts_.trigger_tokens.begin(), opts_.trigger_tokens.end(), token) != opts_.trigger_tokens.end()) {
      activate_with(p);
      return;
    }
    if (max_word_ == 0) return;
    recent_ += p;
    size_t best = std::string::npos;
    for (const std::string& w : opts_.trigger_words) best = std::min(best, recent_.find(w));
    if (best != std::string::npos) {
      const std::string text = recent_.substr(best);
      activate_with(text);
      return;
    }
    if (recent_.size() >= max_word_) recent_.erase(0, recent_.size() - (max_word_ - 1));
    return;
  }
  if (vocab_->is_eog(token) || p.empty()) {
    if (!matcher_.is_accepting())
      throw Error("grammar constraint: token " + std::to_string(token) +
                  (vocab_->is_eog(token) ? " ends generation" : " is a control token") +
                  " but the grammar is not complete");
    return;
  }
  if (!matcher_.accept_bytes(p))
    throw Error("grammar constraint: token " + std::to_string(token) + " (\"" + std::string(p) +
                "\") is not allowed by the grammar here");
  if (matcher_.trim())
    for (CachedMask& c : mask_cache_) c.state = -1;  // the state ids changed
}

}  // namespace ebb::grammar
