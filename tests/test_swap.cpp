// Swap spaces: the storage swap file (slots round-trip on both I/O backends,
// first-fit reuse and coalescing, full file, corrupt slot detected, unusable
// directories, file removed) and the in-memory compressed stack (LIFO, both
// ends, erase in the middle, big blobs, segments returned to the ledger).
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "memory/compressed_stack.h"
#include "memory/swap_file.h"
#include "platform/allocator.h"
#include "platform/checksum.h"
#include "platform/error.h"
#include "support.h"

namespace ebb {
namespace {

namespace fs = std::filesystem;

void fill(uint8_t* p, uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

class SwapFileTest : public ::testing::TestWithParam<bool> {
 protected:
  ~SwapFileTest() override { fs::remove_all(dir_); }
  SwapFileOptions opts(uint64_t capacity) { return {dir_ + "/swap", capacity, &io_}; }
  Buffer aligned(uint64_t bytes) { return alloc_.allocate(align_up(bytes), MemCategory::kIoBuffer, kDirectAlign); }

  std::string dir_ = test::make_temp_dir("ebb-swap");
  IoEngine io_{IoOptions{.queue_depth = 4, .max_request = 64 << 10, .use_uring = GetParam()}};
  Ledger ledger_;
  Allocator alloc_{&ledger_};
};

TEST_P(SwapFileTest, RoundTripManySlotsOfRandomSizes) {
  SwapFile swap(opts(8 << 20));
  EXPECT_EQ(swap.capacity(), 8u << 20);
  // Preallocated: the (unlinked) file already holds its capacity.
  struct stat st {};
  ASSERT_EQ(::fstat(swap.fd(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 8u << 20);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 8u << 20);
  std::mt19937 rng(1);
  struct Item {
    SwapSlot slot;
    Buffer src;
  };
  std::vector<Item> items;
  std::vector<IoEngine::Ticket> writes;
  for (int i = 0; i < 40; ++i) {
    const uint64_t bytes = 1 + rng() % (150 << 10);
    Item it{swap.allocate(bytes), aligned(bytes)};
    ASSERT_TRUE(it.slot.valid());
    EXPECT_EQ(it.slot.offset % kDirectAlign, 0u);
    EXPECT_EQ(it.slot.stored, align_up(bytes));
    fill(it.src.as<uint8_t>(), bytes, 1000 + i);
    writes.push_back(swap.write_async(it.slot, it.src.data()));
    EXPECT_EQ(it.slot.crc, crc32c(it.src.data(), bytes));
    items.push_back(std::move(it));
  }
  for (auto t : writes) io_.wait(t);
  // Slots do not overlap: every payload reads back intact, asynchronously and synchronously.
  std::vector<Buffer> dsts;
  std::vector<IoEngine::Ticket> reads;
  for (auto& it : items) {
    dsts.push_back(aligned(it.slot.bytes));
    reads.push_back(swap.read_async(it.slot, dsts.back().data()));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    io_.wait(reads[i]);
    EXPECT_TRUE(swap.verify(items[i].slot, dsts[i].data())) << i;
    ASSERT_EQ(std::memcmp(dsts[i].data(), items[i].src.data(), items[i].slot.bytes), 0) << i;
    std::memset(dsts[i].data(), 0, items[i].slot.bytes);
    ASSERT_TRUE(swap.read(items[i].slot, dsts[i].data())) << i;
    ASSERT_EQ(std::memcmp(dsts[i].data(), items[i].src.data(), items[i].slot.bytes), 0) << i;
  }
}

TEST_P(SwapFileTest, FirstFitReuseAndCoalescing) {
  SwapFile swap(opts(10 * kDirectAlign));
  SwapSlot a = swap.allocate(kDirectAlign);      // [0, 4K)
  SwapSlot b = swap.allocate(2 * kDirectAlign);  // [4K, 12K)
  SwapSlot c = swap.allocate(100);               // [12K, 16K)
  SwapSlot d = swap.allocate(6 * kDirectAlign);  // [16K, 40K): the file is full
  ASSERT_TRUE(a.valid() && b.valid() && c.valid() && d.valid());
  EXPECT_EQ(b.offset, kDirectAlign);
  EXPECT_EQ(c.offset, 3 * kDirectAlign);
  EXPECT_EQ(swap.used(), 10 * kDirectAlign);
  EXPECT_FALSE(swap.allocate(1).valid());

  swap.free(b);  // hole of 8K at 4K
  EXPECT_EQ(swap.used(), 8 * kDirectAlign);
  SwapSlot e = swap.allocate(kDirectAlign + 1);  // fits the hole exactly
  EXPECT_EQ(e.offset, kDirectAlign);
  swap.free(e);
  // a, the hole and c coalesce into one 16K extent.
  swap.free(a);
  swap.free(c);
  EXPECT_EQ(swap.largest_free(), 4 * kDirectAlign);
  SwapSlot f = swap.allocate(4 * kDirectAlign);
  EXPECT_TRUE(f.valid());
  EXPECT_EQ(f.offset, 0u);
  swap.free(f);
  swap.free(d);
  EXPECT_EQ(swap.used(), 0u);
  EXPECT_EQ(swap.largest_free(), 10 * kDirectAlign);
}

TEST_P(SwapFileTest, FullFileReturnsInvalidSlot) {
  SwapFile swap(opts(5 * kDirectAlign + 1));  // rounded up to 6 blocks
  EXPECT_EQ(swap.capacity(), 6 * kDirectAlign);
  SwapSlot a = swap.allocate(4 * kDirectAlign);
  ASSERT_TRUE(a.valid());
  EXPECT_FALSE(swap.allocate(3 * kDirectAlign).valid());
  EXPECT_TRUE(swap.allocate(2 * kDirectAlign).valid());
  EXPECT_FALSE(swap.allocate(1).valid());
}

TEST_P(SwapFileTest, GrowsOnDemandUpToItsMaximumAndKeepsWhatItHolds) {
  SwapFileOptions o = opts(2 * kDirectAlign);
  o.max_capacity = 10 * kDirectAlign;
  SwapFile swap(o);
  const uint64_t bytes = 3 * kDirectAlign - 100;
  Buffer src = aligned(bytes), dst = aligned(bytes);
  fill(src.as<uint8_t>(), bytes, 9);
  SwapSlot a = swap.allocate(kDirectAlign);  // fits
  ASSERT_TRUE(a.valid());
  EXPECT_EQ(swap.capacity(), 2 * kDirectAlign);
  swap.write(a, src.data());
  SwapSlot b = swap.allocate(bytes);  // does not fit: 2 -> 4 blocks, b right after a
  ASSERT_TRUE(b.valid());
  EXPECT_EQ(b.offset, kDirectAlign);
  EXPECT_EQ(swap.capacity(), 4 * kDirectAlign);
  swap.write(b, src.data());
  SwapSlot c = swap.allocate(5 * kDirectAlign);  // 4 -> 9 blocks (doubling would not fit it)
  ASSERT_TRUE(c.valid());
  EXPECT_EQ(swap.capacity(), 9 * kDirectAlign);
  EXPECT_FALSE(swap.allocate(2 * kDirectAlign).valid());  // the maximum, 10, leaves room for 1
  EXPECT_EQ(swap.capacity(), 9 * kDirectAlign);
  SwapSlot d = swap.allocate(kDirectAlign);  // that one: 9 -> 10
  ASSERT_TRUE(d.valid());
  EXPECT_EQ(d.offset, 9 * kDirectAlign);
  EXPECT_EQ(swap.capacity(), 10 * kDirectAlign);
  EXPECT_FALSE(swap.allocate(1).valid());
  EXPECT_TRUE(swap.growth_error().empty());
  ASSERT_TRUE(swap.read(a, dst.data()));
  ASSERT_TRUE(swap.read(b, dst.data()));
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), bytes), 0);
  swap.free(a);
  swap.free(b);
  swap.free(c);
  swap.free(d);
  EXPECT_EQ(swap.used(), 0u);
  EXPECT_EQ(swap.largest_free(), 10 * kDirectAlign);
}

TEST_P(SwapFileTest, CorruptSlotIsDetected) {
  SwapFile swap(opts(1 << 20));
  const uint64_t bytes = 20000;
  Buffer src = aligned(bytes), dst = aligned(bytes);
  fill(src.as<uint8_t>(), bytes, 5);
  SwapSlot s = swap.allocate(bytes), other = swap.allocate(bytes);
  swap.write(s, src.data());
  swap.write(other, src.data());
  ASSERT_TRUE(swap.read(s, dst.data()));
  swap.corrupt_for_test(s, 12345);
  EXPECT_FALSE(swap.read(s, dst.data()));
  EXPECT_TRUE(swap.read(other, dst.data()));  // the neighbour is untouched
  // A slot whose recorded crc does not match (never written) is refused too.
  SwapSlot never = swap.allocate(bytes);
  never.crc = crc32c(src.data(), bytes);
  EXPECT_FALSE(swap.read(never, dst.data()));
}

TEST_P(SwapFileTest, FileLeavesNoNameBehind) {
  std::string path;
  {
    SwapFile a(opts(1 << 16)), b(opts(1 << 16));
    path = a.path();
    // Unlinked as soon as it is made, so a crash leaves nothing behind; the
    // space is held by the descriptor and works (the round-trip tests).
    EXPECT_FALSE(fs::exists(a.path()));
    EXPECT_NE(a.path(), b.path());
    EXPECT_EQ(fs::path(a.path()).parent_path(), fs::path(dir_ + "/swap"));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir_ + "/swap"));
}

TEST_P(SwapFileTest, ParentIsARegularFile) {
  std::ofstream(dir_ + "/plain") << "x";
  try {
    SwapFile swap({dir_ + "/plain/swap", 1 << 16, &io_});
    FAIL() << "a directory under a regular file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/plain/swap"), std::string::npos) << e.what();
  }
}

TEST_P(SwapFileTest, UnwritableDirectory) {
  const std::string ro = dir_ + "/ro";
  fs::create_directories(ro);
  ASSERT_EQ(chmod(ro.c_str(), 0500), 0);
  if (geteuid() != 0) {
    try {
      SwapFile swap({ro, 1 << 16, &io_});
      FAIL() << "an unwritable directory must throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(ro), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Permission denied"), std::string::npos) << e.what();
    }
  } else {
    // root ignores the mode bits: the file is created (ParentIsARegularFile
    // covers the failure path there).
    SwapFile swap({ro, 1 << 16, &io_});
    EXPECT_EQ(fs::path(swap.path()).parent_path(), fs::path(ro));
  }
  chmod(ro.c_str(), 0700);
}

TEST_P(SwapFileTest, ImpossibleCapacityThrowsAndLeavesNoFile) {
  // Larger than any ext4/xfs file: rejected before anything is allocated.
  try {
    SwapFile swap(opts(1ull << 62));
    FAIL() << "an impossible preallocation must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot preallocate"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir_ + "/swap"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir_ + "/swap"));
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapFileTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "uring" : "threads"; });

TEST(SwapDir, DefaultFollowsXdgCacheHome) {
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(default_swap_dir(), "/x/cache/ebb/swap");
  unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME"); home && *home) {
    EXPECT_EQ(default_swap_dir(), std::string(home) + "/.cache/ebb/swap");
  }
  if (old) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

// ---- compressed stack ----

class CompressedStackTest : public ::testing::Test {
 protected:
  int64_t ledger_bytes() const { return ledger_.bytes(MemCategory::kCompressed); }
  Ledger ledger_;
  Allocator alloc_{&ledger_};
};

// Writes a blob whose bytes are derived from its handle, and checks it.
void write_blob(void* p, uint64_t n, uint64_t h) { fill(static_cast<uint8_t*>(p), n, static_cast<uint32_t>(h)); }
bool blob_ok(const CompressedStack& s, CompressedStack::Handle h, uint64_t n) {
  std::vector<uint8_t> want(n);
  fill(want.data(), n, static_cast<uint32_t>(h));
  return s.size(h) == n && std::memcmp(s.data(h), want.data(), n) == 0;
}

TEST_F(CompressedStackTest, LifoRandomSizesKeepsDataAndFreesSegments) {
  CompressedStack s(alloc_, {.segment_bytes = 64 << 10});
  std::mt19937 rng(3);
  std::vector<std::pair<CompressedStack::Handle, uint64_t>> live;
  CompressedStack::Handle last = 0;
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 60; ++i) {
      const uint64_t n = 1 + rng() % (20 << 10);
      auto [h, p] = s.push(n);
      EXPECT_GT(h, last);  // handles only grow, even after pops
      last = h;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
      write_blob(p, n, h);
      live.emplace_back(h, n);
    }
    EXPECT_EQ(ledger_bytes(), static_cast<int64_t>(s.bytes_reserved()));
    EXPECT_GE(s.bytes_reserved(), s.bytes_used());
    for (int i = 0; i < 45; ++i) {  // pop most of it, newest first
      auto [h, n] = live.back();
      ASSERT_EQ(s.top(), h);
      ASSERT_TRUE(blob_ok(s, h, n)) << h;
      s.pop_top();
      live.pop_back();
    }
    uint64_t used = 0;
    for (auto [h, n] : live) used += n;
    EXPECT_EQ(s.bytes_used(), used);
    EXPECT_EQ(s.count(), live.size());
  }
  for (auto [h, n] : live) ASSERT_TRUE(blob_ok(s, h, n)) << h;
  while (!s.empty()) s.pop_top();
  EXPECT_EQ(s.bytes_used(), 0u);
  EXPECT_EQ(s.bytes_reserved(), 0u);
  EXPECT_EQ(s.segments(), 0u);
  EXPECT_EQ(ledger_bytes(), 0);
}

TEST_F(CompressedStackTest, SegmentsForABlobSizeHoldWholeBlobs) {
  // 540688 bytes: the int8 blob of a 256-token chunk of 8 KV heads of 128
  // (Qwen3-0.6B), 16 bytes past a multiple of 64. Four of them padded need
  // more than 4 x 540688, so such segments held three.
  for (uint64_t n : {uint64_t{1}, uint64_t{100}, uint64_t{16912}, uint64_t{540688}, uint64_t{1} << 20,
                     (uint64_t{1} << 20) + 1, uint64_t{5} << 20}) {
    const uint64_t slot = (n + 63) / 64 * 64;
    const uint64_t seg = CompressedStack::segment_bytes_for(n);
    ASSERT_EQ(seg % slot, 0u) << n;
    const uint64_t per = seg / slot;
    EXPECT_GE(per, 1u) << n;
    if (slot >= (16 << 10) && slot <= (1 << 20)) {
      EXPECT_EQ(per, 4u) << n;
    }
    EXPECT_LE(seg, std::max<uint64_t>(slot, 4 << 20)) << n;
    EXPECT_GE(seg, std::min<uint64_t>(slot * per, 64 << 10)) << n;
    CompressedStack s(alloc_, {.segment_bytes = seg});
    for (uint64_t i = 0; i < per; ++i) s.push(n);
    EXPECT_EQ(s.segments(), 1u) << n;
    s.push(n);
    EXPECT_EQ(s.segments(), 2u) << n;
    EXPECT_EQ(s.bytes_reserved(), 2 * seg) << n;
  }
}

TEST_F(CompressedStackTest, ShrinkTopReturnsSpaceToTheSegment) {
  CompressedStack s(alloc_, {.segment_bytes = 4096});
  auto [h1, p1] = s.push(4000);
  write_blob(p1, 1000, h1);
  s.shrink_top(h1, 1000);
  EXPECT_EQ(s.size(h1), 1000u);
  EXPECT_EQ(s.bytes_used(), 1000u);
  auto [h2, p2] = s.push(3000);  // fits behind the shrunk blob: no new segment
  EXPECT_EQ(s.segments(), 1u);
  EXPECT_EQ(static_cast<const uint8_t*>(p2), static_cast<const uint8_t*>(p1) + 1024);
  write_blob(p2, 3000, h2);
  EXPECT_TRUE(blob_ok(s, h1, 1000));
  EXPECT_TRUE(blob_ok(s, h2, 3000));
}

TEST_F(CompressedStackTest, PopBottomFreesOldestSegmentsFirst) {
  CompressedStack s(alloc_, {.segment_bytes = 8192});
  std::vector<CompressedStack::Handle> hs;
  for (int i = 0; i < 8; ++i) {  // two 4 KiB blobs per segment
    auto [h, p] = s.push(4096);
    write_blob(p, 4096, h);
    hs.push_back(h);
  }
  EXPECT_EQ(s.segments(), 4u);
  EXPECT_EQ(ledger_bytes(), 4 * 8192);
  EXPECT_EQ(s.bottom(), hs[0]);
  s.pop_bottom();
  EXPECT_EQ(ledger_bytes(), 4 * 8192);  // its segment still holds hs[1]
  s.pop_bottom();
  EXPECT_EQ(ledger_bytes(), 3 * 8192);
  EXPECT_EQ(s.bottom(), hs[2]);
  for (size_t i = 2; i < hs.size(); ++i) EXPECT_TRUE(blob_ok(s, hs[i], 4096)) << i;
  // Both ends in turn: popping the top frees the tail of the top segment for
  // the next push, while the bottom segment keeps its remaining blob.
  s.pop_top();  // hs[7]; its segment keeps hs[6]
  EXPECT_EQ(ledger_bytes(), 3 * 8192);
  auto [h, p] = s.push(4096);
  EXPECT_EQ(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(s.data(hs[6])) + 4096);
  write_blob(p, 4096, h);
  s.pop_bottom();  // hs[2]; its segment keeps hs[3]
  EXPECT_EQ(ledger_bytes(), 3 * 8192);
  EXPECT_EQ(s.count(), 5u);
  for (CompressedStack::Handle x : {hs[3], hs[4], hs[5], hs[6], h}) EXPECT_TRUE(blob_ok(s, x, 4096)) << x;
  while (!s.empty()) s.pop_bottom();
  EXPECT_EQ(ledger_bytes(), 0);
}

TEST_F(CompressedStackTest, EraseInTheMiddleIsReclaimedAtTheEnds) {
  CompressedStack s(alloc_, {.segment_bytes = 4096});
  std::vector<CompressedStack::Handle> hs;
  for (int i = 0; i < 6; ++i) {  // one blob per segment
    auto [h, p] = s.push(3000);
    write_blob(p, 3000, h);
    hs.push_back(h);
  }
  s.erase(hs[3]);
  s.erase(hs[4]);
  EXPECT_FALSE(s.contains(hs[3]));
  EXPECT_EQ(s.count(), 4u);
  EXPECT_EQ(s.bytes_used(), 4u * 3000);
  EXPECT_EQ(ledger_bytes(), 6 * 4096);  // dead blobs still hold their segments
  s.pop_top();                          // hs[5], then the dead hs[4] and hs[3] go too
  EXPECT_EQ(s.top(), hs[2]);
  EXPECT_EQ(ledger_bytes(), 3 * 4096);
  s.erase(hs[1]);
  s.erase(hs[0]);  // the bottom: popped at once, and the dead hs[1] after it
  EXPECT_EQ(s.bottom(), hs[2]);
  EXPECT_EQ(s.top(), hs[2]);
  EXPECT_EQ(ledger_bytes(), 4096);
  EXPECT_TRUE(blob_ok(s, hs[2], 3000));
  s.erase(hs[2]);
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(ledger_bytes(), 0);
}

TEST_F(CompressedStackTest, BlobLargerThanASegmentGetsItsOwn) {
  CompressedStack s(alloc_, {.segment_bytes = 16 << 10});
  auto [a, pa] = s.push(1000);
  write_blob(pa, 1000, a);
  auto [big, pbig] = s.push(100000);
  write_blob(pbig, 100000, big);
  auto [c, pc] = s.push(1000);
  write_blob(pc, 1000, c);
  EXPECT_EQ(s.segments(), 3u);
  EXPECT_EQ(ledger_bytes(), (16 << 10) + align_up(100000, 64) + (16 << 10));
  EXPECT_TRUE(blob_ok(s, a, 1000));
  EXPECT_TRUE(blob_ok(s, big, 100000));
  EXPECT_TRUE(blob_ok(s, c, 1000));
  s.pop_top();
  s.pop_top();
  EXPECT_EQ(ledger_bytes(), 16 << 10);
  s.pop_top();
  EXPECT_EQ(ledger_bytes(), 0);
}

}  // namespace
}  // namespace ebb
