// The bytes of an HTTP/1.1 request as ebb serve reads them before httplib
// does (http_server.h): where a head ends, what the head says about the
// body, and a chunked body decoded with its size bounded while it is read.
// Pure functions over bytes, no sockets: the request parser's fuzz target
// (tests/fuzz/fuzz_request.cpp) drives them with arbitrary input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ebb::serve {

// The offset just past the head's "\r\n\r\n", or nullopt while incomplete.
std::optional<size_t> head_end(std::string_view bytes);

struct ParsedHead {
  std::string method, target, path, version;  // path: target without "?query"
  std::vector<std::pair<std::string, std::string>> headers;  // as sent, in order
  uint64_t content_length = 0;
  bool chunked = false;          // Transfer-Encoding: chunked
  bool expect_continue = false;  // Expect: 100-continue
  std::string authorization;

  // The head again, without Transfer-Encoding, Content-Length and Expect,
  // and with "Content-Length: n": how a decoded chunked body is handed on.
  std::string rebuild_with_length(uint64_t n) const;
};

// Limits on a head (the byte size is the reactor's).
inline constexpr size_t kMaxHeaders = 128;

// Parses head bytes (through the blank line). False with `error` set for
// anything malformed: the request line, a header line, a Content-Length
// that is not a number or disagrees with another, Content-Length together
// with Transfer-Encoding (a request-smuggling shape), a transfer coding
// other than chunked, more than kMaxHeaders headers.
bool parse_head(std::string_view head, ParsedHead& out, std::string& error);

// Decodes "SIZE[;ext]\r\nDATA\r\n ... 0\r\n[trailers]\r\n" incrementally.
class ChunkedDecoder {
 public:
  enum class Result { kMore, kDone, kTooLarge, kBad };
  // max_body: decoded bytes at most; the framing may add at most as much
  // again plus 64 KiB (a body of one-byte chunks is refused, not buffered
  // sixfold).
  explicit ChunkedDecoder(size_t max_body) : max_body_(max_body) {}

  // Consumes bytes from in[pos...], appending decoded data to `body` and
  // advancing pos; a chunk's size is checked against the limit as soon as
  // its size line is read, before its data.
  Result feed(std::string_view in, size_t& pos, std::string& body);
  bool done() const { return state_ == State::kDone; }
  const std::string& error() const { return error_; }

 private:
  enum class State { kSize, kData, kDataEnd, kTrailer, kDone };
  size_t max_body_;
  State state_ = State::kSize;
  uint64_t left_ = 0;     // data bytes left in the current chunk
  uint64_t framing_ = 0;  // bytes of size lines, CRLFs and trailers so far
  std::string error_;
};

}  // namespace ebb::serve
