// Tokenizer::from_gguf (picks the algorithm) and StreamDecoder.
#include "model/tokenizer.h"

#include <algorithm>

#include "model/gguf.h"
#include "model/tokenizer_bpe.h"
#include "model/tokenizer_spm.h"
#include "model/tokenizer_unicode.h"
#include "platform/error.h"

namespace ebb {

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  tok::Vocab vocab = tok::load_vocab(file);
  if (vocab.model == "llama") return std::make_unique<tok::SpmTokenizer>(std::move(vocab));
  try {
    return std::make_unique<tok::BpeTokenizer>(std::move(vocab));
  } catch (const Error& e) {
    throw Error(file.path() + ": " + e.what());  // name the file, too
  }
}

std::string StreamDecoder::push(TokenId id) {
  const bool special = std::find(shown_.begin(), shown_.end(), id) != shown_.end();
  std::string piece = tok_.token_to_piece(id, special);
  // Same rule as Tokenizer::decode: a leading BOS passes through, and the
  // first token after it loses the SentencePiece space prefix.
  if (!(first_ && !seen_any_ && id == tok_.bos())) {
    if (first_ && tok_.add_space_prefix() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    first_ = false;
  }
  seen_any_ = true;
  pending_ += piece;

  // Hold back a trailing character whose remaining bytes may still come.
  // Only the last 3 bytes can start one; invalid bytes are passed on as they
  // are rather than held forever.
  size_t cut = pending_.size();
  for (size_t k = 1; k <= 3 && k <= pending_.size(); ++k) {
    const size_t pos = pending_.size() - k;
    if ((static_cast<uint8_t>(pending_[pos]) & 0xC0) != 0x80) {  // a lead byte
      if (tok::incomplete_utf8_char(pending_, pos)) cut = pos;
      break;
    }
  }
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace ebb
