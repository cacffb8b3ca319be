// The in-memory compressed swap space (DESIGN.md "Swap spaces"). Eviction
// pushes compressed blobs (backward order), restoration pops them from the top
// (forward order), and the CompKV stage moves the oldest blobs, at the bottom,
// to storage: a stack with removal at both ends.
//
// Blobs live in segments allocated on demand through the Allocator
// (MemCategory::kCompressed) and freed as soon as they empty, so the ledger's
// kCompressed bytes follow what the stack really holds. Within a segment blobs
// are packed in push order at 64-byte boundaries; a blob that does not fit in
// the top segment's free tail starts a new segment (of its own size when it is
// larger than segment_bytes).
//
// Thread-safe; a pointer from push()/data() stays valid until its blob is
// removed.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>

#include "platform/allocator.h"

namespace ebb {

struct CompressedStackOptions {
  uint64_t segment_bytes = 4ull << 20;
};

class CompressedStack {
 public:
  using Handle = uint64_t;  // monotonically increasing id, in push order
  static constexpr uint64_t kAlign = 64;

  explicit CompressedStack(Allocator& alloc, CompressedStackOptions opts = {});
  CompressedStack(const CompressedStack&) = delete;
  CompressedStack& operator=(const CompressedStack&) = delete;

  // Reserves n (> 0) bytes on top; returns the handle and a 64-byte aligned
  // pointer to write into. Throws Error when memory runs out.
  std::pair<Handle, void*> push(uint64_t n);
  // Shrinks the top blob after compressing into its reserved space
  // (n_used <= the size reserved, > 0).
  void shrink_top(Handle h, uint64_t n_used);

  const void* data(Handle h) const;
  uint64_t size(Handle h) const;
  bool contains(Handle h) const;  // live (pushed, not removed or erased)

  Handle top() const;     // newest live blob; the stack must not be empty
  Handle bottom() const;  // oldest live blob; the stack must not be empty
  bool empty() const;
  size_t count() const;   // live blobs

  void pop_top();     // frees the top blob (and its segment when it empties)
  void pop_bottom();  // frees the oldest blob (and its segment when it empties)
  // Removes a blob anywhere: at an end it is popped at once; in the middle it
  // is marked dead and its space comes back when it reaches the top or bottom.
  void erase(Handle h);

  // Segment size of segments allocated from now on (>= kAlign).
  void set_segment_bytes(uint64_t n);
  // A segment size for blobs of blob_bytes: a whole number of them with their
  // alignment padding (4 when that is within [64 KiB, 4 MiB]; fewer, at least
  // one, when they are larger; more when they are smaller), so that no
  // segment ends in a gap one blob short.
  static uint64_t segment_bytes_for(uint64_t blob_bytes);
  uint64_t segment_bytes() const;

  uint64_t bytes_used() const;      // payload bytes of live blobs
  uint64_t bytes_reserved() const;  // bytes of allocated segments (what the ledger sees)
  size_t segments() const;

 private:
  struct Blob {
    Handle handle = 0;
    uint64_t segment = 0;  // segment id
    uint64_t offset = 0;   // in the segment
    uint64_t size = 0;
    bool dead = false;
  };
  struct Segment {
    Buffer buf;
    uint64_t end = 0;   // first free byte of the tail
    uint64_t live = 0;  // blobs (dead included) still in it
  };

  std::deque<Blob>::const_iterator find(Handle h) const;  // end() when absent
  const Blob& blob(Handle h) const;                      // live blob, checked
  Segment& segment(uint64_t id) { return segs_[id - first_seg_]; }
  void remove_top_locked();
  void remove_bottom_locked();
  void release_blob_locked(const Blob& b, bool from_top);

  Allocator& alloc_;
  CompressedStackOptions opts_;
  mutable std::mutex mu_;
  std::deque<Blob> blobs_;       // in handle order; never dead at either end
  Handle next_handle_ = 1;
  std::deque<Segment> segs_;     // ids [first_seg_, first_seg_ + segs_.size())
  uint64_t first_seg_ = 0;
  size_t live_ = 0;
  uint64_t bytes_used_ = 0;
  uint64_t bytes_reserved_ = 0;
};

}  // namespace ebb
