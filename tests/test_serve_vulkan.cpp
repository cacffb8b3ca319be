// ebb serve on a Vulkan device (--device vulkan): completions give the CPU
// server's greedy text, /v1/memory says what the device holds, several
// choices of one prompt (its KV copied on the device) and cached prompt
// tokens (the prefix cache's chunks kept on the host, runtime/device_kv.h).
// Skips without a Vulkan device unless EBB_TEST_REQUIRE_VULKAN=1.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "serve_support.h"
#include "support.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using nlohmann::json;

TEST(ServeVulkan, CompletionsMemoryChoicesAndCachedTokens) {
  EBB_REQUIRE_VULKAN(be);
  test::ServerProcess cpu({}), gpu({"--device", "vulkan"});
  ASSERT_GT(cpu.port(), 0) << cpu.first_line();
  ASSERT_GT(gpu.port(), 0) << gpu.first_line() << gpu.err();
  auto cc = test::client(cpu.port()), gc = test::client(gpu.port());
  const json req = {{"prompt", "Lily"}, {"max_tokens", 12}, {"temperature", 0}};
  const test::Reply want = test::post(*cc, "/v1/completions", req);
  const test::Reply got = test::post(*gc, "/v1/completions", req);
  ASSERT_EQ(want.status, 200) << want.raw;
  ASSERT_EQ(got.status, 200) << got.raw;
  EXPECT_EQ(got.body["choices"][0]["text"], want.body["choices"][0]["text"]);
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}, {"max_tokens", 6}};
  EXPECT_EQ(test::post(*gc, "/v1/chat/completions", chat).status, 200);
  const test::Reply mem = test::get(*gc, "/v1/memory");
  ASSERT_EQ(mem.status, 200) << mem.raw;
  const json& d = mem.body["device"];
  EXPECT_EQ(d["id"], be->info().id);
  EXPECT_GT(d["weights"].get<uint64_t>(), 0u);
  EXPECT_EQ(d["total"].get<uint64_t>(),
            d["weights"].get<uint64_t>() + d["globals"].get<uint64_t>() + d["kv"].get<uint64_t>() +
                d["scratch"].get<uint64_t>());
  EXPECT_GE(d["ledger"]["buffer_bytes"].get<uint64_t>(), d["total"].get<uint64_t>());
  EXPECT_EQ(mem.body["footprint"]["weights"].get<uint64_t>(), 0u) << "the layers are on the device";
  EXPECT_GT(mem.body["layers"][0]["device_weights_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(test::get(*cc, "/v1/memory").body["device"]["id"], "cpu");
  // n = 2: two choices of one prefill (the prompt's KV copied on the
  // device), greedy ones identical and equal to n = 1's; a request that
  // starts the same reports cached prompt tokens (whole chunks of 16).
  const std::string text =
      "Once upon a time there was a little girl named Lily who loved to play in the park with her friends every day.";
  const json story = {{"prompt", text}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  json two = story;
  two["n"] = 2;
  const test::Reply r2 = test::post(*gc, "/v1/completions", two);
  ASSERT_EQ(r2.status, 200) << r2.raw;
  ASSERT_EQ(r2.body["choices"].size(), 2u) << r2.raw;
  EXPECT_EQ(r2.body["choices"][0]["text"], r2.body["choices"][1]["text"]);
  const test::Reply r1 = test::post(*gc, "/v1/completions", story);
  ASSERT_EQ(r1.status, 200) << r1.raw;
  EXPECT_EQ(r1.body["choices"][0]["text"], r2.body["choices"][0]["text"]);
  EXPECT_EQ(r1.body["choices"][0]["text"], test::post(*cc, "/v1/completions", story).body["choices"][0]["text"]);
  const int64_t cached = r1.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  EXPECT_GE(cached, 16) << r1.raw;
  EXPECT_LT(cached, r1.body["usage"]["prompt_tokens"].get<int64_t>());
}

}  // namespace
}  // namespace ebb
