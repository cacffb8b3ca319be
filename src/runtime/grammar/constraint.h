// The sampler-facing grammar constraint of one sequence: which tokens may
// come next, and advancing by the token chosen.
//
// Rules, per token id:
//  - a token with bytes (a trie token) is allowed when the grammar can take
//    its bytes from the current state (it may end inside a UTF-8 character:
//    the state keeps the partial character);
//  - an end-of-generation token (Tokenizer::is_eog) is allowed exactly when
//    the grammar is complete (an accepting state);
//  - a token with an empty piece (a control token) is allowed only when the
//    grammar is complete, since it adds no text;
//  - ids the vocabulary does not have (a logits row wider than the
//    tokenizer, as Qwen's 151,936 vs its tokenizer) are never allowed.
//
// Cost: fill_mask() walks the token trie once from the current state,
// skipping every subtree whose prefix is refused, with one table lookup per
// trie node once the matcher's DFA has seen the states. A subtree is taken
// whole, unvisited, when every path below it keeps to the state's uniform
// chain (GrammarMatcher::uniform: inside a string, each character leads to
// the same state, or to the next count of a bounded one) for as long as the
// subtree is deep; allows() checks one
// token (the fast path: check the sampled token, mask only when refused).
// Buffers are sized at construction; a step in a state seen before allocates
// nothing. Masks of wide states are cached (ConstraintOptions), so a state
// met again costs a bitset expansion instead of a walk.
//
// Lazy constraints (ConstraintOptions::lazy): inactive, allowing everything,
// until a trigger token is accepted or a trigger word appears in the
// accepted text; the grammar is then fed the text from the trigger's start
// (the trigger token's piece, or the trigger word and what followed it in
// the same token) and constrains every token after. A grammar for a lazy
// constraint therefore begins with its trigger, e.g.
// root ::= "<tool_call>" ...
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/grammar/grammar.h"
#include "runtime/grammar/grammar_matcher.h"
#include "runtime/grammar/token_trie.h"

namespace ebb::grammar {

struct ConstraintOptions {
  bool lazy = false;
  std::vector<int32_t> trigger_tokens;     // lazy: accepting one of these activates
  std::vector<std::string> trigger_words;  // lazy: one appearing in the text activates
  MatcherLimits limits;
  // Masks of wide states (those whose trie walk visits many nodes, such as
  // the inside of a JSON string, met at every token of a long string) are
  // kept as bitsets ([n_vocab] bits each) and reused when the state comes
  // back. 0: no cache.
  size_t mask_cache_entries = 16;
};

class GrammarConstraint {
 public:
  // Throws ebb::Error when a lazy constraint has no trigger, or a trigger
  // word is empty.
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocab,
                    ConstraintOptions opts = {});
  GrammarConstraint(GrammarConstraint&&) = default;
  GrammarConstraint& operator=(GrammarConstraint&&) = default;
  GrammarConstraint& operator=(const GrammarConstraint&) = delete;
  // An independent constraint in the same state, with the matcher's DFA and
  // the mask cache as warmed so far (a server can keep one warmed constraint
  // per grammar and copy it per request).
  GrammarConstraint copy() const { return GrammarConstraint(*this); }

  // False while a lazy constraint waits for its trigger.
  bool active() const { return active_; }
  // True when `token` may come next (always, while inactive).
  bool allows(int32_t token);
  // allowed: [n] with n >= 1 (usually the logits row); sets allowed[id] = 1
  // for every token that may come next and 0 for the rest. Returns how many
  // are allowed.
  size_t fill_mask(std::span<uint8_t> allowed);
  // Advances by `token`. Throws ebb::Error naming the token when the grammar
  // does not allow it (the state is unchanged), or when a lazy trigger's
  // text is refused by the grammar.
  void accept(int32_t token);
  // Active and the text so far is a complete sentence of the grammar.
  bool is_complete() const { return active_ && matcher_.is_accepting(); }
  // Back to the start (and, when lazy, to waiting for the trigger).
  void reset();

  const TokenTrie& vocab() const { return *vocab_; }
  GrammarMatcher& matcher() { return matcher_; }

 private:
  GrammarConstraint(const GrammarConstraint& other);  // copy() makes the cost explicit
  void activate_with(std::string_view text);

  std::shared_ptr<const TokenTrie> vocab_;
  ConstraintOptions opts_;
  GrammarMatcher matcher_;
  bool active_ = true;
  std::string recent_;  // lazy: the tail of the accepted text, shorter than the longest trigger word
  size_t max_word_ = 0;
  std::vector<GrammarMatcher::StateId> depth_states_;  // [max_depth + 1] scratch for the trie walk
  std::vector<int32_t> depth_chain_;   // [max_depth + 1] position in chain_ of depth_states_, -1: none
  // The walk's start state and its uniform successors (GrammarMatcher::
  // uniform): chain_[j] is where j characters of the uniform kind lead.
  std::vector<GrammarMatcher::StateId> chain_;
  std::vector<GrammarMatcher::Uniform> chain_u_;  // uniform(chain_[j])
  // Over positions j..chain_last_ (the last with a successor; with a loop,
  // the loop's position): the ASCII bytes every one of them takes, and
  // whether every one takes all non-ASCII characters.
  std::vector<std::array<uint64_t, 2>> chain_ascii_;
  std::vector<uint8_t> chain_non_ascii_;
  int64_t chain_last_ = -1;
  bool chain_loops_ = false;
  void build_chain(GrammarMatcher::StateId start);

  struct CachedMask {
    GrammarMatcher::StateId state = -1;
    size_t n_ids = 0;      // the mask's length
    size_t count = 0;      // allowed tokens
    uint64_t last_use = 0;
    std::vector<uint64_t> bits;  // [ceil(n_ids / 64)]
  };
  std::vector<CachedMask> mask_cache_;  // [mask_cache_entries]
  uint64_t use_clock_ = 0;
};

}  // namespace ebb::grammar
