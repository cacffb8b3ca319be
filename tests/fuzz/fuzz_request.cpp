// libFuzzer target: ebb serve's request parser on arbitrary bytes. The
// bytes are a request as it comes off the socket: the head (http_wire.h),
// a Content-Length or chunked body (decoded with its bound), the body as
// JSON with depth and count limits (json_bounded.h), and the JSON read as
// a chat or completions request (openai.h). Any input must end in a parse
// or a clean refusal: no crash, no sanitizer report, no unbounded memory.
//
// fuzz-sources: src/serve/http_wire.cpp src/serve/json_bounded.cpp src/serve/openai*.cpp src/serve/tool_calls.cpp
// Run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "serve/http_wire.h"
#include "serve/json_bounded.h"
#include "serve/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ebb::serve;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::optional<size_t> he = head_end(in);
  std::string body;
  if (he) {
    ParsedHead h;
    std::string err;
    if (!parse_head(in.substr(0, *he), h, err)) return 0;
    (void)h.rebuild_with_length(h.content_length);
    if (h.chunked) {
      ChunkedDecoder dec(1u << 16);
      size_t pos = *he;
      if (dec.feed(in, pos, body) != ChunkedDecoder::Result::kDone) return 0;
    } else {
      body = std::string(in.substr(*he, static_cast<size_t>(std::min<uint64_t>(h.content_length, in.size() - *he))));
    }
  } else {
    body = std::string(in);  // the body alone
  }
  nlohmann::json j;
  JsonError jerr;
  JsonLimits lim;
  lim.max_values = 1u << 14;
  if (!parse_json_bounded(body, lim, j, jerr)) return 0;
  RequestLimits rl;
  rl.model_id = "m";
  rl.n_vocab = 512;
  rl.n_ctx = 128;
  for (Endpoint ep : {Endpoint::kChat, Endpoint::kCompletions}) {
    try {
      (void)parse_completion_request(j, ep, rl);
    } catch (const ApiException&) {
    }
  }
  return 0;
}
