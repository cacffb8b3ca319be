// SentencePiece-style tokenizer (tokenizer.ggml.model = "llama"): spaces
// become "▁", adjacent symbols are merged best-score-first, and characters
// the vocabulary lacks fall back to <0xNN> byte tokens.
#pragma once

#include <array>

#include "model/tokenizer_vocab.h"

namespace ebb::tok {

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(Vocab vocab);

  std::string token_to_piece(TokenId id, bool special = false) const override;
  std::string_view pre_tokenizer() const override { return ""; }

 protected:
  void encode_fragment(std::string_view text, bool after_special,
                       std::vector<TokenId>& out) const override;

 private:
  std::array<TokenId, 256> byte_tokens_;  // token for each byte, -1 when none
};

// The byte a "<0xNN>" token stands for, or -1 when `text` is not one.
int parse_byte_token(std::string_view text);

}  // namespace ebb::tok
