// Tokenizers read from a GGUF's tokenizer.* metadata: SentencePiece-style
// (tokenizer.ggml.model = "llama") and byte-level BPE ("gpt2", with the
// pre-tokenizer chosen by tokenizer.ggml.pre).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ebb {

class GgufFile;

using TokenId = int32_t;

struct EncodeOptions {
  bool add_bos = true;         // prepend BOS when the vocabulary asks for it
  bool parse_special = false;  // turn "<|im_start|>"-style text into its control token
};

class Tokenizer {
 public:
  // Throws ebb::Error naming the key when the metadata is missing or invalid,
  // or naming the model/pre-tokenizer when it is not supported.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);
  virtual ~Tokenizer() = default;

  virtual std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opts = {}) const = 0;
  // The bytes a token stands for (byte tokens give their byte, "▁" becomes a
  // space, byte-level BPE symbols are mapped back to bytes). Control tokens
  // give their text only when `special` is true.
  virtual std::string token_to_piece(TokenId id, bool special = false) const = 0;
  // Concatenated pieces; for SentencePiece the leading space of the first
  // token after BOS is removed, as the reference does.
  virtual std::string decode(std::span<const TokenId> ids, bool special = false) const = 0;

  virtual int32_t n_vocab() const = 0;
  virtual std::string_view model_name() const = 0;  // "llama" or "gpt2"
  virtual TokenId bos() const = 0;  // -1 when absent
  virtual TokenId eos() const = 0;
  virtual TokenId eot() const = 0;  // end of turn (<|im_end|>, <|eot_id|>), -1 when absent
  virtual bool add_bos_default() const = 0;
  // True for tokens that end generation (EOS, EOT, and other end-of-generation markers).
  virtual bool is_eog(TokenId id) const = 0;
  // Token id of an exact token text ("<|im_start|>"), -1 when absent.
  virtual TokenId find_token(std::string_view text) const = 0;

  // The token's text exactly as stored in the vocabulary ("▁the", "Ġthe",
  // "<0x0A>"); empty for an out-of-range id.
  virtual std::string_view token_text(TokenId id) const = 0;
  virtual TokenId unk() const = 0;  // -1 when absent
  virtual TokenId pad() const = 0;  // -1 when absent
  // True for control tokens (BOS, EOS, "<|im_start|>"), whose text only
  // appears in decoded output when `special` is requested.
  virtual bool is_control(TokenId id) const = 0;
  // The pre-tokenizer name in use ("qwen2", "llama-bpe"; "" for SentencePiece).
  virtual std::string_view pre_tokenizer() const = 0;
  // True when encode() puts a space before the text (SentencePiece's
  // add_space_prefix), so decoding drops the first piece's leading space.
  virtual bool add_space_prefix() const = 0;
};

// Turns a stream of token ids into text that never splits a UTF-8 character:
// bytes of an incomplete character are held back until it completes.
class StreamDecoder {
 public:
  // at_start: the tokens begin a sequence, so the first one after a leading
  // BOS loses its SentencePiece space prefix, as in decode(). Pass false when
  // the tokens continue text already shown (generated after a prompt).
  explicit StreamDecoder(const Tokenizer& tok, bool at_start = true) : tok_(tok), first_(at_start) {}
  // Returns the complete text that this token makes available.
  std::string push(TokenId id);
  // Whatever is held back (invalid or truncated bytes), at the end.
  std::string flush();
  // Control tokens whose text is shown all the same (a family's tool-call
  // markers, such as Mistral's [TOOL_CALLS], that a parser must see).
  void show_special(std::vector<TokenId> ids) { shown_ = std::move(ids); }

 private:
  const Tokenizer& tok_;
  std::vector<TokenId> shown_;
  std::string pending_;   // bytes of an incomplete UTF-8 character
  bool first_;            // no token after the leading BOS yet
  bool seen_any_ = false; // any token pushed yet
};

}  // namespace ebb
