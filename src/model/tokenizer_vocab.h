// What both tokenizer kinds share: the vocabulary read from a GGUF's
// tokenizer.ggml.* keys, the special-token partition of the input, and a
// base class implementing the parts of ebb::Tokenizer that do not depend on
// the algorithm.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"

namespace ebb {
class GgufFile;
}

namespace ebb::tok {

// tokenizer.ggml.token_type values (the reference's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Hash/equality that let the text -> id map be probed with a string_view
// without building a std::string per look-up.
struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct TextEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

struct Vocab {
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre ("" when absent)
  std::vector<std::string> tokens;
  std::vector<float> scores;      // [n_vocab]; zeros when the file has none
  std::vector<TokenType> types;   // [n_vocab]; kNormal when the file has none
  std::vector<std::string> merges;  // "left right", best first (BPE only)
  std::unordered_map<std::string, TokenId, TextHash, TextEq> ids;  // text -> id (last wins)

  TokenId bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  bool add_bos = false;
  bool add_space_prefix = false;
  std::vector<TokenId> eog;  // sorted: ids that end generation

  // Tokens matched in the raw text before the tokenizer proper runs, longest
  // text first (the reference's order): control, user-defined and unknown
  // tokens when parsing specials, otherwise only user-defined ones, which the
  // reference (and Hugging Face added tokens) always match.
  std::vector<TokenId> specials_by_length;

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  TokenType type(TokenId id) const { return types[static_cast<size_t>(id)]; }
  TokenId find(std::string_view text) const {
    const auto it = ids.find(text);
    return it == ids.end() ? -1 : it->second;
  }
};

// Reads and validates the tokenizer.ggml.* metadata. Throws ebb::Error naming
// the key (and the file) when a value is missing, mistyped or out of range.
Vocab load_vocab(const GgufFile& file);

// A piece of the input: either raw text to tokenize or one special token.
struct Fragment {
  TokenId token = -1;     // >= 0: a special token
  std::string_view text;  // token < 0: raw text (a view into the input)
};

// Splits `text` around special-token texts (see Vocab::specials_by_length).
std::vector<Fragment> partition_special(const Vocab& vocab, std::string_view text,
                                        bool parse_special);

// Implements the algorithm-independent parts of Tokenizer; subclasses
// tokenize raw text fragments and turn single tokens into bytes.
class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(Vocab vocab) : vocab_(std::move(vocab)) {}

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opts) const override;
  std::string decode(std::span<const TokenId> ids, bool special) const override;

  int32_t n_vocab() const override { return vocab_.size(); }
  std::string_view model_name() const override { return vocab_.model; }
  TokenId bos() const override { return vocab_.bos; }
  TokenId eos() const override { return vocab_.eos; }
  TokenId eot() const override { return vocab_.eot; }
  TokenId unk() const override { return vocab_.unk; }
  TokenId pad() const override { return vocab_.pad; }
  bool add_bos_default() const override { return vocab_.add_bos; }
  bool add_space_prefix() const override { return vocab_.add_space_prefix; }
  bool is_eog(TokenId id) const override;
  bool is_control(TokenId id) const override;
  TokenId find_token(std::string_view text) const override { return vocab_.find(text); }
  std::string_view token_text(TokenId id) const override;

 protected:
  bool in_range(TokenId id) const { return id >= 0 && id < vocab_.size(); }
  // Appends the tokens of one raw-text fragment. `after_special` is true for
  // the first fragment and for fragments that follow a special token (where
  // SentencePiece adds its space prefix).
  virtual void encode_fragment(std::string_view text, bool after_special,
                               std::vector<TokenId>& out) const = 0;

  const Vocab vocab_;
};

// A run of the text in the doubly linked list of symbols that both merge
// tokenizers work on; len 0 marks a symbol merged into its left neighbour.
struct Symbol {
  int prev;
  int next;
  uint32_t start;
  uint32_t len;
};

// Pops candidate merges (Bigram: left, right, size = merged length) best
// first and merges them in the symbol list, skipping stale candidates (a side
// changed since it was queued); try_add(left, right) queues the new
// neighbours of each merge. O(n log n): each merge adds at most two.
template <class Queue, class TryAdd>
void merge_best_pairs(std::vector<Symbol>& sym, Queue& queue, TryAdd&& try_add) {
  while (!queue.empty()) {
    const auto b = queue.top();
    queue.pop();
    Symbol& left = sym[b.left];
    Symbol& right = sym[b.right];
    if (left.len == 0 || right.len == 0 || left.len + right.len != b.size) continue;  // stale
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }
}

}  // namespace ebb::tok
