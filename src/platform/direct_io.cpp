// DirectFile and read_range. The asynchronous engine is in io_engine.cpp.
#include "platform/direct_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "platform/error.h"

namespace ebb {

namespace {

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not be buf.
  return strerror_r(err, buf, sizeof(buf));
}

// Opens with O_DIRECT and, when the filesystem refuses it, without.
int open_maybe_direct(const std::string& path, int flags, bool* direct) {
  int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0600);
  *direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
  return fd;
}

}  // namespace

DirectFile::~DirectFile() { close(); }

DirectFile& DirectFile::operator=(DirectFile&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = std::exchange(o.fd_, -1);
    direct_ = std::exchange(o.direct_, false);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

void DirectFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

DirectFile DirectFile::open_read(const std::string& path) {
  DirectFile f;
  f.path_ = path;
  f.fd_ = open_maybe_direct(path, O_RDONLY, &f.direct_);
  if (f.fd_ < 0) throw Error(path + ": cannot open for reading: " + errno_text(errno));
  struct stat st {};
  if (fstat(f.fd_, &st) != 0) throw Error(path + ": cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) throw Error(path + ": not a regular file");
  f.size_ = static_cast<uint64_t>(st.st_size);
  return f;
}

DirectFile DirectFile::create(const std::string& path, uint64_t bytes) {
  DirectFile f;
  f.path_ = path;
  f.fd_ = open_maybe_direct(path, O_RDWR | O_CREAT | O_TRUNC, &f.direct_);
  if (f.fd_ < 0) throw Error(path + ": cannot create: " + errno_text(errno));
  if (bytes > 0) {
    const int rc = bytes > static_cast<uint64_t>(INT64_MAX)
                       ? EFBIG
                       : posix_fallocate(f.fd_, 0, static_cast<off_t>(bytes));
    if (rc != 0) {
      f.close();
      ::unlink(path.c_str());  // never leave a half-allocated file behind
      throw Error(path + ": cannot preallocate " + std::to_string(bytes) + " bytes: " +
                  (rc == ENOSPC ? std::string("no space left on device") : errno_text(rc)));
    }
  }
  f.size_ = bytes;
  return f;
}

void DirectFile::drop_cache(uint64_t offset, uint64_t len) const {
  if (fd_ >= 0 && !direct_) {
    posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(len), POSIX_FADV_DONTNEED);
  }
}

namespace {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

// A small transient staging block for unaligned heads and tails; not LLM
// memory, so it does not go through the Allocator's ledger.
std::unique_ptr<uint8_t, AlignedFree> bounce_alloc(uint64_t bytes) {
  void* p = std::aligned_alloc(kDirectAlign, bytes);
  if (!p) throw Error("read_range: cannot allocate a " + std::to_string(bytes) + "-byte bounce buffer");
  return std::unique_ptr<uint8_t, AlignedFree>(static_cast<uint8_t*>(p));
}

}  // namespace

void coalesce_requests(std::vector<IoRequest>& reqs) {
  std::sort(reqs.begin(), reqs.end(), [](const IoRequest& a, const IoRequest& b) {
    return a.fd != b.fd ? a.fd < b.fd : a.offset < b.offset;
  });
  size_t n = 0;
  for (const IoRequest& r : reqs) {
    if (n > 0) {
      IoRequest& last = reqs[n - 1];
      if (last.fd == r.fd && last.write == r.write && last.offset + last.len == r.offset &&
          static_cast<uint8_t*>(last.buf) + last.len == r.buf) {
        last.len += r.len;
        continue;
      }
    }
    reqs[n++] = r;
  }
  reqs.resize(n);
}

void read_range(IoEngine& io, const DirectFile& file, uint64_t offset, void* dst, uint64_t len) {
  if (len == 0) return;
  EBB_CHECK(file.is_open());
  auto* out = static_cast<uint8_t*>(dst);
  const uint64_t end = offset + len;
  const uint64_t m0 = align_up(offset), m1 = align_down(end);  // aligned middle
  const bool mid_aligned = m1 > m0 && reinterpret_cast<uintptr_t>(out + (m0 - offset)) % kDirectAlign == 0;

  if (mid_aligned) {
    // Middle straight into dst; head and tail blocks through the bounce buffer.
    auto bounce = bounce_alloc(2 * kDirectAlign);
    std::vector<IoRequest> reqs;
    reqs.push_back({file.fd(), m0, out + (m0 - offset), m1 - m0, false});
    if (offset != m0) reqs.push_back({file.fd(), align_down(offset), bounce.get(), kDirectAlign, false});
    if (end != m1) reqs.push_back({file.fd(), m1, bounce.get() + kDirectAlign, kDirectAlign, false});
    io.run(reqs, file.path());
    if (offset != m0) std::memcpy(out, bounce.get() + (offset - align_down(offset)), m0 - offset);
    if (end != m1) std::memcpy(out + (m1 - offset), bounce.get() + kDirectAlign, end - m1);
  } else {
    // Everything through a bounce buffer of at most one engine request.
    const uint64_t a0 = align_down(offset), a1 = align_up(end);
    const uint64_t chunk = std::min<uint64_t>(a1 - a0, io.options().max_request);
    auto bounce = bounce_alloc(chunk);
    for (uint64_t pos = a0; pos < a1; pos += chunk) {
      const uint64_t n = std::min(chunk, a1 - pos);
      const IoRequest req{file.fd(), pos, bounce.get(), n, false};
      io.run(std::span(&req, 1), file.path());
      const uint64_t lo = std::max(pos, offset), hi = std::min(pos + n, end);
      std::memcpy(out + (lo - offset), bounce.get() + (lo - pos), hi - lo);
    }
  }
  file.drop_cache(align_down(offset), align_up(end) - align_down(offset));
}

}  // namespace ebb
