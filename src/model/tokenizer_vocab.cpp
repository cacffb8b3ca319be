#include "model/tokenizer_vocab.h"

#include <algorithm>
#include <limits>

#include "model/gguf.h"
#include "platform/error.h"

namespace ebb::tok {

namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";

[[noreturn]] void fail(const GgufFile& file, std::string_view key, const std::string& problem) {
  throw Error(file.path() + ": " + std::string(key) + ": " + problem);
}

// Reads an optional token id. Converters write UINT32_MAX (or -1) for "no
// such token"; anything else must be a valid id.
TokenId read_id(const GgufFile& file, std::string_view key, TokenId fallback, int32_t n_vocab) {
  const std::optional<int64_t> v = file.get_int(key);
  if (!v) return fallback;
  if (*v == -1 || *v == int64_t{std::numeric_limits<uint32_t>::max()}) return -1;
  if (*v < 0 || *v >= n_vocab) {
    fail(file, key, "token id " + std::to_string(*v) + " is out of range [0, " +
                        std::to_string(n_vocab) + ")");
  }
  return static_cast<TokenId>(*v);
}

// Texts of end-of-turn markers, used when the file names no eot_token_id.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<EOT>",      "_<EOT>",     "<｜end▁of▁sentence｜>",
};
// Texts of tokens that also end generation (chat end markers, end of text).
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",  "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>",      "_<EOT>",   "<|end_of_text|>", "<｜end▁of▁sentence｜>",
    "<|return|>", "<|call|>",
};

void read_special_ids(const GgufFile& file, Vocab& v) {
  const int32_t n = v.size();
  const bool spm = v.model == "llama";
  // SentencePiece vocabularies that omit the ids use the classic layout
  // <unk>=0, <s>=1, </s>=2 (the reference's defaults); byte-level BPE has
  // no convention, so missing ids stay absent.
  auto dflt = [&](TokenId id) { return spm && id < n ? id : -1; };
  v.bos = read_id(file, "tokenizer.ggml.bos_token_id", dflt(1), n);
  v.eos = read_id(file, "tokenizer.ggml.eos_token_id", dflt(2), n);
  v.unk = read_id(file, "tokenizer.ggml.unknown_token_id", dflt(0), n);
  v.pad = read_id(file, "tokenizer.ggml.padding_token_id", -1, n);
  v.eom = read_id(file, "tokenizer.ggml.eom_token_id", -1, n);
  v.eot = read_id(file, "tokenizer.ggml.eot_token_id", -2, n);
  if (v.eot == -2) {
    v.eot = -1;
    for (std::string_view text : kEotTexts) {
      if (const TokenId id = v.find(text); id >= 0) {
        v.eot = id;
        break;
      }
    }
  }
  for (TokenId id : {v.eos, v.eot, v.eom}) {
    if (id >= 0) v.eog.push_back(id);
  }
  for (std::string_view text : kEogTexts) {
    if (const TokenId id = v.find(text); id >= 0 && v.type(id) == TokenType::kControl) {
      v.eog.push_back(id);
    }
  }
  std::sort(v.eog.begin(), v.eog.end());
  v.eog.erase(std::unique(v.eog.begin(), v.eog.end()), v.eog.end());
}

}  // namespace

Vocab load_vocab(const GgufFile& file) {
  Vocab v;
  const std::optional<std::string> model = file.get_string(kModelKey);
  if (!model) fail(file, kModelKey, "missing");
  if (*model != "llama" && *model != "gpt2") {
    fail(file, kModelKey, "unsupported tokenizer model \"" + *model +
                              "\" (supported: \"llama\" (SentencePiece), \"gpt2\" (byte-level BPE))");
  }
  v.model = *model;
  v.pre = file.get_string("tokenizer.ggml.pre").value_or("");

  const std::vector<std::string>* tokens = file.get_string_array(kTokensKey);
  if (!tokens) fail(file, kTokensKey, "missing (or not an array of strings)");
  if (tokens->empty()) fail(file, kTokensKey, "is empty");
  if (tokens->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    fail(file, kTokensKey, "has too many entries (" + std::to_string(tokens->size()) + ")");
  }
  v.tokens = *tokens;
  const size_t n = v.tokens.size();
  const std::string n_str = std::to_string(n);

  if (std::optional<std::vector<float>> scores = file.get_float_array(kScoresKey)) {
    if (scores->size() != n) {
      fail(file, kScoresKey, "has " + std::to_string(scores->size()) + " entries but " +
                                 std::string(kTokensKey) + " has " + n_str);
    }
    v.scores = std::move(*scores);
  } else {
    v.scores.assign(n, 0.0f);
  }

  if (std::optional<std::vector<int64_t>> types = file.get_int_array(kTypesKey)) {
    if (types->size() != n) {
      fail(file, kTypesKey, "has " + std::to_string(types->size()) + " entries but " +
                                std::string(kTokensKey) + " has " + n_str);
    }
    v.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = (*types)[i];
      if (t < 0 || t > static_cast<int64_t>(TokenType::kByte)) {
        fail(file, kTypesKey, "entry " + std::to_string(i) + " has unknown type " + std::to_string(t));
      }
      v.types.push_back(static_cast<TokenType>(t));
    }
  } else {
    v.types.assign(n, TokenType::kNormal);
  }

  v.ids.reserve(n);
  for (size_t i = 0; i < n; ++i) v.ids.insert_or_assign(v.tokens[i], static_cast<TokenId>(i));

  if (v.model == "gpt2") {
    const std::vector<std::string>* merges = file.get_string_array(kMergesKey);
    if (!merges) fail(file, kMergesKey, "missing (required for the \"gpt2\" tokenizer)");
    for (size_t i = 0; i < merges->size(); ++i) {
      const std::string& m = (*merges)[i];
      if (m.size() < 3 || m.find(' ', 1) == std::string::npos || m.find(' ', 1) + 1 == m.size()) {
        fail(file, kMergesKey, "entry " + std::to_string(i) + " (\"" + m + "\") is not \"left right\"");
      }
    }
    v.merges = *merges;
  }

  const bool spm = v.model == "llama";
  v.add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(spm);
  v.add_space_prefix = spm && file.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  read_special_ids(file, v);

  for (size_t i = 0; i < n; ++i) {
    const TokenType t = v.types[i];
    if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) &&
        !v.tokens[i].empty()) {
      v.specials_by_length.push_back(static_cast<TokenId>(i));
    }
  }
  std::stable_sort(v.specials_by_length.begin(), v.specials_by_length.end(),
                   [&](TokenId a, TokenId b) {
                     return v.tokens[static_cast<size_t>(a)].size() > v.tokens[static_cast<size_t>(b)].size();
                   });
  return v;
}

std::vector<Fragment> partition_special(const Vocab& vocab, std::string_view text,
                                        bool parse_special) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, text});
  std::vector<Fragment> next;
  // Longest token first, each over every remaining raw fragment: the
  // reference's order, which decides overlaps ("<|im_start|>" before "<").
  for (const TokenId id : vocab.specials_by_length) {
    if (!parse_special && vocab.type(id) != TokenType::kUserDefined) continue;
    const std::string_view t = vocab.tokens[static_cast<size_t>(id)];
    if (text.find(t) == std::string_view::npos) continue;  // cheap filter: most never occur
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = 0;
      for (size_t hit; (hit = f.text.find(t, pos)) != std::string_view::npos; pos = hit + t.size()) {
        if (hit > pos) next.push_back({-1, f.text.substr(pos, hit - pos)});
        next.push_back({id, {}});
      }
      if (pos < f.text.size()) next.push_back({-1, f.text.substr(pos)});
    }
    frags.swap(next);
  }
  return frags;
}

std::vector<TokenId> VocabTokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (opts.add_bos && vocab_.add_bos && vocab_.bos >= 0) out.push_back(vocab_.bos);
  bool after_special = true;
  for (const Fragment& f : partition_special(vocab_, text, opts.parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
    } else {
      encode_fragment(f.text, after_special, out);
      after_special = false;
    }
  }
  return out;
}

std::string VocabTokenizer::decode(std::span<const TokenId> ids, bool special) const {
  std::string out;
  // SentencePiece's space prefix: the first token after an optional leading
  // BOS loses one leading space, so decode(encode(x)) == x.
  bool strip = vocab_.add_space_prefix;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = token_to_piece(ids[i], special);
    if (i == 0 && ids[i] == vocab_.bos) {
      out += piece;
      continue;
    }
    if (strip && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    strip = false;
    out += piece;
  }
  return out;
}

bool VocabTokenizer::is_eog(TokenId id) const {
  return std::binary_search(vocab_.eog.begin(), vocab_.eog.end(), id);
}

bool VocabTokenizer::is_control(TokenId id) const {
  return in_range(id) && vocab_.type(id) == TokenType::kControl;
}

std::string_view VocabTokenizer::token_text(TokenId id) const {
  return in_range(id) ? std::string_view(vocab_.tokens[static_cast<size_t>(id)]) : std::string_view();
}

}  // namespace ebb::tok
