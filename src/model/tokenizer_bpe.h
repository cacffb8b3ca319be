// Byte-level BPE (tokenizer.ggml.model = "gpt2"): the text is cut into words
// by the pre-tokenizer, each word's bytes are spelled with GPT-2's byte
// symbols, and adjacent symbols are merged lowest merge rank first.
#pragma once

#include <unordered_map>

#include "model/tokenizer_pretok.h"
#include "model/tokenizer_unicode.h"
#include "model/tokenizer_vocab.h"

namespace ebb::tok {

class BpeTokenizer final : public VocabTokenizer {
 public:
  // Throws ebb::Error when tokenizer.ggml.pre names an unknown pre-tokenizer.
  explicit BpeTokenizer(Vocab vocab);

  std::string token_to_piece(TokenId id, bool special = false) const override;
  std::string_view pre_tokenizer() const override { return pretok_.name(); }

 protected:
  void encode_fragment(std::string_view text, bool after_special,
                       std::vector<TokenId>& out) const override;

 private:
  void encode_word(const std::string& word, std::string& key, std::vector<TokenId>& out) const;

  PreTokenizer pretok_;
  ByteUnicodeMap bytes_;
  // "left right" -> rank (position in tokenizer.ggml.merges; lower merges first).
  std::unordered_map<std::string, int32_t, TextHash, TextEq> ranks_;
};

}  // namespace ebb::tok
