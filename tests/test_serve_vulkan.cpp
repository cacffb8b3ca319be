// ebb serve on a Vulkan device (--device vulkan): completions give the CPU
// server's greedy text, /v1/memory says what the device holds, and what
// runs on the CPU only (several choices per request) is a 400 naming the
// field. Skips without a Vulkan device unless EBB_TEST_REQUIRE_VULKAN=1.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve_support.h"
#include "support.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using nlohmann::json;

TEST(ServeVulkan, CompletionsMemoryAndRefusals) {
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
  // A second turn of a chat reuses nothing (no prefix cache there yet) and still answers.
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}, {"max_tokens", 6}};
  EXPECT_EQ(test::post(*gc, "/v1/chat/completions", chat).status, 200);
  const test::Reply mem = test::get(*gc, "/v1/memory");
  ASSERT_EQ(mem.status, 200) << mem.raw;
  const json& d = mem.body["device"];
  EXPECT_EQ(d["id"], be->info().id);
  EXPECT_GT(d["weights"].get<uint64_t>(), 0u);
  EXPECT_EQ(d["total"].get<uint64_t>(),
            d["weights"].get<uint64_t>() + d["globals"].get<uint64_t>() + d["kv"].get<uint64_t>() +
                d["adapters"].get<uint64_t>() + d["scratch"].get<uint64_t>());
  EXPECT_GE(d["ledger"]["buffer_bytes"].get<uint64_t>(), d["total"].get<uint64_t>());
  EXPECT_EQ(mem.body["footprint"]["weights"].get<uint64_t>(), 0u) << "the layers are on the device";
  EXPECT_GT(mem.body["layers"][0]["device_weights_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(test::get(*cc, "/v1/memory").body["device"]["id"], "cpu");
  json two = req;
  two["n"] = 2;
  const test::Reply n2 = test::post(*gc, "/v1/completions", two);
  EXPECT_EQ(n2.status, 400) << n2.raw;
  EXPECT_EQ(n2.body["error"]["param"], "n") << n2.raw;
}

}  // namespace
}  // namespace ebb
