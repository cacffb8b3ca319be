#include "model/tokenizer_bpe.h"

#include <algorithm>
#include <queue>

#include "platform/error.h"

namespace ebb::tok {

namespace {

struct Bigram {
  int32_t rank;
  int left;
  int right;
  uint32_t size;  // merged length, to recognise stale entries
};

// Lowest rank first; on a tie the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

BpeTokenizer::BpeTokenizer(Vocab vocab) : VocabTokenizer(std::move(vocab)), pretok_(vocab_.pre) {
  ranks_.reserve(vocab_.merges.size());
  for (size_t i = 0; i < vocab_.merges.size(); ++i) {
    // The first merge of a pair wins, as in a ranked merge list.
    ranks_.emplace(vocab_.merges[i], static_cast<int32_t>(i));
  }
}

void BpeTokenizer::encode_fragment(std::string_view text, bool /*after_special*/,
                                   std::vector<TokenId>& out) const {
  std::string word, key;  // scratch, reused across words
  for (std::string_view w : pretok_.split(text)) {
    word.clear();
    for (char c : w) word += bytes_.encode(static_cast<uint8_t>(c));
    encode_word(word, key, out);
  }
}

void BpeTokenizer::encode_word(const std::string& word, std::string& key,
                               std::vector<TokenId>& out) const {
  if (pretok_.ignore_merges()) {
    if (const TokenId id = vocab_.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  EBB_CHECK(word.size() < (size_t{1} << 31));
  std::vector<Symbol> sym;
  sym.reserve(word.size() / 2 + 1);
  for (size_t off = 0; off < word.size();) {
    const size_t len = std::min(word.size() - off, utf8_len(static_cast<uint8_t>(word[off])));
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == word.size() ? -1 : idx + 1, static_cast<uint32_t>(off),
                   static_cast<uint32_t>(len)});
    off += len;
  }
  auto text_of = [&](int i) { return std::string_view(word).substr(sym[i].start, sym[i].len); };

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    key.assign(text_of(left));
    key += ' ';
    key += text_of(right);
    const auto it = ranks_.find(std::string_view(key));
    if (it == ranks_.end()) return;
    queue.push({it->second, left, right, sym[left].len + sym[right].len});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);

  merge_best_pairs(sym, queue, try_add);

  for (int i = 0; i != -1; i = sym[i].next) {
    const std::string_view piece = text_of(i);
    if (const TokenId id = vocab_.find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // A merge result missing from the vocabulary: fall back to whatever
    // single bytes of it are tokens (the reference's behaviour).
    for (char c : piece) {
      if (const TokenId id = vocab_.find(std::string_view(&c, 1)); id >= 0) out.push_back(id);
    }
  }
}

std::string BpeTokenizer::token_to_piece(TokenId id, bool special) const {
  if (!in_range(id)) {
    throw Error("token id " + std::to_string(id) + " is out of range [0, " +
                std::to_string(n_vocab()) + ")");
  }
  const std::string& text = vocab_.tokens[static_cast<size_t>(id)];
  switch (vocab_.type(id)) {
    case TokenType::kControl:
    case TokenType::kUnused:
      return special ? text : std::string();
    case TokenType::kUserDefined:
      // Added tokens are stored as plain text, not in byte symbols.
      return text;
    default:
      break;
  }
  // Map each symbol back to its byte; a code point that is not a byte symbol
  // (a malformed vocabulary) is kept as its UTF-8 text.
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t len = valid_utf8_char(text, i);
    if (len == 0) {
      out += text[i++];
      continue;
    }
    uint32_t cp = static_cast<uint8_t>(text[i]);
    if (len > 1) {
      cp &= 0xFFu >> (len + 1);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
    }
    const int b = bytes_.decode(cp);
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(text, i, len);
    }
    i += len;
  }
  return out;
}

}  // namespace ebb::tok
