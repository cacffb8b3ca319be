#include "model/tokenizer_spm.h"

#include <algorithm>
#include <queue>

#include "model/tokenizer_unicode.h"
#include "platform/error.h"

namespace ebb::tok {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 "▁", SentencePiece's space

// A candidate merge of two adjacent symbols into a vocabulary token. `size`
// records the merged length so stale entries (a side changed since) can be
// recognised and skipped when popped.
struct Bigram {
  float score;
  int left;
  int right;
  uint32_t size;
};

// Highest score first; on a tie the leftmost pair, as SentencePiece does.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = text[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

SpmTokenizer::SpmTokenizer(Vocab vocab) : VocabTokenizer(std::move(vocab)) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    TokenId id = vocab_.find(name);
    // Vocabularies without byte tokens may still hold the byte itself.
    if (id < 0) id = vocab_.find(std::string(1, static_cast<char>(b)));
    byte_tokens_[static_cast<size_t>(b)] = id >= 0 ? id : vocab_.unk;
  }
}

void SpmTokenizer::encode_fragment(std::string_view text, bool after_special,
                                   std::vector<TokenId>& out) const {
  std::string s;  // the text with spaces escaped to "▁"
  s.reserve(text.size() + text.size() / 4 + 3);
  if (vocab_.add_space_prefix && after_special) s += kSpace;
  for (char c : text) {
    if (c == ' ') {
      s += kSpace;
    } else {
      s += c;
    }
  }
  if (s.empty()) return;
  EBB_CHECK(s.size() < (size_t{1} << 31));

  // One symbol per UTF-8 character. A byte that does not start a valid
  // character is a symbol of its own (it will become a byte token), so bad
  // input cannot swallow the characters after it. (The reference judges the
  // length from the lead byte alone; both agree on valid UTF-8.)
  std::vector<Symbol> sym;
  sym.reserve(s.size());
  for (size_t off = 0; off < s.size();) {
    const size_t len = std::max<size_t>(1, valid_utf8_char(s, off));
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == s.size() ? -1 : idx + 1, static_cast<uint32_t>(off),
                   static_cast<uint32_t>(len)});
    off += len;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = sym[left].len + sym[right].len;
    const TokenId id = vocab_.find(std::string_view(s).substr(sym[left].start, size));
    if (id < 0) return;
    queue.push({vocab_.scores[static_cast<size_t>(id)], left, right, size});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);

  merge_best_pairs(sym, queue, try_add);

  for (int i = 0; i != -1; i = sym[i].next) {
    const std::string_view piece = std::string_view(s).substr(sym[i].start, sym[i].len);
    const TokenId id = vocab_.find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Only a single unmerged character can be missing (merges always make
    // vocabulary tokens): spell it in bytes.
    for (char c : piece) {
      const TokenId bt = byte_tokens_[static_cast<uint8_t>(c)];
      if (bt >= 0) out.push_back(bt);
    }
  }
}

std::string SpmTokenizer::token_to_piece(TokenId id, bool special) const {
  if (!in_range(id)) {
    throw Error("token id " + std::to_string(id) + " is out of range [0, " +
                std::to_string(n_vocab()) + ")");
  }
  const std::string& text = vocab_.tokens[static_cast<size_t>(id)];
  switch (vocab_.type(id)) {
    case TokenType::kNormal:
    case TokenType::kUndefined: {
      std::string out;
      out.reserve(text.size());
      for (size_t i = 0; i < text.size();) {
        if (std::string_view(text).substr(i, kSpace.size()) == kSpace) {
          out += ' ';
          i += kSpace.size();
        } else {
          out += text[i++];
        }
      }
      return out;
    }
    case TokenType::kByte: {
      const int b = parse_byte_token(text);
      return b >= 0 ? std::string(1, static_cast<char>(b)) : text;
    }
    case TokenType::kUserDefined:
      return text;
    case TokenType::kControl:
      return special ? text : std::string();
    case TokenType::kUnknown:
      // A visible mark, as the reference prints for <unk>.
      return special ? text : std::string("\xE2\x96\x85");  // U+2585
    case TokenType::kUnused:
      return special ? text : std::string();
  }
  return {};
}

}  // namespace ebb::tok
