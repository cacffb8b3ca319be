#include "runtime/grammar/grammar_matcher.h"

#include <algorithm>
#include <cstring>

#include "platform/error.h"

namespace ebb::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, MatcherLimits limits)
    : grammar_(std::move(grammar)), limits_(limits) {
  EBB_CHECK(grammar_ != nullptr);
  clear_caches();
  start_ = initial();
  state_ = start_;
  if (states_[static_cast<size_t>(start_)].key_len == 0)
    throw Error("grammar: the root rule can never match (every alternative is refused at once)");
}

void GrammarMatcher::clear_caches() {
  nodes_.clear();
  node_ids_.clear();
  closure_pool_.clear();
  states_.clear();
  keys_.clear();
  trans_.clear();
  uniforms_.clear();
  state_ids_.clear();
  nodes_.push_back({UINT32_MAX, -1, 0, -1, 0});  // kAccept
}

int32_t GrammarMatcher::make_node(uint32_t pos, int32_t parent) {
  const Elem& e = grammar_->elems[pos];
  if (e.type == ElemType::End) return parent;  // nothing left here: continue with the parent
  const uint64_t key = (uint64_t{pos} << 32) | static_cast<uint32_t>(parent);
  auto it = node_ids_.find(key);
  if (it != node_ids_.end()) return it->second;
  const uint32_t depth = nodes_[static_cast<size_t>(parent)].depth + 1;
  if (depth > limits_.max_stack_depth) return -1;
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back({pos, parent, depth, -1, 0});
  node_ids_.emplace(key, id);
  return id;
}

void GrammarMatcher::compute_closure(int32_t n) {
  Node& node = nodes_[static_cast<size_t>(n)];
  if (node.closure_begin >= 0) return;
  EBB_CHECK_MSG(node.closure_begin != -2, "grammar closure cycle (left recursion passed the check)");
  // Expanding references at the start of rules (and skipping elements that
  // can be empty) recurses; a hostile grammar could chain thousands of
  // them and exhaust the stack, so the depth is bounded. On the way out of
  // an error, nodes left half-computed go back to "not computed".
  struct Depth {
    GrammarMatcher& m;
    int32_t n;
    ~Depth() {
      --m.closure_depth_;
      if (m.nodes_[static_cast<size_t>(n)].closure_begin == -2) m.nodes_[static_cast<size_t>(n)].closure_begin = -1;
    }
  } depth{*this, n};
  if (++closure_depth_ > kMaxClosureDepth)
    throw Error("grammar: rules nest more than " + std::to_string(kMaxClosureDepth) +
                " deep at the start of a rule (or through elements that can be empty); the matcher refuses it");
  if (n == kAccept || grammar_->elems[node.pos].type == ElemType::Char) {
    node.closure_begin = static_cast<int32_t>(closure_pool_.size());
    node.closure_len = 1;
    closure_pool_.push_back(n);
    return;
  }
  node.closure_begin = -2;
  const uint32_t pos = node.pos;
  const int32_t parent = node.parent;
  const uint32_t rule = grammar_->elems[pos].arg;
  std::vector<int32_t> acc;
  const int32_t cont = make_node(pos + 1, parent);
  if (cont >= 0) {
    const auto [a0, a1] = grammar_->rule_alts[rule];
    for (uint32_t a = a0; a < a1; ++a) {
      const int32_t child = make_node(grammar_->alt_start[a], cont);
      if (child < 0) continue;
      append_closure(child, acc);
    }
    std::sort(acc.begin(), acc.end());
    acc.erase(std::unique(acc.begin(), acc.end()), acc.end());
  }
  Node& again = nodes_[static_cast<size_t>(n)];  // nodes_ may have grown
  again.closure_begin = static_cast<int32_t>(closure_pool_.size());
  again.closure_len = static_cast<int32_t>(acc.size());
  closure_pool_.insert(closure_pool_.end(), acc.begin(), acc.end());
}

void GrammarMatcher::append_closure(int32_t n, std::vector<int32_t>& out) {
  compute_closure(n);
  const Node& node = nodes_[static_cast<size_t>(n)];
  const auto* b = closure_pool_.data() + node.closure_begin;
  out.insert(out.end(), b, b + node.closure_len);
}

GrammarMatcher::StateId GrammarMatcher::initial() {
  std::vector<int32_t> stacks;
  const auto [a0, a1] = grammar_->rule_alts[grammar_->root];
  for (uint32_t a = a0; a < a1; ++a) {
    const int32_t child = make_node(grammar_->alt_start[a], kAccept);
    if (child >= 0) append_closure(child, stacks);
  }
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  return intern(stacks, 0, 0);
}

bool GrammarMatcher::transition(const int32_t* stacks, size_t n, uint32_t pcp, uint8_t pleft, uint8_t byte,
                                std::vector<int32_t>& out, uint32_t& pcp2, uint8_t& pleft2) {
  out.clear();
  uint32_t cp = 0;
  bool complete = false;
  if (pleft == 0) {
    if (byte < 0x80) {
      cp = byte;
      complete = true;
    } else if (byte >= 0xC2 && byte <= 0xDF) {
      pcp2 = byte & 0x1Fu;
      pleft2 = 1;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      pcp2 = byte & 0x0Fu;
      pleft2 = 2;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      pcp2 = byte & 0x07u;
      pleft2 = 3;
    } else {
      return false;  // a stray continuation byte or an invalid lead
    }
  } else {
    if ((byte & 0xC0) != 0x80) return false;
    // Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF
    // (the byte after E0, ED, F0 or F4 has a narrower range). Right after a
    // 3-byte lead pcp holds its 4 bits (<= 0xF); after a 4-byte lead's first
    // continuation it is >= 0x10, since F0 80-8F is refused.
    if (pleft == 3 || (pleft == 2 && pcp <= 0xF)) {
      if (pleft == 2 && pcp == 0x0 && byte < 0xA0) return false;   // E0: overlong
      if (pleft == 2 && pcp == 0xD && byte > 0x9F) return false;   // ED: surrogates
      if (pleft == 3 && pcp == 0x0 && byte < 0x90) return false;   // F0: overlong
      if (pleft == 3 && pcp == 0x4 && byte > 0x8F) return false;   // F4: past U+10FFFF
    }
    const uint32_t v = pcp == kAnyCp ? kAnyCp : (pcp << 6) | (byte & 0x3Fu);
    if (pleft == 1) {
      cp = v;
      complete = true;
      if (cp > 0x10FFFF && cp != kAnyCp) return false;
    } else {
      pcp2 = v;
      pleft2 = static_cast<uint8_t>(pleft - 1);
    }
  }
  if (complete) {
    pcp2 = 0;
    pleft2 = 0;
    for (size_t i = 0; i < n; ++i) {
      const int32_t s = stacks[i];
      if (s == kAccept) continue;
      const Node& node = nodes_[static_cast<size_t>(s)];
      const Elem& e = grammar_->elems[node.pos];
      if (cp != kAnyCp && !grammar_->charsets[e.arg].contains(cp)) continue;
      const int32_t next = make_node(node.pos + 1, node.parent);
      if (next >= 0) append_closure(next, out);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  } else {
    if (pcp2 == kAnyCp) {  // every stack takes every completion (see below)
      for (size_t i = 0; i < n; ++i)
        if (stacks[i] != kAccept) out.push_back(stacks[i]);
      return !out.empty();
    }
    // Inside a character: keep the stacks that could take some code point
    // beginning with these bits (the set stays sorted).
    const int shift = 6 * pleft2;
    uint32_t lo = pcp2 << shift;
    uint32_t hi = lo | ((1u << shift) - 1);
    if (pleft == 0) {  // just the lead byte: the shortest form and the surrogate gap narrow the range
      lo = std::max(lo, pleft2 == 1 ? 0x80u : pleft2 == 2 ? 0x800u : 0x10000u);
      if (pleft2 == 2 && pcp2 == 0xD) hi = 0xD7FF;
      hi = std::min(hi, 0x10FFFFu);
    }
    for (size_t i = 0; i < n; ++i) {
      const int32_t s = stacks[i];
      if (s == kAccept) continue;
      const Elem& e = grammar_->elems[nodes_[static_cast<size_t>(s)].pos];
      if (grammar_->charsets[e.arg].intersects(lo, hi)) out.push_back(s);
    }
    // When every stack left takes every code point these bits can still
    // become, the bits no longer matter: forget them (kAnyCp), so that the
    // thousands of partial characters inside, say, a JSON string share one
    // state instead of one each. Not while the next byte's range depends on
    // the lead (E0, ED, F0, F4).
    const bool narrow_next = pleft == 0 && ((pleft2 == 2 && (pcp2 == 0x0 || pcp2 == 0xD)) ||
                                            (pleft2 == 3 && (pcp2 == 0x0 || pcp2 == 0x4)));
    if (!narrow_next && !out.empty()) {
      bool all = true;
      for (const int32_t st : out) {
        const Elem& e = grammar_->elems[nodes_[static_cast<size_t>(st)].pos];
        if (!grammar_->charsets[e.arg].contains_range(lo, hi)) {
          all = false;
          break;
        }
      }
      if (all) pcp2 = kAnyCp;
    }
  }
  return !out.empty();
}

GrammarMatcher::StateId GrammarMatcher::intern(const std::vector<int32_t>& stacks, uint32_t pcp, uint8_t pleft) {
  key_.resize(5 + stacks.size() * sizeof(int32_t));
  std::memcpy(key_.data(), &pcp, 4);
  key_[4] = static_cast<char>(pleft);
  if (!stacks.empty()) std::memcpy(key_.data() + 5, stacks.data(), stacks.size() * sizeof(int32_t));
  auto it = state_ids_.find(key_);
  if (it != state_ids_.end()) return it->second;
  const auto id = static_cast<StateId>(states_.size());
  const bool accepting = pleft == 0 && !stacks.empty() && stacks[0] == kAccept;
  states_.push_back({static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(stacks.size()), pcp, pleft,
                     accepting});
  keys_.insert(keys_.end(), stacks.begin(), stacks.end());
  trans_.resize(trans_.size() + 256, kUnknown);
  uniforms_.push_back({{0, 0}, kUnknown, false});
  state_ids_.emplace(key_, id);
  return id;
}

GrammarMatcher::StateId GrammarMatcher::compute_step(StateId s, uint8_t byte) {
  const DState d = states_[static_cast<size_t>(s)];
  uint32_t pcp2 = 0;
  uint8_t pleft2 = 0;
  // keys_ may grow while the closures are computed, so copy the stack list.
  ref_a_.assign(keys_.begin() + d.key_begin, keys_.begin() + d.key_begin + d.key_len);
  StateId t = kReject;
  if (transition(ref_a_.data(), ref_a_.size(), d.partial_cp, d.partial_left, byte, out_, pcp2, pleft2))
    t = intern(out_, pcp2, pleft2);
  trans_[static_cast<size_t>(s) * 256 + byte] = t;
  return t;
}

const GrammarMatcher::Uniform& GrammarMatcher::uniform(StateId s) {
  if (uniforms_[static_cast<size_t>(s)].next != kUnknown) return uniforms_[static_cast<size_t>(s)];
  // The successor most ASCII bytes share.
  StateId succ[128];
  StateId next = kReject;
  int best = 0;
  for (unsigned b = 1; b < 128; ++b) succ[b] = step(s, static_cast<uint8_t>(b));
  for (unsigned b = 1; b < 128; ++b) {
    if (succ[b] == kReject || succ[b] == next) continue;
    int n = 0;
    for (unsigned c = b; c < 128; ++c) n += succ[c] == succ[b];
    if (n > best) best = n, next = succ[b];
  }
  Uniform u = {{0, 0}, next, false};
  for (unsigned b = 1; b < 128; ++b)
    if (next != kReject && succ[b] == next) u.ascii[b >> 6] |= uint64_t{1} << (b & 63);
  // Every non-ASCII character leads to `next` when the stacks that take any
  // of them take all of them (the transition then does not depend on which
  // one) and one of them does.
  const DState d = states_[static_cast<size_t>(s)];
  bool all = d.partial_left == 0;
  for (uint32_t k = 0; k < d.key_len && all; ++k) {
    const int32_t st = keys_[d.key_begin + k];
    if (st == kAccept) continue;
    const CharSet& cs = grammar_->charsets[grammar_->elems[nodes_[static_cast<size_t>(st)].pos].arg];
    if (cs.intersects(0x80, 0x10FFFF)) all = cs.contains_range(0x80, 0xD7FF) && cs.contains_range(0xE000, 0x10FFFF);
  }
  const StateId e = all ? run(s, "\xC3\xA9") : kReject;
  if (e != kReject && (e == next || next == kReject)) {
    u.non_ascii = true;
    u.next = e;
  }
  if (!u.non_ascii && best < 8) u = {{0, 0}, kReject, false};  // too narrow to be worth following
  uniforms_[static_cast<size_t>(s)] = u;  // (uniforms_ may have grown in run())
  return uniforms_[static_cast<size_t>(s)];
}

GrammarMatcher::StateId GrammarMatcher::run(StateId s, std::string_view bytes) {
  for (const char c : bytes) {
    s = step(s, static_cast<uint8_t>(c));
    if (s == kReject) return kReject;
  }
  return s;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  const StateId t = run(state_, bytes);
  if (t == kReject) return false;
  state_ = t;
  return true;
}

void GrammarMatcher::reset() { state_ = start_; }

bool GrammarMatcher::reference_accepts(StateId s, std::string_view bytes, bool require_complete) {
  const DState d = states_[static_cast<size_t>(s)];
  std::vector<int32_t> cur(keys_.begin() + d.key_begin, keys_.begin() + d.key_begin + d.key_len);
  std::vector<int32_t> next;
  uint32_t pcp = d.partial_cp;
  uint8_t pleft = d.partial_left;
  for (const char c : bytes) {
    uint32_t pcp2 = 0;
    uint8_t pleft2 = 0;
    if (!transition(cur.data(), cur.size(), pcp, pleft, static_cast<uint8_t>(c), next, pcp2, pleft2)) return false;
    cur.swap(next);
    pcp = pcp2;
    pleft = pleft2;
  }
  if (require_complete) return pleft == 0 && !cur.empty() && cur[0] == kAccept;
  return true;
}

bool GrammarMatcher::trim() {
  if (states_.size() <= limits_.max_states && nodes_.size() <= limits_.max_nodes) return false;
  const DState d = states_[static_cast<size_t>(state_)];
  const bool at_start = state_ == start_;
  // The current stacks as chains of positions, top first.
  std::vector<std::vector<uint32_t>> chains;
  for (uint32_t i = 0; i < d.key_len; ++i) {
    std::vector<uint32_t> chain;
    for (int32_t n = keys_[d.key_begin + i]; n != kAccept; n = nodes_[static_cast<size_t>(n)].parent)
      chain.push_back(nodes_[static_cast<size_t>(n)].pos);
    chains.push_back(std::move(chain));
  }
  clear_caches();
  start_ = initial();
  if (at_start) {
    state_ = start_;
    return true;
  }
  std::vector<int32_t> stacks;
  for (const auto& chain : chains) {
    int32_t n = kAccept;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) n = make_node(*it, n);
    EBB_CHECK(n >= 0);
    stacks.push_back(n);
  }
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  state_ = intern(stacks, d.partial_cp, d.partial_left);
  return true;
}

}  // namespace ebb::grammar
