#include "model/tokenizer_unicode.h"

namespace ebb::tok {

namespace {

bool is_cont(uint8_t c) { return (c & 0xC0) == 0x80; }

// Expected length and allowed range of the second byte for a lead byte
// (RFC 3629 table), 0 when the byte cannot start a character.
struct LeadInfo {
  size_t len;
  uint8_t lo, hi;  // bounds of the second byte
};

LeadInfo lead_info(uint8_t c) {
  if (c < 0x80) return {1, 0, 0};
  if (c >= 0xC2 && c <= 0xDF) return {2, 0x80, 0xBF};
  if (c == 0xE0) return {3, 0xA0, 0xBF};  // no overlongs
  if (c == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (c >= 0xE1 && c <= 0xEF) return {3, 0x80, 0xBF};
  if (c == 0xF0) return {4, 0x90, 0xBF};
  if (c >= 0xF1 && c <= 0xF3) return {4, 0x80, 0xBF};
  if (c == 0xF4) return {4, 0x80, 0x8F};  // max U+10FFFF
  return {0, 0, 0};
}

}  // namespace

size_t valid_utf8_char(std::string_view s, size_t pos) {
  const auto c = static_cast<uint8_t>(s[pos]);
  const LeadInfo info = lead_info(c);
  if (info.len <= 1) return info.len;
  if (pos + info.len > s.size()) return 0;
  const auto c1 = static_cast<uint8_t>(s[pos + 1]);
  if (c1 < info.lo || c1 > info.hi) return 0;
  for (size_t k = 2; k < info.len; ++k) {
    if (!is_cont(static_cast<uint8_t>(s[pos + k]))) return 0;
  }
  return info.len;
}

bool incomplete_utf8_char(std::string_view s, size_t pos) {
  const LeadInfo info = lead_info(static_cast<uint8_t>(s[pos]));
  const size_t have = s.size() - pos;
  if (info.len <= 1 || have >= info.len) return false;
  if (have >= 2) {
    const auto c1 = static_cast<uint8_t>(s[pos + 1]);
    if (c1 < info.lo || c1 > info.hi) return false;
  }
  for (size_t k = 2; k < have; ++k) {
    if (!is_cont(static_cast<uint8_t>(s[pos + k]))) return false;
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

ByteUnicodeMap::ByteUnicodeMap() {
  cp_to_byte_.fill(-1);
  // Bytes '!'..'~', '¡'..'¬' and '®'..'ÿ' are printable and map to the code
  // point of the same value; the rest take U+0100, U+0101, ... in byte order.
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const uint32_t cp = printable ? b : next++;
    append_utf8(byte_to_text_[b], cp);
    cp_to_byte_[cp] = static_cast<int16_t>(b);
  }
}

}  // namespace ebb::tok
