// The C API (include/ebb/ebb.h, libebb.so): status codes and messages for
// bad input, results equal to the C++ API's, cancellation from the text
// callback, and evict / restore / footprint / residency through C.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "ebb/ebb.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

constexpr int64_t kChunk = 16;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string last_error() { return ebb_last_error(); }

// Engine options shared by the C engine and its C++ twin.
ebb_engine_options c_options(const std::string& model, const std::string& swap_dir) {
  ebb_engine_options o = ebb_engine_options_default();
  static thread_local std::string path;  // the struct holds a pointer
  path = model;
  o.model_path = path.c_str();
  o.n_threads = 2;
  o.kv_chunk_size = kChunk;
  o.swap_dir = swap_dir.c_str();
  return o;
}

std::unique_ptr<Engine> cpp_engine(const std::string& model, const std::string& swap_dir) {
  EngineOptions o;
  o.model_path = model;
  o.n_threads = 2;
  o.kv_chunk_size = kChunk;
  o.elastic_opts.swap_dir = swap_dir;
  return std::make_unique<Engine>(o);
}

// The text of a generation, collected from the callback; cancels after
// `stop_after` pieces when it is positive.
struct Collected {
  std::string text;
  std::vector<std::string> pieces;
  int stop_after = 0;
};

int collect(const char* text, size_t len, void* user) {
  auto* c = static_cast<Collected*>(user);
  c->pieces.emplace_back(text, len);
  c->text.append(text, len);
  return c->stop_after > 0 && static_cast<int>(c->pieces.size()) >= c->stop_after ? 1 : 0;
}

std::vector<ebb_token> session_tokens(ebb_session* s) {
  size_t n = 0;
  const ebb_status counted = ebb_session_tokens(s, nullptr, 0, &n);  // asks for the count
  EXPECT_EQ(counted, n == 0 ? EBB_OK : EBB_ERR_BUFFER_TOO_SMALL);
  std::vector<ebb_token> t(n);
  EXPECT_EQ(ebb_session_tokens(s, t.data(), t.size(), &n), EBB_OK);
  return t;
}

class CApiTest : public testing::Test {
 protected:
  void SetUp() override {
    model = test::model_path("stories260K.gguf");
    const ebb_engine_options o = c_options(model, dir.path());
    ASSERT_EQ(ebb_engine_load(&o, &engine), EBB_OK) << last_error();
    ref = cpp_engine(model, ref_dir.path());  // its own swap files
    prompt = ref->tokenizer().encode("Once upon a time");
  }
  void TearDown() override {
    if (session) {
      EXPECT_EQ(ebb_session_free(session), EBB_OK) << last_error();
    }
    EXPECT_EQ(ebb_engine_free(engine), EBB_OK) << last_error();
  }
  ebb_session* new_session(int64_t n_ctx = 0) {
    ebb_session_options so = ebb_session_options_default();
    so.n_ctx = n_ctx;
    ebb_session* s = nullptr;
    EXPECT_EQ(ebb_session_create(engine, &so, &s), EBB_OK) << last_error();
    return s;
  }

  test::TempDir dir{"ebb-capi"}, ref_dir{"ebb-capi-ref"};
  std::string model;
  ebb_engine* engine = nullptr;
  ebb_session* session = nullptr;
  std::unique_ptr<Engine> ref;
  std::vector<TokenId> prompt;
};

// ---- bad input -------------------------------------------------------------

TEST(CApi, MissingModelFileIsAnIoErrorNamingThePath) {
  ebb_engine_options o = ebb_engine_options_default();
  o.model_path = "/nonexistent/dir/model.gguf";
  ebb_engine* e = reinterpret_cast<ebb_engine*>(0x1);  // must be reset to NULL
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_IO);
  EXPECT_EQ(e, nullptr);
  EXPECT_TRUE(contains(last_error(), "ebb_engine_load")) << last_error();
  EXPECT_TRUE(contains(last_error(), "/nonexistent/dir/model.gguf")) << last_error();
  EXPECT_STREQ(ebb_status_name(EBB_ERR_IO), "io");
}

TEST(CApi, DirectoryAndNonModelFilesAreRefusedWithTheirReason) {
  test::TempDir dir("ebb-capi-bad");
  ebb_engine_options o = ebb_engine_options_default();
  o.model_path = dir.path().c_str();
  ebb_engine* e = nullptr;
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_IO);
  EXPECT_TRUE(contains(last_error(), "is a directory")) << last_error();

  const std::string junk = dir.file("junk.gguf");
  std::ofstream(junk) << "this is not a GGUF file, only some text long enough to read a header from";
  o.model_path = junk.c_str();
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_MODEL);
  EXPECT_EQ(e, nullptr);
  EXPECT_TRUE(contains(last_error(), junk)) << last_error();
}

TEST(CApi, BadOptionsNameTheField) {
  const std::string model = test::model_path("stories260K.gguf");
  ebb_engine* e = nullptr;

  ebb_engine_options zeroed;
  std::memset(&zeroed, 0, sizeof zeroed);  // not made by the default
  zeroed.model_path = model.c_str();
  EXPECT_EQ(ebb_engine_load(&zeroed, &e), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "ebb_engine_options_default")) << last_error();

  ebb_engine_options o = ebb_engine_options_default();
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_INVALID_ARGUMENT);  // no model path
  EXPECT_TRUE(contains(last_error(), "model_path is NULL")) << last_error();

  o.model_path = model.c_str();
  o.n_threads = -3;
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "n_threads = -3")) << last_error();

  o = ebb_engine_options_default();
  o.model_path = model.c_str();
  o.kv_chunk_size = -1;
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "kv_chunk_size = -1")) << last_error();
  EXPECT_EQ(ebb_engine_options_default().kv_chunk_size, 0) << "the default sizes the chunk from the context";

  o = ebb_engine_options_default();
  o.model_path = model.c_str();
  o.prefill_batch = -1;
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "prefill_batch")) << last_error();
  EXPECT_EQ(e, nullptr);
}

// Greedy text of 16 tokens after "Once upon a time" on an engine loaded
// with `o`; "" (with the failure recorded) when it does not load.
std::string greedy_text(const ebb_engine_options& o) {
  ebb_engine* e = nullptr;
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_OK) << last_error();
  if (!e) return "";
  ebb_session_options so = ebb_session_options_default();
  ebb_session* s = nullptr;
  EXPECT_EQ(ebb_session_create(e, &so, &s), EBB_OK) << last_error();
  std::vector<ebb_token> prompt(64);
  size_t n = 0;
  const char* text = "Once upon a time";
  EXPECT_EQ(ebb_tokenize(e, text, std::strlen(text), 1, 0, prompt.data(), prompt.size(), &n), EBB_OK);
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = 16;
  go.sampling.temperature = 0;
  Collected got;
  EXPECT_EQ(ebb_generate(s, prompt.data(), n, &go, collect, &got, nullptr), EBB_OK) << last_error();
  EXPECT_EQ(ebb_session_free(s), EBB_OK);
  EXPECT_EQ(ebb_engine_free(e), EBB_OK);
  return got.text;
}

// The device option: "cpu" runs as the default does; a device that is not
// here ("vulkan:7") fails naming the option and what was found; malformed
// or contradicting values are invalid arguments naming the field; a struct
// from the header before device and n_gpu_layers (its struct_size) still
// loads, with their defaults; where a Vulkan device exists, "vulkan" (and
// n_gpu_layers alone) gives the CPU's greedy text.
TEST(CApi, DeviceOptionChoosesWhereTheModelRuns) {
  const std::string model = test::model_path("stories260K.gguf");
  ebb_engine_options o = ebb_engine_options_default();
  EXPECT_EQ(o.device, nullptr);
  EXPECT_EQ(o.n_gpu_layers, -1);
  o.model_path = model.c_str();
  o.n_threads = 1;
  ebb_engine* e = reinterpret_cast<ebb_engine*>(0x1);
  o.device = "vulkan:7";
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_FAILED);
  EXPECT_EQ(e, nullptr);
  EXPECT_TRUE(contains(last_error(), "options.device = \"vulkan:7\": no such device (")) << last_error();
  EXPECT_TRUE(contains(last_error(), "Vulkan device")) << last_error();
  for (const char* bad : {"tpu", "vulkan:", "vulkan:x", "vulkan:-1", "cuda:0"}) {
    o.device = bad;
    EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_TRUE(contains(last_error(), std::string("options.device = \"") + bad + "\" is not one of")) << last_error();
  }
  o.device = "cpu";
  o.n_gpu_layers = 4;
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "options.n_gpu_layers = 4")) << last_error();
  o.n_gpu_layers = -2;
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "options.n_gpu_layers = -2")) << last_error();
  o.device = "vulkan";
  o.n_gpu_layers = 0;
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "n_gpu_layers = 0 puts no layer on the device")) << last_error();

  o.device = "cpu";
  o.n_gpu_layers = -1;
  const std::string cpu = greedy_text(o);
  EXPECT_FALSE(cpu.empty());
  ebb_engine_options dflt = o;
  dflt.device = nullptr;
  EXPECT_EQ(greedy_text(dflt), cpu);
  // A caller built against the earlier header: its struct ends before
  // device; whatever follows in memory is not read.
  ebb_engine_options earlier = o;
  earlier.struct_size = offsetof(ebb_engine_options, device);
  earlier.device = "tpu";
  earlier.n_gpu_layers = -7;
  EXPECT_EQ(greedy_text(earlier), cpu);
  earlier.struct_size += 4;
  EXPECT_EQ(ebb_engine_load(&earlier, &e), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "struct_size")) << last_error();

  if (list_gpu_devices().empty()) {
    std::printf("no Vulkan device: \"vulkan\" not run\n");
    return;
  }
  o.device = "vulkan";
  EXPECT_EQ(greedy_text(o), cpu);
  o.device = nullptr;
  o.n_gpu_layers = 99;  // llama.cpp's -ngl 99 alone: all layers on the first GPU
  EXPECT_EQ(greedy_text(o), cpu);
  o.device = "vulkan:0";
  o.n_gpu_layers = -1;
  // A memory limit on the device (docs/vulkan.md): one no step could run
  // under fails naming the option and the sizes; one that holds everything
  // changes nothing.
  o.memory_limit = 1;
  EXPECT_EQ(ebb_engine_load(&o, &e), EBB_ERR_FAILED);
  EXPECT_TRUE(contains(last_error(), "options.memory_limit")) << last_error();
  EXPECT_TRUE(contains(last_error(), "is below what a step needs")) << last_error();
  o.memory_limit = 256ull << 20;
  EXPECT_EQ(greedy_text(o), cpu);
}

TEST(CApi, NullHandlesAndPointersAreInvalidArguments) {
  size_t n = 0;
  ebb_token t = 1;
  ebb_footprint fp;
  ebb_model_info info;
  ebb_residency* res = nullptr;
  ebb_session* s = nullptr;
  const ebb_session_options so = ebb_session_options_default();
  const ebb_generate_options go = ebb_generate_options_default();
  EXPECT_EQ(ebb_engine_load(nullptr, nullptr), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_engine_info(nullptr, &info), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "ebb_engine_info: engine is NULL")) << last_error();
  EXPECT_EQ(ebb_tokenize(nullptr, "a", 1, 1, 0, &t, 1, &n), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_detokenize(nullptr, &t, 1, 0, nullptr, 0, &n), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_session_create(nullptr, &so, &s), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_session_feed(nullptr, &t, 1), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "ebb_session_feed: session is NULL")) << last_error();
  EXPECT_EQ(ebb_session_tokens(nullptr, &t, 1, &n), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_generate(nullptr, &t, 1, &go, nullptr, nullptr, nullptr), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_engine_footprint(nullptr, &fp), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_engine_evict(nullptr, 1, nullptr), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_engine_restore(nullptr, nullptr), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_engine_set_memory_limit(nullptr, 1, nullptr), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_engine_residency(nullptr, &res), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(res, nullptr);
  // Freeing NULL is a no-op.
  EXPECT_EQ(ebb_session_free(nullptr), EBB_OK);
  EXPECT_EQ(ebb_engine_free(nullptr), EBB_OK);
  ebb_residency_free(nullptr);
}

TEST(CApi, LastErrorIsPerThreadAndKeptBySuccessfulCalls) {
  EXPECT_EQ(ebb_engine_footprint(nullptr, nullptr), EBB_ERR_INVALID_ARGUMENT);
  const std::string mine = last_error();
  EXPECT_TRUE(contains(mine, "ebb_engine_footprint")) << mine;
  std::string other = "unset";
  std::thread([&] { other = ebb_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_STRNE(ebb_version(), "");  // a successful call
  EXPECT_EQ(last_error(), mine);
}

// A failed allocation is a status, not an exception or a crash: in a child
// process whose address space is capped at 2 GiB, an engine planned for
// prefill batches of 2^20 tokens needs about 2.8 GiB of work buffers
// (stories260K: 672 floats of activations per token).
TEST(CApiDeathTest, FailedAllocationIsOutOfMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string model = test::model_path("stories260K.gguf");
  auto child = [&] {
    const rlimit cap{uint64_t{2} << 30, uint64_t{2} << 30};
    if (setrlimit(RLIMIT_AS, &cap) != 0) std::_Exit(3);
    ebb_engine_options o = ebb_engine_options_default();
    o.model_path = model.c_str();
    o.n_threads = 1;
    o.prefill_batch = 1 << 20;
    ebb_engine* e = reinterpret_cast<ebb_engine*>(0x1);
    const ebb_status st = ebb_engine_load(&o, &e);
    std::fprintf(stderr, "status %s: %s\n", ebb_status_name(st), ebb_last_error());
    std::_Exit(st == EBB_ERR_OUT_OF_MEMORY && e == nullptr ? 0 : 1);
  };
  EXPECT_EXIT(child(), testing::ExitedWithCode(0), "status out_of_memory: ebb_engine_load: .*out of memory");
}

TEST_F(CApiTest, RequestErrorsHaveTheirOwnStatus) {
  session = new_session(/*n_ctx=*/8);
  // Context full: the session is left unchanged.
  std::vector<ebb_token> nine(9, 300);
  EXPECT_EQ(ebb_session_feed(session, nine.data(), nine.size()), EBB_ERR_CONTEXT_FULL);
  EXPECT_TRUE(contains(last_error(), "context full: 9 tokens needed")) << last_error();
  EXPECT_TRUE(session_tokens(session).empty());
  // A token outside the vocabulary.
  const ebb_token bad[2] = {1, 1 << 20};
  EXPECT_EQ(ebb_session_feed(session, bad, 2), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "tokens[1] = 1048576 is outside the vocabulary")) << last_error();
  // Sampling out of range, named by the sampler's own check.
  ebb_generate_options go = ebb_generate_options_default();
  go.sampling.temperature = -1;
  EXPECT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, nullptr, nullptr, nullptr),
            EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "temperature")) << last_error();
  go = ebb_generate_options_default();
  go.sampling.struct_size = 0;
  EXPECT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, nullptr, nullptr, nullptr),
            EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "ebb_sampling_options_default")) << last_error();
  // Nothing to continue from.
  go = ebb_generate_options_default();
  EXPECT_EQ(ebb_generate(session, nullptr, 0, &go, nullptr, nullptr, nullptr), EBB_ERR_INVALID_ARGUMENT);
  // No logits before anything ran.
  const float* logits = nullptr;
  int32_t n_vocab = 0;
  EXPECT_EQ(ebb_session_logits(session, &logits, &n_vocab), EBB_ERR_FAILED);
  // Truncating past the end.
  EXPECT_EQ(ebb_session_truncate(session, 1), EBB_ERR_INVALID_ARGUMENT);
  // The engine outlives its sessions.
  EXPECT_EQ(ebb_engine_free(engine), EBB_ERR_BUSY);
  EXPECT_TRUE(contains(last_error(), "free them first")) << last_error();
  ebb_session_options so = ebb_session_options_default();
  so.kv_type = static_cast<ebb_kv_type>(7);
  ebb_session* s2 = nullptr;
  EXPECT_EQ(ebb_session_create(engine, &so, &s2), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s2, nullptr);
}

// ---- tokens ----------------------------------------------------------------

TEST_F(CApiTest, TokenizeAndDetokenizeMatchTheTokenizer) {
  const std::string text = "Once upon a time, there was a little dog.";
  size_t n = 0;
  EXPECT_EQ(ebb_tokenize(engine, text.data(), text.size(), 1, 0, nullptr, 0, &n), EBB_ERR_BUFFER_TOO_SMALL);
  const std::vector<TokenId> want = ref->tokenizer().encode(text);
  ASSERT_EQ(n, want.size());
  std::vector<ebb_token> got(n);
  ASSERT_EQ(ebb_tokenize(engine, text.data(), text.size(), 1, 0, got.data(), got.size(), &n), EBB_OK);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], ref->tokenizer().bos());
  // Without BOS.
  ASSERT_EQ(ebb_tokenize(engine, text.data(), text.size(), 0, 0, got.data(), got.size(), &n), EBB_OK);
  EXPECT_EQ(n, want.size() - 1);

  size_t bytes = 0;
  char small[4];
  EXPECT_EQ(ebb_detokenize(engine, want.data(), want.size(), 0, small, sizeof small, &bytes),
            EBB_ERR_BUFFER_TOO_SMALL);
  const std::string decoded = ref->tokenizer().decode(want);
  EXPECT_EQ(bytes, decoded.size());
  std::vector<char> buf(bytes + 1, 'x');
  ASSERT_EQ(ebb_detokenize(engine, want.data(), want.size(), 0, buf.data(), buf.size(), &bytes), EBB_OK);
  EXPECT_EQ(std::string(buf.data()), decoded);
  EXPECT_EQ(decoded, text);

  ebb_model_info info;
  ASSERT_EQ(ebb_engine_info(engine, &info), EBB_OK);
  EXPECT_EQ(info.n_vocab, ref->config().n_vocab);
  EXPECT_EQ(info.n_layer, ref->config().n_layer);
  EXPECT_EQ(info.bos, ref->tokenizer().bos());
  EXPECT_STREQ(info.architecture, ref->config().arch_name.c_str());
  EXPECT_STREQ(info.kernel_target, std::string(isa_name(ref->isa())).c_str());
  EXPECT_EQ(info.n_threads, 2);
}

// ---- generation ------------------------------------------------------------

TEST_F(CApiTest, GenerateEqualsTheCppApiForTheSameSeed) {
  for (const uint64_t seed : {uint64_t{7}, uint64_t{12345}}) {
    SCOPED_TRACE(seed);
    ebb_session* s = new_session();
    ebb_generate_options go = ebb_generate_options_default();
    go.max_tokens = 24;
    go.sampling.seed = seed;
    go.sampling.temperature = 1.0f;
    go.sampling.repeat_penalty = 1.1f;
    Collected got;
    ebb_generate_result r;
    ASSERT_EQ(ebb_generate(s, prompt.data(), prompt.size(), &go, collect, &got, &r), EBB_OK) << last_error();

    Session cs(*ref);
    GenerateOptions cgo;
    cgo.max_tokens = 24;
    cgo.sampling.seed = seed;
    cgo.sampling.temperature = 1.0f;
    cgo.sampling.repeat_penalty = 1.1f;
    std::string want_text;
    const GenerateStats want = generate(cs, prompt, cgo, [&](std::string_view t) {
      want_text += t;
      return true;
    });
    EXPECT_EQ(got.text, want_text);
    EXPECT_EQ(got.text, want.text);
    EXPECT_FALSE(got.text.empty());
    EXPECT_EQ(r.generated_tokens, want.generated_tokens);
    EXPECT_EQ(r.prompt_tokens, want.prompt_tokens);
    EXPECT_EQ(r.stop, static_cast<int>(want.stop));  // the enums keep the C++ order
    EXPECT_EQ(r.seed, seed);
    EXPECT_EQ(session_tokens(s), cs.tokens());  // prompt + generated, the pending one included
    // A second turn continues both conversations alike.
    const ebb_token more[1] = {prompt[1]};
    go.max_tokens = 8;
    cgo.max_tokens = 8;
    Collected got2;
    ASSERT_EQ(ebb_generate(s, more, 1, &go, collect, &got2, nullptr), EBB_OK) << last_error();
    const GenerateStats want2 = generate(cs, std::vector<TokenId>{prompt[1]}, cgo, nullptr);
    EXPECT_EQ(got2.text, want2.text);
    EXPECT_EQ(ebb_session_free(s), EBB_OK);
  }
}

TEST_F(CApiTest, StopStringsEndGenerationAsInTheCppApi) {
  session = new_session();
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = 40;
  go.sampling.temperature = 0;
  Collected full;
  ASSERT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, collect, &full, nullptr), EBB_OK);
  // A stop string from the middle of the greedy text.
  ASSERT_GT(full.text.size(), 30u);
  const std::string stop = full.text.substr(full.text.size() / 2, 4);
  const char* stops[2] = {"no such text anywhere", stop.c_str()};
  go.stop_strings = stops;
  go.n_stop_strings = 2;
  ASSERT_EQ(ebb_session_truncate(session, 0), EBB_OK);
  Collected cut;
  ebb_generate_result r;
  ASSERT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, collect, &cut, &r), EBB_OK);
  EXPECT_EQ(r.stop, EBB_STOP_STOP_STRING);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));

  Session cs(*ref);
  GenerateOptions cgo;
  cgo.max_tokens = 40;
  cgo.sampling.temperature = 0;
  cgo.stop_strings = {"no such text anywhere", stop};
  const GenerateStats want = generate(cs, prompt, cgo, nullptr);
  EXPECT_EQ(cut.text, want.text);
  EXPECT_EQ(r.generated_tokens, want.generated_tokens);
  // A NULL entry is refused.
  stops[1] = nullptr;
  EXPECT_EQ(ebb_generate(session, nullptr, 0, &go, nullptr, nullptr, nullptr), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "stop_strings[1] is NULL")) << last_error();
}

TEST_F(CApiTest, SeedZeroIsDrawnAndReportedSoTheRunRepeats) {
  session = new_session();
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = 24;
  go.sampling.temperature = 1.5f;
  go.sampling.seed = 0;
  Collected first;
  ebb_generate_result r;
  ASSERT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, collect, &first, &r), EBB_OK);
  EXPECT_NE(r.seed, 0u);
  ASSERT_EQ(ebb_session_truncate(session, 0), EBB_OK);
  go.sampling.seed = r.seed;
  Collected again;
  ASSERT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, collect, &again, nullptr), EBB_OK);
  EXPECT_EQ(again.text, first.text);
}

TEST_F(CApiTest, CallbackCancelsGeneration) {
  session = new_session();
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = 60;
  go.sampling.temperature = 0;
  go.stop_at_eog = 0;
  Collected all;
  ebb_generate_result full;
  ASSERT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, collect, &all, &full), EBB_OK);
  ASSERT_GT(all.pieces.size(), 5u);
  EXPECT_EQ(full.stop, EBB_STOP_MAX_TOKENS);

  ASSERT_EQ(ebb_session_truncate(session, 0), EBB_OK);
  Collected cut;
  cut.stop_after = 3;
  ebb_generate_result r;
  ASSERT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, collect, &cut, &r), EBB_OK);
  EXPECT_EQ(r.stop, EBB_STOP_CANCELLED);
  EXPECT_EQ(cut.pieces.size(), 3u);  // never called after it said stop
  EXPECT_LT(r.generated_tokens, full.generated_tokens);
  EXPECT_EQ(cut.text, all.pieces[0] + all.pieces[1] + all.pieces[2]);
  // The tokens generated so far are kept.
  EXPECT_EQ(session_tokens(session).size(), prompt.size() + static_cast<size_t>(r.generated_tokens));
}

// From inside the callback, reading works and changing is refused.
struct Reentry {
  ebb_engine* engine = nullptr;
  ebb_session* session = nullptr;
  ebb_status feed = EBB_OK, tokenize = EBB_ERR_INTERNAL, evict = EBB_OK, free_session = EBB_OK;
  std::string feed_error;
};

int reenter(const char*, size_t, void* user) {
  auto* r = static_cast<Reentry*>(user);
  const ebb_token t = 1;
  r->feed = ebb_session_feed(r->session, &t, 1);
  r->feed_error = ebb_last_error();
  size_t n = 0;
  r->tokenize = ebb_tokenize(r->engine, "a", 1, 0, 0, nullptr, 0, &n);
  r->evict = ebb_engine_evict(r->engine, 1, nullptr);
  r->free_session = ebb_session_free(r->session);
  return 1;
}

TEST_F(CApiTest, CallbackMayReadButNotChangeTheEngine) {
  session = new_session();
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = 10;
  go.stop_at_eog = 0;
  Reentry r;
  r.engine = engine;
  r.session = session;
  ASSERT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, reenter, &r, nullptr), EBB_OK);
  EXPECT_EQ(r.feed, EBB_ERR_BUSY);
  EXPECT_TRUE(contains(r.feed_error, "text callback")) << r.feed_error;
  EXPECT_EQ(r.tokenize, EBB_ERR_BUFFER_TOO_SMALL);  // it ran: one token, no room
  EXPECT_EQ(r.evict, EBB_ERR_BUSY);
  EXPECT_EQ(r.free_session, EBB_ERR_BUSY);
}

// Two threads generating on two sessions of one engine take turns on its
// lock, so each gets what it would get alone.
TEST_F(CApiTest, SessionsOfOneEngineOnTwoThreadsMatchTheirRunsAlone) {
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = 12;
  go.sampling.temperature = 0;
  go.stop_at_eog = 0;
  const std::vector<TokenId> other = ref->tokenizer().encode("The little cat");
  auto run = [&](const std::vector<TokenId>& p, std::string* text, ebb_status* st) {
    ebb_session* s = new_session();
    Collected c;
    *st = ebb_generate(s, p.data(), p.size(), &go, collect, &c, nullptr);
    *text = c.text;
    ebb_session_free(s);
  };
  std::string alone_a, alone_b, a, b;
  ebb_status sa = EBB_ERR_INTERNAL, sb = EBB_ERR_INTERNAL;
  run(prompt, &alone_a, &sa);
  run(other, &alone_b, &sb);
  ASSERT_EQ(sa, EBB_OK);
  ASSERT_EQ(sb, EBB_OK);
  std::thread ta(run, std::cref(prompt), &a, &sa), tb(run, std::cref(other), &b, &sb);
  ta.join();
  tb.join();
  EXPECT_EQ(sa, EBB_OK);
  EXPECT_EQ(sb, EBB_OK);
  EXPECT_EQ(a, alone_a);
  EXPECT_EQ(b, alone_b);
  EXPECT_NE(alone_a, alone_b);
}

TEST_F(CApiTest, FeedAndLogitsEqualTheCppSession) {
  session = new_session();
  ASSERT_EQ(ebb_session_feed(session, prompt.data(), prompt.size()), EBB_OK) << last_error();
  const float* logits = nullptr;
  int32_t n_vocab = 0;
  ASSERT_EQ(ebb_session_logits(session, &logits, &n_vocab), EBB_OK) << last_error();
  Session cs(*ref);
  const std::span<const float> want = cs.feed(prompt);
  ASSERT_EQ(static_cast<size_t>(n_vocab), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(logits[i], want[i]) << i;
}

// ---- adapters --------------------------------------------------------------

std::string lora_file() { return test::shared_path("golden/lora/stories260K.lora-r4.gguf"); }

// Logits with an adapter bound through C equal the C++ session's with the
// same adapter and scale, bit for bit; unbinding gives the base model's.
TEST_F(CApiTest, AdapterLogitsEqualTheCppApi) {
  ASSERT_EQ(ebb_adapter_load(engine, lora_file().c_str(), "story"), EBB_OK) << last_error();
  session = new_session();
  const char* names[] = {"story"};
  const float scales[] = {0.7f};
  ASSERT_EQ(ebb_session_set_adapters(session, names, scales, 1), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_feed(session, prompt.data(), prompt.size()), EBB_OK) << last_error();
  const float* logits = nullptr;
  int32_t n_vocab = 0;
  ASSERT_EQ(ebb_session_logits(session, &logits, &n_vocab), EBB_OK) << last_error();
  ref->adapters().load(lora_file(), "story");
  Session cs(*ref);
  cs.set_adapters({{"story", 0.7f}});
  const std::span<const float> ws = cs.feed(prompt);
  const std::vector<float> want(ws.begin(), ws.end());
  ASSERT_EQ(static_cast<size_t>(n_vocab), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(logits[i], want[i]) << i;

  ebb_footprint f;
  ASSERT_EQ(ebb_engine_footprint(engine, &f), EBB_OK);
  EXPECT_EQ(f.adapters, ref->footprint().adapters);
  EXPECT_GT(f.adapters, 0u);

  // n = 0: the base model (the KV is recomputed without the adapter).
  ASSERT_EQ(ebb_session_set_adapters(session, nullptr, nullptr, 0), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_feed(session, nullptr, 0), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_logits(session, &logits, &n_vocab), EBB_OK) << last_error();
  Session base(*ref);
  const std::span<const float> b = base.feed(prompt);
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(logits[i], b[i]) << i;
  // scales NULL: 1.0 each.
  ASSERT_EQ(ebb_session_set_adapters(session, names, nullptr, 1), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_feed(session, nullptr, 0), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_logits(session, &logits, &n_vocab), EBB_OK) << last_error();
  Session one(*ref);
  one.set_adapters({{"story", 1.0f}});
  const std::span<const float> w1 = one.feed(prompt);
  for (size_t i = 0; i < w1.size(); ++i) ASSERT_EQ(logits[i], w1[i]) << i;
}

// Evicted through C, an adapter leaves the footprint and comes back from its
// file at the next feed with the same logits.
TEST_F(CApiTest, AdapterEvictedThroughCIsRestoredOnUse) {
  ASSERT_EQ(ebb_adapter_load(engine, lora_file().c_str(), nullptr), EBB_OK) << last_error();  // name: file stem
  session = new_session();
  const char* names[] = {"stories260K.lora-r4"};
  ASSERT_EQ(ebb_session_set_adapters(session, names, nullptr, 1), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_feed(session, prompt.data(), prompt.size()), EBB_OK) << last_error();
  const float* logits = nullptr;
  int32_t n_vocab = 0;
  ASSERT_EQ(ebb_session_logits(session, &logits, &n_vocab), EBB_OK);
  const std::vector<float> want(logits, logits + n_vocab);
  ebb_footprint f;
  ASSERT_EQ(ebb_engine_footprint(engine, &f), EBB_OK);
  const uint64_t bytes = f.adapters;
  ebb_evict_result r;
  ASSERT_EQ(ebb_engine_evict(engine, bytes, &r), EBB_OK) << last_error();
  EXPECT_GE(r.freed, bytes);
  ASSERT_EQ(ebb_engine_footprint(engine, &f), EBB_OK);
  EXPECT_EQ(f.adapters, 0u);
  EXPECT_EQ(f.adapters_stored, bytes);
  ebb_session* again = new_session();
  ASSERT_EQ(ebb_session_set_adapters(again, names, nullptr, 1), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_feed(again, prompt.data(), prompt.size()), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_logits(again, &logits, &n_vocab), EBB_OK);
  for (int32_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], want[static_cast<size_t>(i)]) << i;
  ASSERT_EQ(ebb_engine_footprint(engine, &f), EBB_OK);
  EXPECT_EQ(f.adapters, bytes);
  EXPECT_EQ(ebb_session_free(again), EBB_OK);
}

TEST_F(CApiTest, AdapterErrorsHaveTheirStatusAndName) {
  EXPECT_EQ(ebb_adapter_load(engine, "/nonexistent/x.gguf", "x"), EBB_ERR_IO);
  EXPECT_TRUE(contains(last_error(), "/nonexistent/x.gguf")) << last_error();
  EXPECT_EQ(ebb_adapter_load(engine, model.c_str(), "x"), EBB_ERR_MODEL);  // a model, not an adapter
  EXPECT_TRUE(contains(last_error(), "not an adapter")) << last_error();
  EXPECT_EQ(ebb_adapter_load(engine, lora_file().c_str(), "bad name"), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_adapter_load(nullptr, lora_file().c_str(), "x"), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_adapter_load(engine, nullptr, "x"), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ebb_adapter_unload(engine, "nobody"), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "nobody")) << last_error();

  session = new_session();
  const char* unknown[] = {"nobody"};
  EXPECT_EQ(ebb_session_set_adapters(session, unknown, nullptr, 1), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "nobody")) << last_error();
  EXPECT_EQ(ebb_session_set_adapters(session, nullptr, nullptr, 1), EBB_ERR_INVALID_ARGUMENT);
  const char* null_name[] = {nullptr};
  EXPECT_EQ(ebb_session_set_adapters(session, null_name, nullptr, 1), EBB_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(ebb_adapter_load(engine, lora_file().c_str(), "story"), EBB_OK) << last_error();
  const char* twice[] = {"story", "story"};
  EXPECT_EQ(ebb_session_set_adapters(session, twice, nullptr, 2), EBB_ERR_INVALID_ARGUMENT);
  const char* names[] = {"story"};
  const float nan[] = {std::nanf("")};
  EXPECT_EQ(ebb_session_set_adapters(session, names, nan, 1), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "scales[0]")) << last_error();

  // Unloaded while bound: the next feed fails, naming it; rebinding mends it.
  ASSERT_EQ(ebb_session_set_adapters(session, names, nullptr, 1), EBB_OK) << last_error();
  ASSERT_EQ(ebb_adapter_unload(engine, "story"), EBB_OK) << last_error();
  EXPECT_EQ(ebb_session_feed(session, prompt.data(), prompt.size()), EBB_ERR_FAILED);
  EXPECT_TRUE(contains(last_error(), "story")) << last_error();
  ASSERT_EQ(ebb_session_set_adapters(session, nullptr, nullptr, 0), EBB_OK) << last_error();
  EXPECT_EQ(ebb_session_feed(session, prompt.data(), prompt.size()), EBB_OK) << last_error();
}

// ---- memory ----------------------------------------------------------------

TEST_F(CApiTest, EvictRestoreAndFootprintThroughC) {
  session = new_session();
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = 60;
  go.stop_at_eog = 0;
  go.sampling.seed = 3;
  ASSERT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, nullptr, nullptr, nullptr), EBB_OK);

  ebb_footprint before;
  ASSERT_EQ(ebb_engine_footprint(engine, &before), EBB_OK);
  EXPECT_GT(before.weights, 0u);
  EXPECT_GT(before.kv, 0u);
  EXPECT_EQ(before.total,
            before.weights + before.globals + before.kv + before.scratch + before.compressed + before.io_buffers);
  EXPECT_EQ(before.weights_stored, 0u);

  ebb_residency* res = nullptr;
  ASSERT_EQ(ebb_engine_residency(engine, &res), EBB_OK);
  ASSERT_EQ(res->n_layer, ref->config().n_layer);
  for (int l = 0; l < res->n_layer; ++l) {
    EXPECT_EQ(res->weights[l], EBB_UNIT_RESIDENT);
    EXPECT_EQ(res->n_chunks[l], (static_cast<int64_t>(prompt.size()) + 59 + kChunk - 1) / kChunk);
    for (int c = 0; c < res->n_chunks[l]; ++c) EXPECT_EQ(res->chunks[l][c], EBB_UNIT_RESIDENT);
  }
  ebb_residency_free(res);

  // The same steps on the C++ API, to compare with.
  Session cs(*ref);
  GenerateOptions cgo;
  cgo.max_tokens = 60;
  cgo.stop_at_eog = false;
  cgo.sampling.seed = 3;
  generate(cs, prompt, cgo, nullptr);

  const uint64_t ask = before.weights + before.kv;  // everything that can go
  ebb_evict_result ev;
  ASSERT_EQ(ebb_engine_evict(engine, ask, &ev), EBB_OK) << last_error();
  const EvictReport cev = ref->evict(ask);
  EXPECT_EQ(ev.requested, ask);
  EXPECT_GT(ev.freed, 0u);
  EXPECT_EQ(ev.freed, cev.freed);
  EXPECT_EQ(ev.weight_layers_dropped, cev.weights_dropped);
  EXPECT_EQ(ev.kv_chunks_compressed + ev.kv_chunks_stored, cev.kv_to_compressed + cev.kv_to_storage);

  ebb_footprint after;
  ASSERT_EQ(ebb_engine_footprint(engine, &after), EBB_OK);
  EXPECT_LT(after.weights + after.kv, before.weights + before.kv);
  EXPECT_EQ(after.weights_stored, ref->footprint().weights_stored);
  EXPECT_EQ(after.kv_stored + after.compressed > 0 || after.weights_stored > 0, true);

  // The residency map shows the evicted units, as arrays and as the grid.
  ASSERT_EQ(ebb_engine_residency(engine, &res), EBB_OK);
  const ResidencyMap want_map = ref->elastic()->residency();
  EXPECT_EQ(std::string(res->grid), want_map.grid());
  int not_resident = 0;
  std::string grid_from_arrays;
  for (int l = 0; l < res->n_layer; ++l) {
    EXPECT_EQ(res->weights[l], static_cast<int>(want_map.weights[l]));
    not_resident += res->weights[l] != EBB_UNIT_RESIDENT;
    ASSERT_EQ(static_cast<size_t>(res->n_chunks[l]), want_map.kv[l].size());
    for (int c = 0; c < res->n_chunks[l]; ++c) {
      EXPECT_EQ(res->chunks[l][c], static_cast<int>(want_map.kv[l][c]));
      not_resident += res->chunks[l][c] != EBB_UNIT_RESIDENT;
    }
  }
  EXPECT_GT(not_resident, 0);
  ebb_residency_free(res);

  ebb_restore_result rr;
  ASSERT_EQ(ebb_engine_restore(engine, &rr), EBB_OK) << last_error();
  ref->restore();
  ebb_footprint restored;
  ASSERT_EQ(ebb_engine_footprint(engine, &restored), EBB_OK);
  EXPECT_EQ(restored.weights, before.weights);
  EXPECT_EQ(restored.kv, before.kv);
  EXPECT_EQ(restored.weights_stored, 0u);
  EXPECT_EQ(restored.kv_stored + restored.compressed, 0u);
  ASSERT_EQ(ebb_engine_residency(engine, &res), EBB_OK);
  for (int l = 0; l < res->n_layer; ++l) {
    EXPECT_EQ(res->weights[l], EBB_UNIT_RESIDENT);
    for (int c = 0; c < res->n_chunks[l]; ++c) EXPECT_EQ(res->chunks[l][c], EBB_UNIT_RESIDENT);
  }
  ebb_residency_free(res);

  // Both go on alike after the round trip.
  Collected got;
  go.max_tokens = 20;
  ASSERT_EQ(ebb_generate(session, nullptr, 0, &go, collect, &got, nullptr), EBB_OK) << last_error();
  cgo.max_tokens = 20;
  EXPECT_EQ(got.text, generate(cs, {}, cgo, nullptr).text);
}

TEST_F(CApiTest, MemoryLimitEvictsDownToItAndGenerationStreamsUnderIt) {
  session = new_session();
  ASSERT_EQ(ebb_session_feed(session, prompt.data(), prompt.size()), EBB_OK);
  ebb_footprint before;
  ASSERT_EQ(ebb_engine_footprint(engine, &before), EBB_OK);
  const uint64_t limit = (before.weights + before.kv) / 2;
  ebb_evict_result ev;
  ASSERT_EQ(ebb_engine_set_memory_limit(engine, limit, &ev), EBB_OK) << last_error();
  EXPECT_GT(ev.freed, 0u);
  ebb_footprint under;
  ASSERT_EQ(ebb_engine_footprint(engine, &under), EBB_OK);
  EXPECT_LE(under.weights + under.kv + under.compressed, limit);

  // Generation under the limit equals the C++ engine's under the same limit.
  Session cs(*ref);
  cs.feed(prompt);
  ref->set_memory_limit(limit);
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = 16;
  go.sampling.temperature = 0;
  Collected got;
  ASSERT_EQ(ebb_generate(session, nullptr, 0, &go, collect, &got, nullptr), EBB_OK) << last_error();
  GenerateOptions cgo;
  cgo.max_tokens = 16;
  cgo.sampling.temperature = 0;
  EXPECT_EQ(got.text, generate(cs, {}, cgo, nullptr).text);
  EXPECT_FALSE(got.text.empty());

  // Lifting the limit lets everything back.
  ASSERT_EQ(ebb_engine_set_memory_limit(engine, 0, nullptr), EBB_OK);
  ASSERT_EQ(ebb_engine_restore(engine, nullptr), EBB_OK);
  ebb_footprint lifted;
  ASSERT_EQ(ebb_engine_footprint(engine, &lifted), EBB_OK);
  EXPECT_EQ(lifted.weights, before.weights);
  EXPECT_EQ(lifted.weights_stored, 0u);
}

TEST(CApi, MemoryLimitOptionAppliesAtLoad) {
  test::TempDir dir("ebb-capi-limit");
  ebb_engine_options o = c_options(test::model_path("stories260K.gguf"), dir.path());
  ebb_engine* e = nullptr;
  ASSERT_EQ(ebb_engine_load(&o, &e), EBB_OK) << last_error();
  ebb_footprint full;
  ASSERT_EQ(ebb_engine_footprint(e, &full), EBB_OK);
  ASSERT_EQ(ebb_engine_free(e), EBB_OK);
  o.memory_limit = full.weights / 2;
  ASSERT_EQ(ebb_engine_load(&o, &e), EBB_OK) << last_error();
  ebb_footprint limited;
  ASSERT_EQ(ebb_engine_footprint(e, &limited), EBB_OK);
  EXPECT_LE(limited.weights, o.memory_limit);
  EXPECT_GT(limited.weights_stored, 0u);
  ASSERT_EQ(ebb_engine_free(e), EBB_OK);
}

TEST_F(CApiTest, SaveAndLoadRoundTripThroughC) {
  session = new_session();
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = 12;
  go.sampling.temperature = 0;
  ASSERT_EQ(ebb_generate(session, prompt.data(), prompt.size(), &go, nullptr, nullptr, nullptr), EBB_OK);
  const std::string path = dir.file("s.ebbs");
  ASSERT_EQ(ebb_session_save(session, path.c_str()), EBB_OK) << last_error();
  ebb_session* other = new_session();
  EXPECT_EQ(ebb_session_load(other, dir.file("missing").c_str()), EBB_ERR_IO);
  ASSERT_EQ(ebb_session_load(other, path.c_str()), EBB_OK) << last_error();
  EXPECT_EQ(session_tokens(other), session_tokens(session));
  Collected a, b;
  ASSERT_EQ(ebb_generate(session, nullptr, 0, &go, collect, &a, nullptr), EBB_OK);
  ASSERT_EQ(ebb_generate(other, nullptr, 0, &go, collect, &b, nullptr), EBB_OK);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(ebb_session_free(other), EBB_OK);
}

// ---- constrained output, chat templates, tool calls -------------------------

ebb_generate_options sampled(uint64_t seed, int64_t max_tokens) {
  ebb_generate_options go = ebb_generate_options_default();
  go.max_tokens = max_tokens;
  go.sampling.temperature = 1.0f;
  go.sampling.top_k = 0;
  go.sampling.top_p = 1.0f;
  go.sampling.min_p = 0.0f;
  go.sampling.seed = seed;
  return go;
}

TEST_F(CApiTest, JsonSchemaAndGbnfConstrainTheOutput) {
  session = new_session();
  ebb_constraint* schema = nullptr;
  ASSERT_EQ(ebb_constraint_from_json_schema(
                engine,
                R"({"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer",)"
                R"( "minimum": 1, "maximum": 9}}, "required": ["city", "days"], "additionalProperties": false})",
                &schema),
            EBB_OK)
      << last_error();
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    ASSERT_EQ(ebb_session_truncate(session, 0), EBB_OK);
    Collected c;
    ebb_generate_result r{};
    const ebb_generate_options go = sampled(seed, 80);
    ASSERT_EQ(ebb_generate_constrained(session, prompt.data(), prompt.size(), &go, schema, collect, &c, &r), EBB_OK)
        << last_error();
    EXPECT_EQ(r.stop, EBB_STOP_END_OF_GENERATION) << c.text;
    const nlohmann::json j = nlohmann::json::parse(c.text);
    ASSERT_TRUE(j.is_object()) << c.text;
    EXPECT_EQ(j.size(), 2u) << c.text;
    EXPECT_TRUE(j["city"] == "Paris" || j["city"] == "Oslo") << c.text;
    ASSERT_TRUE(j["days"].is_number_integer()) << c.text;
    EXPECT_GE(j["days"].get<int>(), 1);
    EXPECT_LE(j["days"].get<int>(), 9);
  }
  ebb_constraint_free(schema);

  ebb_constraint* yes_no = nullptr;
  ASSERT_EQ(ebb_constraint_from_gbnf(engine, "root ::= (\"yes\" | \"no\") \"!\"", &yes_no), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_truncate(session, 0), EBB_OK);
  Collected c;
  const ebb_generate_options go = sampled(7, 20);
  ASSERT_EQ(ebb_generate_constrained(session, prompt.data(), prompt.size(), &go, yes_no, collect, &c, nullptr), EBB_OK)
      << last_error();
  EXPECT_TRUE(c.text == "yes!" || c.text == "no!") << c.text;
  ebb_constraint_free(yes_no);

  // Errors: the status, and the message naming where and why.
  ebb_constraint* bad = reinterpret_cast<ebb_constraint*>(&c);  // set to NULL on failure
  EXPECT_EQ(ebb_constraint_from_gbnf(engine, "root ::= answer\nanswer ::= nope", &bad), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(bad, nullptr);
  EXPECT_TRUE(contains(last_error(), "grammar line 2")) << last_error();
  EXPECT_TRUE(contains(last_error(), "undefined rule 'nope'")) << last_error();
  EXPECT_EQ(ebb_constraint_from_json_schema(engine, R"({"type": "object", "properties": {"a": {"type": "strin"}}})", &bad),
            EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "#/properties/a")) << last_error();
  EXPECT_EQ(ebb_constraint_from_json_schema(engine, "{\"type\": ", &bad), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "not valid JSON")) << last_error();
  // NULL: any JSON object.
  ebb_constraint* any = nullptr;
  ASSERT_EQ(ebb_constraint_from_json_schema(engine, nullptr, &any), EBB_OK) << last_error();
  ASSERT_EQ(ebb_session_truncate(session, 0), EBB_OK);
  Collected o;
  const ebb_generate_options long_go = sampled(3, 60);
  ASSERT_EQ(ebb_generate_constrained(session, prompt.data(), prompt.size(), &long_go, any, collect, &o, nullptr), EBB_OK);
  EXPECT_EQ(o.text.substr(0, 1), "{") << o.text;
  ebb_constraint_free(any);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string chat_render(ebb_engine* e, const char* messages, const char* tools, int add_gen) {
  size_t n = 0;
  if (ebb_chat_render(e, messages, tools, add_gen, nullptr, 0, &n) != EBB_ERR_BUFFER_TOO_SMALL) return "ERROR: " + last_error();
  std::string s(n + 1, '\0');
  EXPECT_EQ(ebb_chat_render(e, messages, tools, add_gen, s.data(), s.size(), &n), EBB_OK) << last_error();
  s.resize(n);
  return s;
}

constexpr const char* kWeatherTools = R"([{"type": "function", "function": {"name": "get_weather",
  "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string",
  "maxLength": 12}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone":
  {"type": "string", "maxLength": 8}}, "required": ["zone"], "additionalProperties": false}}}])";

TEST_F(CApiTest, ChatRendersThroughTheTemplateAndReturnsToolCalls) {
  // stories260K has no template: the plain marker format, and no tools.
  EXPECT_EQ(chat_render(engine, R"([{"role": "user", "content": "Hi"}])", nullptr, 1), "User: Hi\nAssistant:");
  session = new_session(1024);
  ebb_chat_options co = ebb_chat_options_default();
  co.tools_json = kWeatherTools;
  ebb_chat_result* res = nullptr;
  EXPECT_EQ(ebb_chat(session, R"([{"role": "user", "content": "Hi"}])", &co, nullptr, nullptr, &res),
            EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "ebb_engine_set_chat_template")) << last_error();

  // Qwen3's real template: tools reach the prompt, calls come back parsed.
  const std::string qwen3 = read_text(test::shared_path("golden/templates/Qwen-Qwen3-0.6B.jinja"));
  EXPECT_EQ(ebb_engine_set_chat_template(engine, "{% for m in messages %}{{ m.content }"), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "line 1")) << last_error();
  ASSERT_EQ(ebb_engine_set_chat_template(engine, qwen3.c_str()), EBB_OK) << last_error();
  const char* msgs = R"([{"role": "user", "content": "Weather in Oslo?"}])";
  EXPECT_EQ(chat_render(engine, msgs, nullptr, 1),
            "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n");
  const std::string with_tools = chat_render(engine, msgs, kWeatherTools, 1);
  EXPECT_TRUE(contains(with_tools, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""))
      << with_tools;

  co.tool_choice = EBB_TOOL_CHOICE_REQUIRED;
  co.parallel_tool_calls = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    co.generate = sampled(seed, 200);
    ASSERT_EQ(ebb_chat(session, msgs, &co, nullptr, nullptr, &res), EBB_OK) << last_error();
    ASSERT_EQ(res->n_tool_calls, 1u) << res->text;
    const ebb_tool_call& call = res->tool_calls[0];
    EXPECT_EQ(std::string(call.id).substr(0, 5), "call_");
    const nlohmann::json args = nlohmann::json::parse(call.arguments);
    if (std::string(call.name) == "get_weather") {
      ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << call.arguments;
      EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << call.arguments;
      EXPECT_EQ(args.size(), 2u) << call.arguments;
    } else {
      EXPECT_EQ(std::string(call.name), "get_time");
      ASSERT_TRUE(args.contains("zone") && args["zone"].is_string()) << call.arguments;
    }
    EXPECT_TRUE(contains(res->text, "<tool_call>")) << res->text;
    EXPECT_EQ(std::string(res->content).find("<tool_call>"), std::string::npos) << res->content;
    ebb_chat_result_free(res);
  }

  // The next turn, with the call and its result in the history, keeps the
  // session's tokens of the prompt it shares and feeds only the rest.
  co.generate = sampled(4, 200);
  ASSERT_EQ(ebb_chat(session, msgs, &co, nullptr, nullptr, &res), EBB_OK) << last_error();
  ASSERT_EQ(res->n_tool_calls, 1u);
  nlohmann::json history = nlohmann::json::parse(msgs);
  history.push_back({{"role", "assistant"},
                     {"content", res->content},
                     {"tool_calls",
                      {{{"id", res->tool_calls[0].id},
                        {"type", "function"},
                        {"function", {{"name", res->tool_calls[0].name}, {"arguments", res->tool_calls[0].arguments}}}}}}});
  history.push_back({{"role", "tool"}, {"tool_call_id", res->tool_calls[0].id}, {"content", "12 C, rain"}});
  const int64_t first_prompt = res->generate.prompt_tokens;
  ebb_chat_result_free(res);
  const std::string rendered = chat_render(engine, history.dump().c_str(), kWeatherTools, 1);
  EXPECT_TRUE(contains(rendered, "<tool_response>\n12 C, rain\n</tool_response>")) << rendered;
  co.tool_choice = EBB_TOOL_CHOICE_NONE;
  co.generate = sampled(5, 8);
  ASSERT_EQ(ebb_chat(session, history.dump().c_str(), &co, nullptr, nullptr, &res), EBB_OK) << last_error();
  EXPECT_EQ(res->n_tool_calls, 0u);
  const std::vector<TokenId> all = ref->tokenizer().encode(rendered, {.add_bos = true, .parse_special = true});
  // The session held the previous prompt (system, tools, question) and the
  // call: only about the rest runs (a few tokens of slack where the two
  // texts are tokenized differently at the seam).
  const std::vector<TokenId> before =
      ref->tokenizer().encode(chat_render(engine, msgs, kWeatherTools, 1), {.add_bos = true, .parse_special = true});
  EXPECT_GT(res->generate.prompt_tokens, 0);
  EXPECT_LE(res->generate.prompt_tokens, static_cast<int64_t>(all.size() - before.size()) + 4)
      << "only what the session did not hold is fed (" << all.size() << " tokens in all, " << before.size()
      << " in the previous prompt, " << first_prompt << " fed then)";
  ebb_chat_result_free(res);

  // Bad input: JSON, the options, tools that cannot be a grammar.
  EXPECT_EQ(ebb_chat(session, "[{", &co, nullptr, nullptr, &res), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "messages_json is not valid JSON")) << last_error();
  EXPECT_EQ(res, nullptr);
  co.tool_choice = EBB_TOOL_CHOICE_REQUIRED;
  co.tools_json = R"([{"type": "function", "function": {"parameters": {}}}])";
  EXPECT_EQ(ebb_chat(session, msgs, &co, nullptr, nullptr, &res), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "options.tools_json")) << last_error();
  co.tools_json = nullptr;
  EXPECT_EQ(ebb_chat(session, msgs, &co, nullptr, nullptr, &res), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "no tools")) << last_error();
  ebb_chat_options wrong = co;
  wrong.struct_size = 8;
  EXPECT_EQ(ebb_chat(session, msgs, &wrong, nullptr, nullptr, &res), EBB_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(last_error(), "ebb_chat_options_default")) << last_error();
  // Back to the model's own (none): the marker format again.
  ASSERT_EQ(ebb_engine_set_chat_template(engine, nullptr), EBB_OK);
  EXPECT_EQ(chat_render(engine, R"([{"role": "user", "content": "Hi"}])", nullptr, 1), "User: Hi\nAssistant:");
}

}  // namespace
}  // namespace ebb
