// Session files under hostile conditions (issue 21 item 7): a full disk, a
// FIFO where a file should be, and KV values that are not finite under a
// valid checksum.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <limits>

#include "platform/error.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "support.h"

namespace ebb {
namespace {

// Byte layout of a version-2 session file (src/runtime/session_file.cpp):
// version 1's 56-byte header, then the u64 adapter identity.
constexpr size_t kOffNLayer = 12, kOffKvHeads = 24, kOffHeadDim = 28, kOffKvType = 36, kOffNTokens = 40,
                 kOffNProcessed = 48, kHeaderBytes = 64;

template <class T>
T get(const std::vector<char>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

std::vector<char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Rewrites the trailing FNV-1a checksum so that it is valid for the bytes before it.
void write_with_valid_checksum(const std::string& path, std::vector<char> b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i + 8 < b.size(); ++i) h = (h ^ static_cast<uint8_t>(b[i])) * 0x100000001b3ull;
  std::memcpy(b.data() + b.size() - 8, &h, 8);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
}

class SessionFileTest : public testing::Test {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.model_path = test::model_path("stories260K.gguf");
    o.n_threads = 2;
    engine = std::make_unique<Engine>(o);
    prompt = engine->tokenizer().encode("Once upon a time");
  }
  void run(Session& s, int64_t n) {
    GenerateOptions go;
    go.max_tokens = n;
    go.sampling.temperature = 0;
    go.stop_at_eog = false;
    generate(s, prompt, go, nullptr);
  }
  std::unique_ptr<Engine> engine;
  std::vector<TokenId> prompt;
  test::TempDir dir{"ebb-session-file"};
};

// A small tmpfs, mounted for one test and unmounted after (the tests run as root in CI).
class SmallTmpfs {
 public:
  SmallTmpfs(const std::string& path, const char* size) : path_(path) {
    std::filesystem::create_directories(path);
    const std::string opts = std::string("size=") + size;
    if (::mount("tmpfs", path.c_str(), "tmpfs", 0, opts.c_str()) != 0)
      throw std::runtime_error("mount tmpfs at " + path + ": " + std::strerror(errno) + " (this test needs root)");
  }
  ~SmallTmpfs() { ::umount2(path_.c_str(), MNT_DETACH); }
  uint64_t free_bytes() const {
    struct statvfs v {};
    ::statvfs(path_.c_str(), &v);
    return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
  }

 private:
  std::string path_;
};

TEST_F(SessionFileTest, SaveOnFullDiskFailsAndLeavesNoTmpFile) {
  Session s(*engine);
  run(s, 48);
  const std::string roomy = dir.file("roomy.ebbsession");
  s.save(roomy);
  const uint64_t file_bytes = std::filesystem::file_size(roomy);
  ASSERT_GT(file_bytes, 3 * 4096u) << "the session must not fit in what the disk has left";

  SmallTmpfs fs(dir.file("mnt"), "64k");
  // An earlier save that must survive a failed one.
  const std::string path = dir.file("mnt/s.ebbsession");
  {
    Session small(*engine);
    run(small, 1);
    small.save(path);
  }
  const std::vector<char> before = slurp(path);
  // Fill the disk, leaving less than one session file of room.
  {
    std::ofstream fill(dir.file("mnt/filler"), std::ios::binary);
    const std::vector<char> page(4096, 'x');
    while (fs.free_bytes() > 8192 && fill.write(page.data(), page.size())) fill.flush();
  }
  const uint64_t free_before = fs.free_bytes();
  ASSERT_LT(free_before, file_bytes);
  try {
    s.save(path);
    FAIL() << "save on a full disk succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("write failed"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp")) << "the partial file is left behind";
  EXPECT_EQ(fs.free_bytes(), free_before) << "the failed save kept disk space";
  EXPECT_EQ(slurp(path), before) << "the earlier session file changed";
}

TEST_F(SessionFileTest, LoadOfAFifoIsRefusedWithoutBlocking) {
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  Session s(*engine);
  run(s, 4);
  const std::vector<TokenId> tokens = s.tokens();
  auto result = std::async(std::launch::async, [&]() -> std::string {
    try {
      s.load(fifo);
      return "loaded";
    } catch (const Error& e) {
      return e.what();
    }
  });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // It blocks in open(): a writer that opens and closes at once lets it go.
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
    result.wait();
    FAIL() << "load of a FIFO blocked (released by opening its write end)";
  }
  const std::string msg = result.get();
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
  EXPECT_EQ(s.tokens(), tokens) << "a refused load changed the session";
}

TEST_F(SessionFileTest, NonFiniteKvUnderAValidChecksumIsRefused) {
  const std::string path = dir.file("s.ebbsession");
  Session a(*engine);
  run(a, 8);
  a.save(path);
  const std::vector<char> good = slurp(path);
  const uint32_t n_layer = get<uint32_t>(good, kOffNLayer);
  const uint32_t kv_type = get<uint32_t>(good, kOffKvType);
  const uint64_t n_tokens = get<uint64_t>(good, kOffNTokens), n_proc = get<uint64_t>(good, kOffNProcessed);
  const uint64_t elem = kv_type == static_cast<uint32_t>(DType::kF16) ? 2 : 4;
  const uint64_t row = uint64_t{get<uint32_t>(good, kOffKvHeads)} * get<uint32_t>(good, kOffHeadDim) * elem;
  ASSERT_EQ(good.size(), kHeaderBytes + n_tokens * 4 + n_layer * 2 * n_proc * row + 8) << "layout changed";
  ASSERT_GE(n_layer, 2u);
  ASSERT_GE(n_proc, 4u);

  // Each case: layer, K or V, position, element, and the bytes put there.
  struct Case {
    uint32_t layer;
    bool v;
    uint64_t pos, elem_index;
    bool nan;
  };
  for (const Case& c : {Case{1, true, 3, 5, true}, Case{0, false, n_proc - 1, 0, false}}) {
    std::vector<char> bad = good;
    const uint64_t at = kHeaderBytes + n_tokens * 4 + (uint64_t{c.layer} * 2 + (c.v ? 1 : 0)) * n_proc * row +
                        c.pos * row + c.elem_index * elem;
    if (elem == 2) {
      const uint16_t h = c.nan ? 0x7e00 : 0xfc00;  // quiet NaN, -Inf
      std::memcpy(bad.data() + at, &h, 2);
    } else {
      const float f = c.nan ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
      std::memcpy(bad.data() + at, &f, 4);
    }
    write_with_valid_checksum(path, bad);
    Session b(*engine);
    try {
      b.load(path);
      FAIL() << "KV with a non-finite value was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("non-finite"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string(c.v ? "V" : "K") + " value at layer " + std::to_string(c.layer) + ", position " +
                       std::to_string(c.pos)),
                std::string::npos)
          << m;
    }
    EXPECT_TRUE(b.tokens().empty()) << "a refused load changed the session";
  }
  // The untouched file, rewritten the same way, still loads: the check above is the values', not the checksum's.
  write_with_valid_checksum(path, good);
  Session ok(*engine);
  ok.load(path);
  EXPECT_EQ(ok.tokens(), a.tokens());
}

}  // namespace
}  // namespace ebb
