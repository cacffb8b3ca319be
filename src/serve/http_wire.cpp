#include "serve/http_wire.h"

#include <algorithm>
#include <cctype>

namespace ebb::serve {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// RFC 9110 token characters.
bool is_tchar(char ch) {
  const unsigned char c = static_cast<unsigned char>(ch);
  if (std::isalnum(c)) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(ch) != std::string_view::npos;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool parse_decimal(std::string_view s, uint64_t& out) {
  if (s.empty() || s.size() > 18) return false;  // < 10^18: no overflow
  uint64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + static_cast<uint64_t>(ch - '0');
  }
  out = v;
  return true;
}

}  // namespace

std::optional<size_t> head_end(std::string_view bytes) {
  const size_t p = bytes.find("\r\n\r\n");
  if (p == std::string_view::npos) return std::nullopt;
  return p + 4;
}

bool parse_head(std::string_view head, ParsedHead& out, std::string& error) {
  out = ParsedHead{};
  size_t eol = head.find("\r\n");
  if (eol == std::string_view::npos) {
    error = "no request line";
    return false;
  }
  const std::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    error = "the request line is not 'METHOD TARGET HTTP/1.x'";
    return false;
  }
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
  if (method.empty() || method.size() > 32 || !std::all_of(method.begin(), method.end(), is_tchar)) {
    error = "bad method";
    return false;
  }
  if (target.empty() || std::any_of(target.begin(), target.end(), [](char ch) {
        const unsigned char c = static_cast<unsigned char>(ch);
        return c <= 0x20 || c == 0x7f;
      })) {
    error = "bad request target";
    return false;
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    error = "unsupported HTTP version (1.0 and 1.1 are)";
    return false;
  }
  out.method = method;
  out.target = target;
  out.path = target.substr(0, target.find('?'));
  out.version = version;

  bool have_length = false, have_te = false;
  size_t pos = eol + 2;
  while (pos < head.size()) {
    eol = head.find("\r\n", pos);
    if (eol == std::string_view::npos) {
      error = "a header line does not end in CRLF";
      return false;
    }
    const std::string_view h = head.substr(pos, eol - pos);
    pos = eol + 2;
    if (h.empty()) break;  // the blank line
    if (out.headers.size() >= kMaxHeaders) {
      error = "more than " + std::to_string(kMaxHeaders) + " headers";
      return false;
    }
    const size_t colon = h.find(':');
    if (colon == 0 || colon == std::string_view::npos ||
        !std::all_of(h.begin(), h.begin() + static_cast<std::ptrdiff_t>(colon), is_tchar)) {
      error = "a header line is not 'Name: value'";
      return false;
    }
    const std::string_view name = h.substr(0, colon), value = trim(h.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(), [](char ch) {
          const unsigned char c = static_cast<unsigned char>(ch);
          return (c < 0x20 && c != '\t') || c == 0x7f;
        })) {
      error = "a control character in header '" + std::string(name) + "'";
      return false;
    }
    out.headers.emplace_back(std::string(name), std::string(value));
    if (iequals(name, "Content-Length")) {
      uint64_t n = 0;
      if (!parse_decimal(value, n) || (have_length && n != out.content_length)) {
        error = "bad Content-Length";
        return false;
      }
      have_length = true;
      out.content_length = n;
    } else if (iequals(name, "Transfer-Encoding")) {
      if (have_te || !iequals(value, "chunked")) {
        error = "unsupported Transfer-Encoding '" + std::string(value) + "' (chunked is)";
        return false;
      }
      have_te = true;
      out.chunked = true;
    } else if (iequals(name, "Expect")) {
      if (!iequals(value, "100-continue")) {
        error = "unsupported Expect '" + std::string(value) + "'";
        return false;
      }
      out.expect_continue = true;
    } else if (iequals(name, "Authorization")) {
      out.authorization = value;
    }
  }
  if (have_length && have_te) {
    error = "both Content-Length and Transfer-Encoding";
    return false;
  }
  return true;
}

std::string ParsedHead::rebuild_with_length(uint64_t n) const {
  std::string s = method + " " + target + " " + version + "\r\n";
  for (const auto& [k, v] : headers) {
    if (iequals(k, "Transfer-Encoding") || iequals(k, "Content-Length") || iequals(k, "Expect")) continue;
    s += k;
    s += ": ";
    s += v;
    s += "\r\n";
  }
  s += "Content-Length: " + std::to_string(n) + "\r\n\r\n";
  return s;
}

ChunkedDecoder::Result ChunkedDecoder::feed(std::string_view in, size_t& pos, std::string& body) {
  const auto bad = [&](std::string why) {
    error_ = std::move(why);
    return Result::kBad;
  };
  while (state_ != State::kDone) {
    if (framing_ > max_body_ + (64u << 10)) return Result::kTooLarge;
    if (state_ == State::kData) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left_, in.size() - pos));
      if (n == 0) return Result::kMore;
      body.append(in.data() + pos, n);
      pos += n;
      left_ -= n;
      if (left_ == 0) state_ = State::kDataEnd;
      continue;
    }
    const size_t eol = in.find("\r\n", pos);
    if (eol == std::string_view::npos) {
      if (in.size() - pos > 1024) return bad("a chunk-size or trailer line over 1024 bytes");
      return Result::kMore;
    }
    const std::string_view line = in.substr(pos, eol - pos);
    if (line.size() > 1024) return bad("a chunk-size or trailer line over 1024 bytes");
    framing_ += line.size() + 2;
    pos = eol + 2;
    if (state_ == State::kDataEnd) {
      if (!line.empty()) return bad("chunk data longer than its size");
      state_ = State::kSize;
    } else if (state_ == State::kSize) {
      const std::string_view hex = trim(line.substr(0, line.find(';')));
      if (hex.empty() || hex.size() > 15) return bad("bad chunk size");
      uint64_t v = 0;
      for (char ch : hex) {
        const int d = std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0'
                      : (ch >= 'a' && ch <= 'f')                    ? ch - 'a' + 10
                      : (ch >= 'A' && ch <= 'F')                    ? ch - 'A' + 10
                                                                    : -1;
        if (d < 0) return bad("bad chunk size");
        v = v * 16 + static_cast<uint64_t>(d);
      }
      if (v > max_body_ || body.size() + v > max_body_) return Result::kTooLarge;
      left_ = v;
      state_ = v == 0 ? State::kTrailer : State::kData;
    } else {  // kTrailer: lines until the blank one
      if (line.empty()) state_ = State::kDone;
    }
  }
  return Result::kDone;
}

}  // namespace ebb::serve
