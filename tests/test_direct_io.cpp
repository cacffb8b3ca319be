// Direct I/O: CRC-32C against its table reference and the standard vector;
// DirectFile; IoEngine on both backends (io_uring and I/O threads): round
// trips split into many pieces, concurrent tickets, short reads at end of
// file, errors that name the file, a destructor that waits; read_range;
// coalesced requests; buffer groups that give each member's pages back.
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "platform/allocator.h"
#include "platform/checksum.h"
#include "platform/direct_io.h"
#include "platform/error.h"
#include "support.h"

namespace ebb {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Bitwise CRC-32C straight from the definition: the reference of references.
uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0);
  }
  return ~c;
}

TEST(Crc32c, StandardVector) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c_scalar(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
  if (crc32c_hw_available()) {
    EXPECT_EQ(crc32c_hw(s, 9), 0xE3069283u);
  }
  EXPECT_EQ(crc32c(s, 0), 0u);
}

// Pieces checksummed apart and joined give the checksum of the whole, at
// every split of buffers from empty to a few MiB (as a restore splits a
// layer over two threads), and joining with an empty piece changes nothing.
TEST(Crc32c, CombineJoinsPiecesIntoTheWholesChecksum) {
  std::mt19937_64 rng(5);
  std::vector<uint8_t> buf((3u << 20) + 777);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{9}, size_t{4096}, size_t{100001}, buf.size()}) {
    const uint32_t whole = crc32c(buf.data(), n);
    for (size_t k : {size_t{0}, n / 3, n / 2, n > 0 ? n - 1 : 0, n}) {
      const uint32_t a = crc32c(buf.data(), k), b = crc32c(buf.data() + k, n - k);
      EXPECT_EQ(crc32c_combine(a, b, n - k), whole) << "n " << n << " split " << k;
    }
    EXPECT_EQ(crc32c_combine(whole, 0, 0), whole);
  }
  // Many pieces folded left to right, as the restore joins a layer's pieces.
  uint32_t c = 0;
  for (size_t at = 0; at < buf.size(); at += 65537) {
    const size_t len = std::min<size_t>(65537, buf.size() - at);
    c = crc32c_combine(c, crc32c(buf.data() + at, len), len);
  }
  EXPECT_EQ(c, crc32c(buf.data(), buf.size()));
}

TEST(Crc32c, ImplementationsAgreeOnRandomDataAndOddLengths) {
  const auto data = random_bytes(70000, 7);
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    const size_t off = rng() % 64, n = i < 100 ? static_cast<size_t>(i) : rng() % (data.size() - 64);
    const uint8_t* p = data.data() + off;
    const uint32_t want = crc32c_bitwise(p, n);
    ASSERT_EQ(crc32c_scalar(p, n), want) << "off " << off << " n " << n;
    ASSERT_EQ(crc32c(p, n), want) << "off " << off << " n " << n;
    if (crc32c_hw_available()) {
      ASSERT_EQ(crc32c_hw(p, n), want) << "off " << off << " n " << n;
    }
  }
}

TEST(Crc32c, SeedChainsPieces) {
  const auto data = random_bytes(10007, 3);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t k : {size_t{0}, size_t{1}, size_t{13}, size_t{4096}, size_t{10007}}) {
    const uint32_t a = crc32c(data.data(), k);
    EXPECT_EQ(crc32c(data.data() + k, data.size() - k, a), whole) << k;
    EXPECT_EQ(crc32c_scalar(data.data() + k, data.size() - k, crc32c_scalar(data.data(), k)), whole) << k;
  }
}

TEST(DirectIo, AlignHelpers) {
  EXPECT_EQ(align_down(4095), 0u);
  EXPECT_EQ(align_down(4096), 4096u);
  EXPECT_EQ(align_up(1), 4096u);
  EXPECT_EQ(align_up(4096), 4096u);
  EXPECT_EQ(align_up(0), 0u);
  EXPECT_EQ(align_up(65, 64), 128u);
}

// A temporary directory removed at the end of each test.
struct TempDir : test::TempDir {
  TempDir() : test::TempDir("ebb-dio") {}
};

void write_plain(const std::string& path, const std::vector<uint8_t>& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ::close(fd);
}

TEST(DirectIo, OpenErrorsNameThePath) {
  TempDir dir;
  try {
    DirectFile::open_read(dir.file("missing.bin"));
    FAIL() << "opening a missing file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DirectFile::create(dir.file("no/such/dir/x.bin"), 4096), Error);
}

TEST(DirectIo, CreatePreallocatesAndMoves) {
  TempDir dir;
  DirectFile f = DirectFile::create(dir.file("a.bin"), 3 * kDirectAlign);
  EXPECT_TRUE(f.is_open());
  EXPECT_EQ(f.size(), 3 * kDirectAlign);
  EXPECT_EQ(std::filesystem::file_size(dir.file("a.bin")), 3 * kDirectAlign);
  // /tmp is a disk filesystem on the development machines; tmpfs would refuse O_DIRECT.
  const int flags = fcntl(f.fd(), F_GETFL);
  EXPECT_EQ((flags & O_DIRECT) != 0, f.direct());
  const int fd = f.fd();
  DirectFile g = std::move(f);
  EXPECT_FALSE(f.is_open());
  EXPECT_EQ(g.fd(), fd);
  EXPECT_EQ(DirectFile::open_read(dir.file("a.bin")).size(), 3 * kDirectAlign);
}

bool kernel_has_uring() {
  io_uring ring;
  if (io_uring_queue_init(4, &ring, 0) != 0) return false;
  io_uring_queue_exit(&ring);
  return true;
}

class IoEngineTest : public ::testing::TestWithParam<bool> {
 protected:
  IoOptions opts(int qd = 4, uint64_t max_request = 16 << 10) const {
    return IoOptions{.queue_depth = qd, .max_request = max_request, .use_uring = GetParam()};
  }
  Buffer aligned(uint64_t bytes) { return alloc_.allocate(bytes, MemCategory::kIoBuffer, kDirectAlign); }
  TempDir dir_;
  Ledger ledger_;
  Allocator alloc_{&ledger_};
};

TEST_P(IoEngineTest, UsesTheRequestedBackend) {
  IoEngine io(opts());
  // The engine falls back to threads only when the kernel refuses io_uring.
  EXPECT_EQ(io.uses_uring(), GetParam() && kernel_has_uring());
  EXPECT_EQ(io.options().use_uring, io.uses_uring());
}

TEST_P(IoEngineTest, RoundTripManyPiecesAndRequests) {
  IoEngine io(opts(3, 8 << 10));
  const uint64_t n = 1 << 20;
  DirectFile f = DirectFile::create(dir_.file("rt.bin"), n);
  const auto data = random_bytes(n, 21);
  Buffer src = aligned(n), dst = aligned(n);
  std::memcpy(src.data(), data.data(), n);
  // Four requests of unequal sizes, each split into 8 KiB pieces.
  const uint64_t cuts[] = {0, 12288, 409600, 794624, n};
  std::vector<IoRequest> w, r;
  for (int i = 0; i < 4; ++i) {
    w.push_back({f.fd(), cuts[i], src.as<uint8_t>() + cuts[i], cuts[i + 1] - cuts[i], true});
    r.push_back({f.fd(), cuts[i], dst.as<uint8_t>() + cuts[i], cuts[i + 1] - cuts[i], false});
  }
  io.run(w, f.path());
  std::memset(dst.data(), 0xAB, n);
  io.run(r, f.path());
  EXPECT_EQ(std::memcmp(dst.data(), data.data(), n), 0);
}

TEST_P(IoEngineTest, ConcurrentTicketsFromSeveralThreads) {
  IoEngine io(opts(4, 4096));
  const uint64_t per = 64 << 10;
  const int n_threads = 4, rounds = 20;
  DirectFile f = DirectFile::create(dir_.file("cc.bin"), per * n_threads);
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < n_threads; ++t) {
    ts.emplace_back([&, t] {
      Buffer src = aligned(per), dst = aligned(per);
      for (int round = 0; round < rounds; ++round) {
        const auto data = random_bytes(per, 100 * t + round);
        std::memcpy(src.data(), data.data(), per);
        const IoRequest w{f.fd(), t * per, src.data(), per, true};
        IoEngine::Ticket tw = io.submit(std::span(&w, 1));
        io.wait(tw);
        const IoRequest rd{f.fd(), t * per, dst.data(), per, false};
        IoEngine::Ticket tr = io.submit(std::span(&rd, 1));
        while (!io.done(tr)) std::this_thread::yield();
        io.wait(tr);  // already done: returns at once
        if (std::memcmp(dst.data(), data.data(), per) != 0) bad.fetch_add(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(IoEngineTest, TicketsCompleteOutOfOrder) {
  IoEngine io(opts(2, 4096));
  const uint64_t n = 256 << 10;
  DirectFile f = DirectFile::create(dir_.file("oo.bin"), n);
  const auto data = random_bytes(n, 5);
  Buffer src = aligned(n);
  std::memcpy(src.data(), data.data(), n);
  const IoRequest w{f.fd(), 0, src.data(), n, true};
  io.run(std::span(&w, 1));
  std::vector<Buffer> dsts;
  std::vector<IoEngine::Ticket> tickets;
  for (int i = 0; i < 8; ++i) {
    dsts.push_back(aligned(n / 8));
    const IoRequest r{f.fd(), i * n / 8, dsts.back().data(), n / 8, false};
    tickets.push_back(io.submit(std::span(&r, 1)));
  }
  for (int i = 7; i >= 0; --i) {  // wait newest first
    io.wait(tickets[i]);
    EXPECT_EQ(std::memcmp(dsts[i].data(), data.data() + i * n / 8, n / 8), 0) << i;
  }
  EXPECT_TRUE(io.done(tickets[0]));
}

TEST_P(IoEngineTest, ShortReadAtEndOfFileZeroFills) {
  IoEngine io(opts(4, 8192));
  const auto data = random_bytes(10000, 9);  // not a multiple of 4 KiB
  write_plain(dir_.file("eof.bin"), data);
  DirectFile f = DirectFile::open_read(dir_.file("eof.bin"));
  EXPECT_EQ(f.size(), 10000u);
  Buffer dst = aligned(24576);
  std::memset(dst.data(), 0xCD, 24576);
  // Pieces: [0,8K) full, [8K,16K) short (1808 bytes), [16K,24K) past the end.
  const IoRequest r{f.fd(), 0, dst.data(), 24576, false};
  io.run(std::span(&r, 1));
  EXPECT_EQ(std::memcmp(dst.data(), data.data(), data.size()), 0);
  for (uint64_t i = data.size(); i < 24576; ++i) ASSERT_EQ(dst.as<uint8_t>()[i], 0) << i;
}

TEST_P(IoEngineTest, FailureNamesFileOffsetAndReason) {
  IoEngine io(opts());
  write_plain(dir_.file("ro.bin"), random_bytes(8192, 1));
  DirectFile f = DirectFile::open_read(dir_.file("ro.bin"));
  Buffer buf = aligned(8192);
  // Writing through a read-only descriptor fails with EBADF.
  const IoRequest w{f.fd(), 4096, buf.data(), 4096, true};
  try {
    io.run(std::span(&w, 1), f.path());
    FAIL() << "a write to a read-only descriptor must throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ro.bin"), std::string::npos) << m;
    EXPECT_NE(m.find("write"), std::string::npos) << m;
    EXPECT_NE(m.find("offset 4096"), std::string::npos) << m;
    EXPECT_NE(m.find("Bad file descriptor"), std::string::npos) << m;
  }
  // done() keeps a failed ticket's error for wait().
  IoEngine::Ticket t = io.submit(std::span(&w, 1));
  while (!io.done(t)) std::this_thread::yield();
  EXPECT_THROW(io.wait(t), Error);
  // The engine still works afterwards.
  const IoRequest r{f.fd(), 0, buf.data(), 8192, false};
  EXPECT_NO_THROW(io.run(std::span(&r, 1)));
}

TEST_P(IoEngineTest, DestructorWaitsForEverythingInFlight) {
  const uint64_t n = 2 << 20;
  const auto data = random_bytes(n, 33);
  write_plain(dir_.file("d.bin"), data);
  DirectFile f = DirectFile::open_read(dir_.file("d.bin"));
  Buffer dst = aligned(n);
  std::memset(dst.data(), 0, n);
  {
    IoEngine io(opts(2, 4096));  // 512 pieces, two at a time
    const IoRequest r{f.fd(), 0, dst.data(), n, false};
    io.submit(std::span(&r, 1));
  }
  EXPECT_EQ(std::memcmp(dst.data(), data.data(), n), 0);
}

TEST_P(IoEngineTest, ReadRangeAnyOffsetAnyDestination) {
  IoEngine io(opts(4, 16 << 10));
  const uint64_t n = 300000;  // ends mid-block
  const auto data = random_bytes(n, 44);
  write_plain(dir_.file("rr.bin"), data);
  DirectFile f = DirectFile::open_read(dir_.file("rr.bin"));
  std::vector<uint8_t> dst(n + 8192 + 64);
  std::mt19937 rng(45);
  for (int i = 0; i < 60; ++i) {
    const uint64_t off = rng() % n, len = 1 + rng() % (n - off);
    // Half the time the destination lines up with the file's blocks so the
    // middle goes straight into it.
    uint8_t* base = dst.data() + (4096 - reinterpret_cast<uintptr_t>(dst.data()) % 4096);
    uint8_t* out = (i % 2 == 0) ? base + off % 4096 : base + 1 + rng() % 63;
    read_range(io, f, off, out, len);
    ASSERT_EQ(std::memcmp(out, data.data() + off, len), 0) << "off " << off << " len " << len;
  }
  // Past the end reads as zeros.
  std::vector<uint8_t> tail(5000, 0xEE);
  read_range(io, f, n - 1000, tail.data(), tail.size());
  EXPECT_EQ(std::memcmp(tail.data(), data.data() + n - 1000, 1000), 0);
  for (size_t i = 1000; i < tail.size(); ++i) ASSERT_EQ(tail[i], 0) << i;
}

TEST_P(IoEngineTest, CoalescedReadsOfNeighbouringSlotsGiveTheSameBytes) {
  IoEngine io(opts(4, 16 << 10));
  const uint64_t blk = kDirectAlign, n = 64 * blk;
  const auto data = random_bytes(n, 46);
  write_plain(dir_.file("co.bin"), data);
  DirectFile f = DirectFile::open_read(dir_.file("co.bin"));
  Buffer dst = aligned(n);
  std::memset(dst.data(), 0xEE, n);
  auto* d = dst.as<uint8_t>();
  // Slots of 1-3 blocks, listed out of order: runs whose file ranges and
  // buffers both follow on merge; a slot read into another place, a gap in
  // the file and a write stay separate.
  std::vector<IoRequest> reqs = {
      {f.fd(), 4 * blk, d + 4 * blk, 2 * blk, false},   // [4, 6)
      {f.fd(), 0, d, 1 * blk, false},                   // [0, 1)
      {f.fd(), 1 * blk, d + 1 * blk, 3 * blk, false},   // [1, 4): joins [0, 1) and [4, 6)
      {f.fd(), 8 * blk, d + 8 * blk, 1 * blk, false},   // gap at [6, 8)
      {f.fd(), 9 * blk, d + 20 * blk, 1 * blk, false},  // follows in the file, not in memory
      {f.fd(), 10 * blk, d + 10 * blk, 1 * blk, true},  // a write never joins a read
  };
  coalesce_requests(reqs);
  ASSERT_EQ(reqs.size(), 4u);
  EXPECT_EQ(reqs[0].offset, 0u);
  EXPECT_EQ(reqs[0].len, 6 * blk);
  EXPECT_EQ(reqs[1].offset, 8 * blk);
  EXPECT_EQ(reqs[1].len, 1 * blk);
  EXPECT_EQ(reqs[2].buf, d + 20 * blk);
  EXPECT_TRUE(reqs[3].write);
  reqs.pop_back();
  io.wait(io.submit(reqs, f.path()));
  EXPECT_EQ(std::memcmp(d, data.data(), 6 * blk), 0);
  EXPECT_EQ(std::memcmp(d + 8 * blk, data.data() + 8 * blk, blk), 0);
  EXPECT_EQ(std::memcmp(d + 20 * blk, data.data() + 9 * blk, blk), 0);
  for (uint64_t i = 6 * blk; i < 8 * blk; ++i) ASSERT_EQ(d[i], 0xEE) << i;
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "uring" : "threads"; });

uint64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

TEST(Allocator, GroupMembersAreDisjointAndEachGivesItsPagesBack) {
  Ledger ledger;
  Allocator alloc(&ledger);
  const size_t n = 16, bytes = (1 << 20) + 100;  // rounded to pages inside the group
  std::vector<Buffer> g = alloc.allocate_group(n, bytes, MemCategory::kKvCache);
  ASSERT_EQ(g.size(), n);
  EXPECT_EQ(ledger.bytes(MemCategory::kKvCache), static_cast<int64_t>(n * bytes));
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(g[i].size(), bytes);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(g[i].data()) % 4096, 0u);
    std::memset(g[i].data(), static_cast<int>(i + 1), bytes);
  }
  for (size_t i = 0; i < n; ++i)
    for (size_t at : {size_t{0}, bytes / 2, bytes - 1}) ASSERT_EQ(g[i].as<uint8_t>()[at], i + 1) << i;
  // Freeing every other member returns its pages, even when they shared a
  // huge page with a member that stays.
  const uint64_t before = rss_bytes();
  for (size_t i = 0; i < n; i += 2) g[i].reset();
  const uint64_t after = rss_bytes();
  EXPECT_GE(static_cast<double>(before - std::min(before, after)), 0.9 * (n / 2) * bytes)
      << "rss " << before << " -> " << after;
  EXPECT_EQ(ledger.bytes(MemCategory::kKvCache), static_cast<int64_t>(n / 2 * bytes));
  for (size_t i = 1; i < n; i += 2) ASSERT_EQ(g[i].as<uint8_t>()[bytes - 1], i + 1) << i;
  g.clear();
  EXPECT_EQ(ledger.bytes(MemCategory::kKvCache), 0);
  EXPECT_TRUE(alloc.allocate_group(0, bytes, MemCategory::kKvCache).empty());
}

// A populated group is in the RSS before anything is written to it (the KV
// chunks a turn reserves are, so that evicting them gives back what the
// ledger says), and reads as zeros.
TEST(Allocator, PopulatedGroupIsResidentAtOnce) {
  Ledger ledger;
  Allocator alloc(&ledger);
  const size_t n = 12, bytes = 1 << 20;
  const uint64_t before = rss_bytes();
  std::vector<Buffer> g = alloc.allocate_group(n, bytes, MemCategory::kKvCache, true);
  const uint64_t after = rss_bytes();
  EXPECT_GE(static_cast<double>(after - std::min(after, before)), 0.9 * n * bytes)
      << "rss " << before << " -> " << after;
  for (const Buffer& b : g)
    for (size_t at : {size_t{0}, bytes / 2, bytes - 1}) ASSERT_EQ(b.as<uint8_t>()[at], 0);
  const uint64_t full = rss_bytes();
  g.clear();
  EXPECT_GE(static_cast<double>(full - std::min(full, rss_bytes())), 0.9 * n * bytes);
}

}  // namespace
}  // namespace ebb
