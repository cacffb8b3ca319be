// UTF-8 helpers shared by the tokenizers: character lengths, validation (the
// regex engine must only see valid UTF-8), and the GPT-2 byte <-> symbol map
// used by byte-level BPE.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ebb::tok {

// Length of the UTF-8 sequence that starts with `lead`, judged from its high
// nibble only (continuation and invalid bytes count as 1, 0xF8.. as 4): this
// is how the reference splits text into symbols, and the caller clamps the
// length to the bytes that remain.
inline size_t utf8_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Length of the valid UTF-8 character at s[pos] (1..4), or 0 when the bytes
// there are not a complete, well-formed character (overlong forms,
// surrogates and code points above U+10FFFF are rejected, as PCRE2 does).
size_t valid_utf8_char(std::string_view s, size_t pos);

// True when s[pos..] is a proper prefix of a well-formed character, i.e.
// more bytes could complete it (used to hold back streamed bytes).
bool incomplete_utf8_char(std::string_view s, size_t pos);

// Appends code point `cp` as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

// GPT-2's reversible byte <-> unicode map: printable bytes stand for
// themselves, the other 68 bytes are shifted to U+0100.. so that every
// token is printable text without spaces. Built per tokenizer (no globals).
class ByteUnicodeMap {
 public:
  ByteUnicodeMap();
  // The UTF-8 text of the symbol standing for byte b.
  const std::string& encode(uint8_t b) const { return byte_to_text_[b]; }
  // The byte that code point cp stands for, or -1 when cp is not a symbol.
  int decode(uint32_t cp) const { return cp < cp_to_byte_.size() ? cp_to_byte_[cp] : -1; }

 private:
  std::array<std::string, 256> byte_to_text_;
  std::array<int16_t, 324> cp_to_byte_;  // every symbol is below U+0144
};

}  // namespace ebb::tok
