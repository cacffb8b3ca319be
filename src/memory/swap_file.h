// A storage swap file (DESIGN.md "Swap spaces"): one preallocated file per
// SwapFile, written and read with direct I/O in 4 KiB-aligned slots, with a
// CRC-32C per slot so a corrupt slot is never silently used (the caller
// recomputes the affected KV from the session's tokens).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "platform/direct_io.h"

namespace ebb {

struct SwapFileOptions {
  std::string dir;         // empty: default_swap_dir()
  uint64_t capacity = 0;   // bytes preallocated (rounded up to 4 KiB)
  IoEngine* io = nullptr;  // engine to use (required)
  // allocate() grows the file (doubling, posix_fallocate) up to this many
  // bytes when no free extent fits; <= capacity: the file never grows.
  uint64_t max_capacity = 0;
};

// $XDG_CACHE_HOME/ebb/swap, else $HOME/.cache/ebb/swap, else <temp dir>/ebb-swap.
std::string default_swap_dir();

struct SwapSlot {
  uint64_t offset = 0;  // in the file, multiple of kDirectAlign
  uint64_t bytes = 0;   // payload bytes
  uint64_t stored = 0;  // 4 KiB-rounded extent on disk
  uint32_t crc = 0;     // crc32c of the payload, set by write
  bool valid() const { return stored != 0; }
};

// Slot allocation and free are thread-safe; I/O on distinct slots may run
// concurrently from several threads.
class SwapFile {
 public:
  // Creates `dir` and a uniquely named preallocated file in it (removed by the
  // destructor). Throws Error naming the directory when it cannot be created
  // or written, or the disk is full.
  explicit SwapFile(SwapFileOptions opts);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // Reserves a 4 KiB-aligned extent for `bytes` (> 0) payload bytes, first fit
  // over the free list, growing the file toward max_capacity when none fits;
  // an invalid slot when no extent is large enough and the file cannot grow
  // (at its maximum, or the disk is full: growth_error() says which).
  SwapSlot allocate(uint64_t bytes);
  // Returns the slot's extent to the free list (coalescing with neighbours).
  void free(const SwapSlot& slot);

  // Writes the payload. src is 4 KiB aligned and readable up to
  // align_up(slot.bytes); records the payload's crc in the slot.
  IoEngine::Ticket write_async(SwapSlot& slot, const void* src);
  void write(SwapSlot& slot, const void* src);  // throws Error when the write fails

  // Reads the slot into dst (4 KiB aligned, align_up(slot.bytes) writable).
  // After waiting on the ticket, verify() says whether dst holds the payload.
  IoEngine::Ticket read_async(const SwapSlot& slot, void* dst);
  bool verify(const SwapSlot& slot, const void* dst) const;
  // read_async + wait + verify. Never throws: false when the read fails or the
  // checksum does not match, and the caller recomputes.
  bool read(const SwapSlot& slot, void* dst);

  uint64_t capacity() const;
  uint64_t max_capacity() const { return max_capacity_; }
  std::string growth_error() const;  // why the last growth failed, "" when none did
  uint64_t used() const;                     // bytes of allocated extents
  uint64_t largest_free() const;             // largest extent allocate() could return now
  const std::string& path() const { return file_.path(); }
  bool direct() const { return file_.direct(); }
  int fd() const { return file_.fd(); }

  // Fault injection: flips the byte at `at` (< slot.bytes) of the slot on disk
  // with a plain pwrite + fsync.
  void corrupt_for_test(const SwapSlot& slot, uint64_t at);
  // Fault injection: the next `n` writes go to a read-only descriptor of the
  // file, so the kernel refuses them and their tickets report the error.
  void fail_writes_for_test(int n);

 private:
  SwapSlot first_fit_locked(uint64_t bytes, uint64_t need);
  bool grow_locked(uint64_t need);

  IoEngine* io_;
  uint64_t capacity_ = 0;      // guarded by mu_ (allocate grows it)
  uint64_t max_capacity_ = 0;
  std::string growth_error_;  // guarded by mu_
  DirectFile file_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length of free extents, disjoint, coalesced
  uint64_t used_ = 0;
  int fail_writes_ = 0;  // fail_writes_for_test: writes still to fail
  int read_only_fd_ = -1;
};

}  // namespace ebb
