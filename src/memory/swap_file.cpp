#include "memory/swap_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "platform/checksum.h"
#include "platform/error.h"

namespace ebb {

namespace fs = std::filesystem;

std::string default_swap_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "ebb" / "swap").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "ebb" / "swap").string();
  return (fs::temp_directory_path() / "ebb-swap").string();
}

namespace {

// Names are unique within the process by a counter and across processes by
// the pid; the counter is the only process-wide state here.
std::string unique_name() {
  static std::atomic<uint64_t> counter{0};
  return "ebb-swap-" + std::to_string(getpid()) + "-" + std::to_string(counter.fetch_add(1)) + ".bin";
}

}  // namespace

SwapFile::SwapFile(SwapFileOptions opts)
    : io_(opts.io), capacity_(align_up(opts.capacity)), max_capacity_(std::max(capacity_, align_up(opts.max_capacity))) {
  EBB_CHECK_MSG(io_ != nullptr, "SwapFileOptions::io is required");
  const std::string dir = opts.dir.empty() ? default_swap_dir() : opts.dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("swap directory " + dir + ": cannot create: " + ec.message());
  if (!fs::is_directory(dir, ec)) throw Error("swap directory " + dir + ": not a directory");
  const std::string path = (fs::path(dir) / unique_name()).string();
  try {
    file_ = DirectFile::create(path, capacity_);
  } catch (const Error& e) {
    throw Error("swap directory " + dir + " unusable: " + e.what());
  }
  // Unlinked at once: the open descriptor keeps the space, and a process
  // that dies leaves no swap file behind.
  ::unlink(path.c_str());
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

SwapFile::~SwapFile() {
  if (read_only_fd_ >= 0) ::close(read_only_fd_);
}

SwapSlot SwapFile::allocate(uint64_t bytes) {
  EBB_CHECK(bytes > 0);
  const uint64_t need = align_up(bytes);
  std::lock_guard lock(mu_);
  SwapSlot slot = first_fit_locked(bytes, need);
  if (!slot.valid() && grow_locked(need)) slot = first_fit_locked(bytes, need);
  return slot;
}

SwapSlot SwapFile::first_fit_locked(uint64_t bytes, uint64_t need) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    SwapSlot slot{it->first, bytes, need, 0};
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_.emplace(slot.offset + need, rest);
    used_ += need;
    return slot;
  }
  return {};
}

// At least doubles the file (a run of evictions grows it a few times, not
// once a chunk); the new space joins the free extent at the end, if any.
bool SwapFile::grow_locked(uint64_t need) {
  if (capacity_ >= max_capacity_) return false;
  uint64_t tail = 0;  // free bytes at the end of the file
  if (!free_.empty()) {
    auto last = std::prev(free_.end());
    if (last->first + last->second == capacity_) tail = last->second;
  }
  const uint64_t grown = std::min(max_capacity_, std::max(capacity_ * 2, capacity_ - tail + need));
  if (grown - capacity_ + tail < need) return false;
  const int rc = posix_fallocate(file_.fd(), static_cast<off_t>(capacity_), static_cast<off_t>(grown - capacity_));
  if (rc != 0) {
    growth_error_ = "cannot grow from " + std::to_string(capacity_ >> 20) + " MiB to " + std::to_string(grown >> 20) +
                    " MiB: " + (rc == ENOSPC ? std::string("no space left on device") : std::strerror(rc));
    return false;
  }
  const uint64_t off = capacity_ - tail;
  if (tail > 0) free_.erase(off);
  free_.emplace(off, grown - off);
  capacity_ = grown;
  return true;
}

uint64_t SwapFile::capacity() const {
  std::lock_guard lock(mu_);
  return capacity_;
}

std::string SwapFile::growth_error() const {
  std::lock_guard lock(mu_);
  return growth_error_;
}

void SwapFile::free(const SwapSlot& slot) {
  if (!slot.valid()) return;
  std::lock_guard lock(mu_);
  EBB_CHECK(slot.offset % kDirectAlign == 0 && slot.stored % kDirectAlign == 0 &&
            slot.offset + slot.stored <= capacity_);
  uint64_t off = slot.offset, len = slot.stored;
  auto next = free_.lower_bound(off);
  EBB_CHECK_MSG(next == free_.end() || next->first >= off + len, "swap slot freed twice");
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    EBB_CHECK_MSG(prev->first + prev->second <= off, "swap slot freed twice");
    if (prev->first + prev->second == off) {  // merge with the extent before
      off = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == off + len) {  // merge with the extent after
    len += next->second;
    free_.erase(next);
  }
  free_.emplace(off, len);
  used_ -= slot.stored;
}

uint64_t SwapFile::used() const {
  std::lock_guard lock(mu_);
  return used_;
}

uint64_t SwapFile::largest_free() const {
  std::lock_guard lock(mu_);
  uint64_t best = 0;
  for (const auto& [off, len] : free_) best = std::max(best, len);
  return best;
}

IoEngine::Ticket SwapFile::write_async(SwapSlot& slot, const void* src) {
  EBB_CHECK(slot.valid() && slot.stored >= slot.bytes);
  slot.crc = crc32c(src, slot.bytes);
  int fd = file_.fd();
  {
    std::lock_guard lock(mu_);
    if (fail_writes_ > 0) {
      --fail_writes_;
      fd = read_only_fd_;
    }
  }
  const IoRequest req{fd, slot.offset, const_cast<void*>(src), slot.stored, true};
  return io_->submit(std::span(&req, 1), file_.path());
}

void SwapFile::write(SwapSlot& slot, const void* src) { io_->wait(write_async(slot, src)); }

IoEngine::Ticket SwapFile::read_async(const SwapSlot& slot, void* dst) {
  EBB_CHECK(slot.valid());
  const IoRequest req{file_.fd(), slot.offset, dst, slot.stored, false};
  return io_->submit(std::span(&req, 1), file_.path());
}

bool SwapFile::verify(const SwapSlot& slot, const void* dst) const {
  file_.drop_cache(slot.offset, slot.stored);
  return crc32c(dst, slot.bytes) == slot.crc;
}

bool SwapFile::read(const SwapSlot& slot, void* dst) {
  if (!slot.valid()) return false;
  try {
    io_->wait(read_async(slot, dst));
  } catch (const Error&) {
    return false;
  }
  return verify(slot, dst);
}

void SwapFile::fail_writes_for_test(int n) {
  std::lock_guard lock(mu_);
  if (read_only_fd_ < 0) {
    const std::string self = "/proc/self/fd/" + std::to_string(file_.fd());
    read_only_fd_ = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
    if (read_only_fd_ < 0) throw Error(file_.path() + ": cannot open read-only: " + std::strerror(errno));
  }
  fail_writes_ = n;
}

void SwapFile::corrupt_for_test(const SwapSlot& slot, uint64_t at) {
  EBB_CHECK(slot.valid() && at < slot.bytes);
  // The file has no name any more; reach it through this process's descriptor.
  const std::string self = "/proc/self/fd/" + std::to_string(file_.fd());
  const int fd = ::open(self.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw Error(file_.path() + ": cannot open to corrupt: " + std::strerror(errno));
  const auto off = static_cast<off_t>(slot.offset + at);
  unsigned char b = 0;
  bool ok = ::pread(fd, &b, 1, off) == 1;
  b ^= 0xFF;
  ok = ok && ::pwrite(fd, &b, 1, off) == 1 && ::fsync(fd) == 0;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (!ok) throw Error(file_.path() + ": cannot corrupt slot at " + std::to_string(off));
}

}  // namespace ebb
