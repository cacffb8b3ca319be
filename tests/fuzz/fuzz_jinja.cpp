// libFuzzer target for the Jinja engine (scripts/fuzz_jinja.sh builds and
// runs it): the input is a chat template. It is parsed and rendered with a
// conversation that has a system prompt, tools, a tool call and its result;
// it must render or throw ebb::Error. Anything else (a crash, a sanitizer
// report, another exception, a timeout or running out of memory) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/chat_jinja.h"

namespace {

const char kMessages[] = R"([
  {"role": "system", "content": "You are terse."},
  {"role": "user", "content": "Weather in Paris? ünï©ødé"},
  {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5}"},
  {"role": "assistant", "content": "<think>\nok\n</think>\n\n21.5 C."},
  {"role": "user", "content": "Thanks"}
])";

const char kTools[] = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"},
  "days": {"type": "integer", "minimum": 1}, "unit": {"type": "string", "enum": ["c", "f"]}},
  "required": ["city"]}}}])";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(kMessages);
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(kTools);
  ebb::ChatTemplateOptions opts;
  opts.clock = [] { return std::time_t(1721989800); };
  // Small limits keep each run short; they are what is being exercised.
  opts.limits.max_loop_iterations = 20000;
  opts.limits.max_work = 2'000'000;
  opts.limits.max_output_bytes = size_t(256) << 10;
  opts.limits.max_string_bytes = size_t(256) << 10;
  opts.limits.max_list_items = 20000;
  std::string src(reinterpret_cast<const char*>(data), size);
  try {
    ebb::ChatTemplate t(src, "<s>", "</s>", opts);
    t.render(messages, tools, size % 2 == 0);
    t.render(messages, nlohmann::ordered_json(), size % 2 != 0);
  } catch (const ebb::Error&) {
  }
  return 0;
}
