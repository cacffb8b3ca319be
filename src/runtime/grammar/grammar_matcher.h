// The incremental state of one sequence under a grammar (grammar.h).
//
// Engine: a pushdown recognizer over Unicode code points. A "stack" is a
// chain of positions in the grammar's elements (what is left to match, top
// first); a parse state is the set of stacks alive after the text so far,
// plus a partial UTF-8 character when the bytes so far end inside one.
// Stacks are hash-consed into an arena of nodes (position, parent), so a
// stack is one int and pushing shares the tail; the closure of a node (the
// stacks with a character set on top that it expands to) is computed once.
// Right recursion through a rule's last element does not grow the stack
// (the continuation of a reference at the end of an alternative is its
// parent), so `x*` runs in constant stack depth.
//
// On top of that, the matcher is a lazily built byte DFA: each distinct
// parse state gets a StateId, and step(state, byte) is a table lookup after
// the first time. Walking a token trie (token_trie.h) is then one lookup per
// trie node, which is what keeps masking a 150k vocabulary cheap.
//
// Bytes are checked as strict UTF-8 (no overlong forms, no surrogates,
// nothing past U+10FFFF): a lead byte is accepted only if some stack could
// take a code point starting with it; a continuation byte without a lead,
// or a malformed sequence, is rejected. The grammar can end (accepting)
// only outside a partial character. When every stack left would take every
// code point the bytes so far can still become, the partial bits are
// dropped from the state, so the inside of a string has a handful of
// partial states rather than one per lead and continuation byte.
//
// Errors: a grammar whose rules nest thousands deep at their starts throws
// ebb::Error from the constructor (or the first step that meets it) rather
// than exhausting the stack.
//
// Caches grow with the distinct states met; trim() (called by the owner
// between tokens) rebuilds them around the current state when they pass the
// limits, so memory stays bounded over a long generation. StateIds other
// than state() are invalid after trim().
//
// Not thread-safe; one matcher per sequence. The Grammar is shared.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/grammar/grammar.h"

namespace ebb::grammar {

struct MatcherLimits {
  uint32_t max_stack_depth = 8192;  // deeper nesting is rejected
  size_t max_states = 16384;        // DFA states kept (1 KiB of transitions each) before trim() rebuilds
  size_t max_nodes = 1u << 22;      // stack nodes kept before trim() rebuilds
};

class GrammarMatcher {
 public:
  using StateId = int32_t;
  static constexpr StateId kReject = -1;

  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar, MatcherLimits limits = {});
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;
  GrammarMatcher(GrammarMatcher&&) = default;
  GrammarMatcher& operator=(GrammarMatcher&&) = default;
  // An independent matcher in the same state with the same caches (a few
  // MB at most): start each request from a warmed copy and its first masks
  // are as cheap as the steady state.
  GrammarMatcher copy() const { return GrammarMatcher(*this); }

  // The state after everything accepted so far.
  StateId state() const { return state_; }
  // The state after one more byte, or kReject. Cached: a lookup after the first call.
  StateId step(StateId s, uint8_t byte) {
    const StateId t = trans_[static_cast<size_t>(s) * 256 + byte];
    return t != kUnknown ? t : compute_step(s, byte);
  }
  // The state after `bytes`, or kReject at the first byte refused.
  StateId run(StateId s, std::string_view bytes);
  // True when the text up to `s` is a complete sentence of the grammar.
  bool is_accepting(StateId s) const { return states_[static_cast<size_t>(s)].accepting; }
  bool is_accepting() const { return is_accepting(state_); }
  // True when `s` is inside a UTF-8 character.
  bool in_partial_char(StateId s) const { return states_[static_cast<size_t>(s)].partial_left != 0; }

  // How `s` moves on one character when many characters move it alike:
  // `ascii` holds the ASCII bytes 1-127 that all lead to `next` (the
  // successor most of them share: `s` itself inside an unbounded string,
  // the next count inside a bounded one); `non_ascii` says every character
  // >= U+0080, in valid UTF-8, leads there too (each byte taken on the way).
  // Fewer than 8 such bytes and no non-ASCII: next = kReject, ascii empty.
  // Computed once per state. The reference is invalidated by the next step.
  struct Uniform {
    std::array<uint64_t, 2> ascii;
    StateId next;
    bool non_ascii;
  };
  const Uniform& uniform(StateId s);

  // Advances by `bytes`; on refusal returns false and leaves the state as it was.
  bool accept_bytes(std::string_view bytes);
  bool can_accept_bytes(std::string_view bytes) { return run(state_, bytes) != kReject; }
  // Back to the start of the grammar (keeps the caches).
  void reset();
  // Rebuilds the caches around state() when they passed the limits; true
  // when it did (every StateId but the new state() is then invalid).
  bool trim();

  // The same check as run(s, bytes) != kReject, computed from the stacks
  // without reading or filling the DFA table: the reference the tests compare
  // the cached path against.
  bool reference_accepts(StateId s, std::string_view bytes, bool require_complete = false);

  const Grammar& grammar() const { return *grammar_; }
  size_t n_states() const { return states_.size(); }
  size_t n_nodes() const { return nodes_.size(); }

 private:
  GrammarMatcher(const GrammarMatcher&) = default;  // copy() makes the cost explicit

  static constexpr StateId kUnknown = -2;
  static constexpr int32_t kAccept = 0;  // node 0: the empty stack (the grammar is complete)
  // partial_cp when the bits of the character so far no longer matter:
  // every stack takes every code point they can still become.
  static constexpr uint32_t kAnyCp = 0xFFFFFFFFu;

  struct Node {
    uint32_t pos;           // index into grammar elems: a Char or Ref element
    int32_t parent;         // continuation node (kAccept: none)
    uint32_t depth;
    int32_t closure_begin;  // into closure_pool_; -1 not computed, -2 being computed
    int32_t closure_len;
  };
  struct DState {
    uint32_t key_begin;  // into keys_: the sorted stack ids
    uint32_t key_len;
    uint32_t partial_cp;   // the code point's bits so far
    uint8_t partial_left;  // continuation bytes still expected (0: none)
    bool accepting;
  };

  int32_t make_node(uint32_t pos, int32_t parent);
  void compute_closure(int32_t n);
  void append_closure(int32_t n, std::vector<int32_t>& out);
  // One byte from (stacks, partial) into (out, partial'); false: refused.
  bool transition(const int32_t* stacks, size_t n, uint32_t pcp, uint8_t pleft, uint8_t byte,
                  std::vector<int32_t>& out, uint32_t& pcp2, uint8_t& pleft2);
  StateId intern(const std::vector<int32_t>& stacks, uint32_t pcp, uint8_t pleft);
  StateId compute_step(StateId s, uint8_t byte);
  StateId initial();
  void clear_caches();

  static constexpr uint32_t kMaxClosureDepth = 4000;
  uint32_t closure_depth_ = 0;  // compute_closure's recursion

  std::shared_ptr<const Grammar> grammar_;
  MatcherLimits limits_;
  StateId start_ = 0;
  StateId state_ = 0;

  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;  // (pos << 32 | parent) -> node
  std::vector<int32_t> closure_pool_;

  std::vector<DState> states_;
  std::vector<int32_t> keys_;
  std::vector<StateId> trans_;  // [n_states * 256]
  std::vector<Uniform> uniforms_;  // [n_states] uniform(); next == kUnknown: not computed yet
  std::unordered_map<std::string, StateId> state_ids_;

  // Scratch, reused.
  std::vector<int32_t> out_;
  std::string key_;
  std::vector<int32_t> ref_a_, ref_b_;
};

}  // namespace ebb::grammar
