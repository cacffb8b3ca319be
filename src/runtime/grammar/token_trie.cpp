#include "runtime/grammar/token_trie.h"

#include <algorithm>

#include "model/tokenizer.h"
#include "platform/error.h"

namespace ebb::grammar {
namespace {

// A strict UTF-8 decoder as 8 states: 0 at a character boundary; 1, 2, 3
// continuation bytes (80-BF) still expected; 4-7 the narrower byte after
// E0 (A0-BF), ED (80-9F), F0 (90-BF), F4 (80-8F). -1: invalid.
int utf8_next(int u, uint8_t b) {
  const bool cont = b >= 0x80 && b <= 0xBF;
  switch (u) {
    case 0:
      if (b < 0x80) return 0;
      if (b >= 0xC2 && b <= 0xDF) return 1;
      if (b == 0xE0) return 4;
      if (b == 0xED) return 5;
      if (b >= 0xE1 && b <= 0xEF) return 2;
      if (b == 0xF0) return 6;
      if (b >= 0xF1 && b <= 0xF3) return 3;
      if (b == 0xF4) return 7;
      return -1;
    case 1: return cont ? 0 : -1;
    case 2: return cont ? 1 : -1;
    case 3: return cont ? 2 : -1;
    case 4: return b >= 0xA0 && b <= 0xBF ? 1 : -1;
    case 5: return b >= 0x80 && b <= 0x9F ? 1 : -1;
    case 6: return b >= 0x90 && b <= 0xBF ? 2 : -1;
    default: return b >= 0x80 && b <= 0x8F ? 2 : -1;
  }
}

}  // namespace

TokenTrie::TokenTrie(const std::vector<std::string>& pieces, const std::vector<uint8_t>& eog) {
  const size_t n = pieces.size();
  if (!eog.empty() && eog.size() != n) throw Error("token trie: " + std::to_string(eog.size()) +
                                                   " end-of-generation flags for " + std::to_string(n) + " tokens");
  eog_ = eog.empty() ? std::vector<uint8_t>(n, 0) : eog;
  offsets_.reserve(n + 1);
  offsets_.push_back(0);
  for (const std::string& p : pieces) {
    if (p.size() > 65535) throw Error("token trie: a token of " + std::to_string(p.size()) + " bytes (limit 65535)");
    bytes_ += p;
    offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
  }
  // Sorting the pieces puts them in the trie's pre-order; each new piece opens
  // nodes below its common prefix with the previous one.
  std::vector<int32_t> order;
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    if (eog_[i]) eog_tokens_.push_back(id);
    else if (pieces[i].empty()) empty_tokens_.push_back(id);
    else order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return piece(a) < piece(b); });
  std::vector<uint32_t> open;  // node index at each depth - 1 on the current path
  std::string_view prev;
  for (const int32_t id : order) {
    const std::string_view p = piece(id);
    size_t common = 0;
    while (common < p.size() && common < prev.size() && p[common] == prev[common]) ++common;
    // Close the nodes deeper than the common prefix.
    while (open.size() > common) {
      nodes_[open.back()].subtree_end = static_cast<uint32_t>(nodes_.size());
      open.pop_back();
    }
    for (size_t d = common; d < p.size(); ++d) {
      open.push_back(static_cast<uint32_t>(nodes_.size()));
      const auto t = static_cast<uint32_t>(node_tokens_.size());
      nodes_.push_back({0, t, t, static_cast<uint16_t>(d + 1), static_cast<uint8_t>(p[d])});
    }
    // The token ends at the deepest open node; identical pieces share it, and
    // a node's tokens are pushed before any node below it is opened.
    Node& end = nodes_[open.back()];
    if (end.tok_end != node_tokens_.size()) {
      end.tok_begin = end.tok_end = static_cast<uint32_t>(node_tokens_.size());
    }
    node_tokens_.push_back(id);
    end.tok_end = static_cast<uint32_t>(node_tokens_.size());
    max_depth_ = std::max(max_depth_, p.size());
    prev = p;
  }
  while (!open.empty()) {
    nodes_[open.back()].subtree_end = static_cast<uint32_t>(nodes_.size());
    open.pop_back();
  }
  // below_: each node's bytes and set pushed into its parent's, children
  // (later in pre-order) first.
  const size_t n_nodes = nodes_.size();
  std::vector<uint32_t> parent(n_nodes, UINT32_MAX);
  std::vector<uint32_t> path;  // node at each depth - 1
  for (size_t i = 0; i < n_nodes; ++i) {
    path.resize(nodes_[i].depth - 1u);
    if (!path.empty()) parent[i] = path.back();
    path.push_back(static_cast<uint32_t>(i));
  }
  below_.assign(n_nodes, {0, 0});
  below_flags_.assign(n_nodes, 0);
  height_.assign(n_nodes, 0);
  // ok[i] bit u: the paths below i are valid UTF-8 continuations from
  // decoder state u (utf8_next).
  std::vector<uint8_t> ok(n_nodes, 0xFF);
  for (size_t i = n_nodes; i-- > 0;) {
    if (parent[i] == UINT32_MAX) continue;
    const uint32_t p = parent[i];
    height_[p] = std::max<uint16_t>(height_[p], static_cast<uint16_t>(height_[i] + 1));
    below_[p][0] |= below_[i][0];
    below_[p][1] |= below_[i][1];
    below_flags_[p] |= below_flags_[i] & kBelowNonAscii;
    const uint8_t b = nodes_[i].byte;
    if (b < 0x80) below_[p][b >> 6] |= uint64_t{1} << (b & 63);
    else below_flags_[p] |= kBelowNonAscii;
    uint8_t from = 0;
    for (int u = 0; u < 8; ++u) {
      const int v = utf8_next(u, b);
      if (v >= 0 && ((ok[i] >> v) & 1)) from |= static_cast<uint8_t>(1u << u);
    }
    ok[p] &= from;
  }
  for (size_t i = 0; i < n_nodes; ++i)
    if (ok[i] & 1) below_flags_[i] |= kBelowUtf8;
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const Tokenizer& tok) {
  const int32_t n = tok.n_vocab();
  std::vector<std::string> pieces(static_cast<size_t>(n));
  std::vector<uint8_t> eog(static_cast<size_t>(n), 0);
  for (int32_t i = 0; i < n; ++i) {
    eog[static_cast<size_t>(i)] = tok.is_eog(i) ? 1 : 0;
    pieces[static_cast<size_t>(i)] = tok.token_to_piece(i, /*special=*/false);
  }
  return std::make_shared<const TokenTrie>(pieces, eog);
}

}  // namespace ebb::grammar
