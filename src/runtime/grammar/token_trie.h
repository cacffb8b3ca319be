// The vocabulary's token byte strings as a trie, built once per tokenizer and
// shared (read-only) by every constrained sequence.
//
// Layout: the nodes in depth-first pre-order, without the root. A node holds
// the byte on its edge, its depth (1 = a token's first byte), the index one
// past its subtree (so a walk that refuses a prefix skips the whole subtree
// with one assignment), and the range of token ids whose bytes end exactly
// there. A mask walk is then one linear pass with skips, keeping one parse
// state per depth. Each node also knows the set of bytes below it (below()),
// so a walk in a state that loops on all of them (the inside of a string)
// takes the whole subtree without visiting it.
//
// Tokens with empty pieces (control tokens: their text is not generated
// text) and end-of-generation tokens are not in the trie; they are listed
// apart, because a grammar treats them by rule, not by bytes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ebb {
class Tokenizer;
}

namespace ebb::grammar {

class TokenTrie {
 public:
  struct Node {
    uint32_t subtree_end;  // index one past this node's subtree
    uint32_t tok_begin;    // [tok_begin, tok_end) into node_tokens()
    uint32_t tok_end;
    uint16_t depth;        // 1 for a first byte
    uint8_t byte;
  };

  // pieces: [n_vocab] the bytes of each token; eog: [n_vocab] (or empty)
  // nonzero for end-of-generation tokens. Throws ebb::Error if a piece is
  // longer than 65535 bytes or the sizes differ.
  TokenTrie(const std::vector<std::string>& pieces, const std::vector<uint8_t>& eog);
  // From Tokenizer::token_to_piece(id, /*special=*/false) and is_eog(id).
  static std::shared_ptr<const TokenTrie> from_tokenizer(const Tokenizer& tok);

  int32_t n_vocab() const { return static_cast<int32_t>(offsets_.size()) - 1; }
  std::string_view piece(int32_t id) const {
    return std::string_view(bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  bool is_eog(int32_t id) const { return eog_[static_cast<size_t>(id)] != 0; }

  const std::vector<Node>& nodes() const { return nodes_; }
  // [n_nodes] the ASCII bytes on the edges below each node (not its own),
  // as a 128-bit set: a walk in a state that loops on all of them can take
  // the whole subtree at once.
  const std::vector<std::array<uint64_t, 2>>& below() const { return below_; }
  // [n_nodes] kBelowNonAscii: a byte >= 0x80 below the node; kBelowUtf8:
  // every path below, read from a character boundary at the node, is a
  // prefix of valid UTF-8 (so a state where every character loops takes it).
  static constexpr uint8_t kBelowNonAscii = 1, kBelowUtf8 = 2;
  const std::vector<uint8_t>& below_flags() const { return below_flags_; }
  // [n_nodes] the longest path below each node, in bytes (0: a leaf).
  const std::vector<uint16_t>& height() const { return height_; }
  // The tokens of node i's subtree are node_tokens()[nodes()[i].tok_begin, subtree_tok_end(i)).
  uint32_t subtree_tok_end(size_t i) const {
    const uint32_t e = nodes_[i].subtree_end;
    return e < nodes_.size() ? nodes_[e].tok_begin : static_cast<uint32_t>(node_tokens_.size());
  }
  const std::vector<int32_t>& node_tokens() const { return node_tokens_; }
  const std::vector<int32_t>& eog_tokens() const { return eog_tokens_; }
  const std::vector<int32_t>& empty_tokens() const { return empty_tokens_; }  // not eog
  size_t max_depth() const { return max_depth_; }

 private:
  std::string bytes_;              // every piece, concatenated
  std::vector<uint32_t> offsets_;  // [n_vocab + 1]
  std::vector<uint8_t> eog_;       // [n_vocab]
  std::vector<Node> nodes_;
  std::vector<std::array<uint64_t, 2>> below_;
  std::vector<uint8_t> below_flags_;
  std::vector<uint16_t> height_;
  std::vector<int32_t> node_tokens_;
  std::vector<int32_t> eog_tokens_;
  std::vector<int32_t> empty_tokens_;
  size_t max_depth_ = 0;
};

}  // namespace ebb::grammar
