// Direct storage I/O (DESIGN.md "Platform model"): files opened with O_DIRECT
// so the page cache never hides a storage cost, and an asynchronous engine
// (io_uring, or a pool of pread/pwrite threads where io_uring is unavailable)
// that keeps several large requests in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ebb {

// Offsets, lengths and buffers of direct I/O are multiples of this.
inline constexpr uint64_t kDirectAlign = 4096;

inline uint64_t align_down(uint64_t x, uint64_t a = kDirectAlign) { return x / a * a; }
inline uint64_t align_up(uint64_t x, uint64_t a = kDirectAlign) { return (x + a - 1) / a * a; }

// RAII file descriptor opened with O_DIRECT. If the filesystem refuses
// O_DIRECT (EINVAL, e.g. tmpfs) the file is opened without it, direct() is
// false, and readers call drop_cache() after reading so the page cache does not
// hide the storage cost of the next read.
class DirectFile {
 public:
  // Throws Error naming the path and the reason.
  static DirectFile open_read(const std::string& path);
  // Creates or truncates `path` for reading and writing and preallocates
  // `bytes` with posix_fallocate. A full disk throws
  // Error("<path>: cannot preallocate N bytes: no space left on device").
  static DirectFile create(const std::string& path, uint64_t bytes);

  DirectFile() = default;
  ~DirectFile();
  DirectFile(DirectFile&& o) noexcept { *this = std::move(o); }
  DirectFile& operator=(DirectFile&& o) noexcept;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  int fd() const { return fd_; }
  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  // at open (fstat), or the preallocated size
  bool is_open() const { return fd_ >= 0; }
  void close();

  // Drops [offset, offset+len) from the page cache when the file is not
  // opened with O_DIRECT (posix_fadvise DONTNEED); a no-op otherwise.
  void drop_cache(uint64_t offset, uint64_t len) const;

 private:
  int fd_ = -1;
  bool direct_ = false;
  uint64_t size_ = 0;
  std::string path_;
};

struct IoRequest {
  int fd = -1;
  uint64_t offset = 0;   // multiple of kDirectAlign
  void* buf = nullptr;   // aligned to kDirectAlign
  uint64_t len = 0;      // multiple of kDirectAlign
  bool write = false;
};

struct IoOptions {
  int queue_depth = 8;                // pieces in flight, over all tickets
  uint64_t max_request = 4ull << 20;  // larger requests are split into pieces of this size
  bool use_uring = true;              // false: a pool of queue_depth pread/pwrite threads
};

// Asynchronous reads and writes. io_uring (liburing) when io_uring_queue_init
// succeeds and use_uring is set, otherwise queue_depth I/O threads.
// Thread-safe: several threads may submit and wait concurrently.
//
// Every ticket should be waited once (or seen done() without error): the
// engine keeps a failed ticket's error until wait() reports it.
class IoEngine {
 public:
  using Ticket = uint64_t;

  explicit IoEngine(IoOptions opts = {});
  ~IoEngine();  // waits for everything in flight
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Queues a batch; at most queue_depth pieces are in flight at any time.
  // Returns at once. `path` names the file in error messages.
  Ticket submit(std::span<const IoRequest> reqs);
  Ticket submit(std::span<const IoRequest> reqs, std::string path);
  // Blocks until every piece of the ticket completed. Throws Error when any
  // failed, naming the file (when given), the offset and strerror. A short
  // read at end-of-file is not an error: the rest of the buffer is zeroed.
  void wait(Ticket t);
  bool done(Ticket t);  // non-blocking
  // submit + wait.
  void run(std::span<const IoRequest> reqs);
  void run(std::span<const IoRequest> reqs, std::string path);

  const IoOptions& options() const;
  bool uses_uring() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Fault injection for tests: the next `n` batches submitted for reading with
// this `path` (IoEngine::submit's error-message name) fail without reading
// anything, their buffers left as they were, as a failed device read leaves
// them; wait() throws "... injected read fault". n = 0 clears it. Any
// IoEngine in the process; thread-safe.
void fail_reads_for_test(const std::string& path, int n);

// Sorts requests by (fd, offset) and merges each one into the one before when
// both the file ranges and the buffers follow on without a gap, so reads of
// neighbouring slots into neighbouring buffers become one large request (the
// engine still cuts it into max_request pieces). Same bytes, fewer requests.
void coalesce_requests(std::vector<IoRequest>& reqs);

// Reads an arbitrary byte range of `file` into an arbitrary destination:
// direct I/O straight into dst for the aligned middle when dst lines up, and a
// small bounce buffer for the head and tail blocks (or for everything when dst
// does not line up). Bytes past end-of-file read as zero. Not a hot path.
void read_range(IoEngine& io, const DirectFile& file, uint64_t offset, void* dst, uint64_t len);

}  // namespace ebb
