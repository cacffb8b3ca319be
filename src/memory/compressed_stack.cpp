#include "memory/compressed_stack.h"

#include <algorithm>

#include "platform/direct_io.h"
#include "platform/error.h"

namespace ebb {

CompressedStack::CompressedStack(Allocator& alloc, CompressedStackOptions opts) : alloc_(alloc), opts_(opts) {
  EBB_CHECK(opts_.segment_bytes >= kAlign);
  opts_.segment_bytes = align_up(opts_.segment_bytes, kAlign);
}

uint64_t CompressedStack::segment_bytes_for(uint64_t blob_bytes) {
  constexpr uint64_t kMin = 64 << 10, kMax = 4 << 20;
  const uint64_t slot = align_up(std::max<uint64_t>(blob_bytes, 1), kAlign);
  uint64_t n = 4;
  if (n * slot > kMax) n = std::max<uint64_t>(1, kMax / slot);
  if (n * slot < kMin) n = kMin / slot;
  return n * slot;
}

std::pair<CompressedStack::Handle, void*> CompressedStack::push(uint64_t n) {
  EBB_CHECK(n > 0);
  const uint64_t need = align_up(n, kAlign);
  std::lock_guard lock(mu_);
  if (segs_.empty() || segs_.back().end + need > segs_.back().buf.size()) {
    Segment s;
    s.buf = alloc_.allocate(std::max(opts_.segment_bytes, need), MemCategory::kCompressed, kAlign);
    bytes_reserved_ += s.buf.size();
    segs_.push_back(std::move(s));
  }
  Segment& seg = segs_.back();
  const Blob b{next_handle_++, first_seg_ + segs_.size() - 1, seg.end, n, false};
  seg.end += need;
  ++seg.live;
  blobs_.push_back(b);
  ++live_;
  bytes_used_ += n;
  return {b.handle, seg.buf.as<uint8_t>() + b.offset};
}

std::deque<CompressedStack::Blob>::const_iterator CompressedStack::find(Handle h) const {
  auto it = std::lower_bound(blobs_.begin(), blobs_.end(), h,
                             [](const Blob& b, Handle x) { return b.handle < x; });
  return it != blobs_.end() && it->handle == h ? it : blobs_.end();
}

const CompressedStack::Blob& CompressedStack::blob(Handle h) const {
  auto it = find(h);
  EBB_CHECK_MSG(it != blobs_.end() && !it->dead, "compressed stack handle is not live");
  return *it;
}

void CompressedStack::shrink_top(Handle h, uint64_t n_used) {
  std::lock_guard lock(mu_);
  EBB_CHECK_MSG(!blobs_.empty() && blobs_.back().handle == h, "shrink_top needs the top blob");
  Blob& b = blobs_.back();
  EBB_CHECK(n_used > 0 && n_used <= b.size);
  segment(b.segment).end = b.offset + align_up(n_used, kAlign);
  bytes_used_ -= b.size - n_used;
  b.size = n_used;
}

const void* CompressedStack::data(Handle h) const {
  std::lock_guard lock(mu_);
  const Blob& b = blob(h);
  return segs_[b.segment - first_seg_].buf.as<uint8_t>() + b.offset;
}

uint64_t CompressedStack::size(Handle h) const {
  std::lock_guard lock(mu_);
  return blob(h).size;
}

bool CompressedStack::contains(Handle h) const {
  std::lock_guard lock(mu_);
  auto it = find(h);
  return it != blobs_.end() && !it->dead;
}

CompressedStack::Handle CompressedStack::top() const {
  std::lock_guard lock(mu_);
  EBB_CHECK_MSG(!blobs_.empty(), "top() of an empty compressed stack");
  return blobs_.back().handle;
}

CompressedStack::Handle CompressedStack::bottom() const {
  std::lock_guard lock(mu_);
  EBB_CHECK_MSG(!blobs_.empty(), "bottom() of an empty compressed stack");
  return blobs_.front().handle;
}

bool CompressedStack::empty() const {
  std::lock_guard lock(mu_);
  return blobs_.empty();
}

size_t CompressedStack::count() const {
  std::lock_guard lock(mu_);
  return live_;
}

void CompressedStack::release_blob_locked(const Blob& b, bool from_top) {
  if (!b.dead) {
    --live_;
    bytes_used_ -= b.size;
  }
  Segment& seg = segment(b.segment);
  EBB_CHECK(seg.live > 0);
  --seg.live;
  if (from_top) seg.end = b.offset;  // the top blob is the last one in the last segment
  if (seg.live > 0) return;
  bytes_reserved_ -= seg.buf.size();
  if (from_top) {
    EBB_CHECK(b.segment == first_seg_ + segs_.size() - 1);
    segs_.pop_back();
  } else {
    EBB_CHECK(b.segment == first_seg_);
    segs_.pop_front();
    ++first_seg_;
  }
}

void CompressedStack::remove_top_locked() {
  do {
    release_blob_locked(blobs_.back(), true);
    blobs_.pop_back();
  } while (!blobs_.empty() && blobs_.back().dead);
}

void CompressedStack::remove_bottom_locked() {
  do {
    release_blob_locked(blobs_.front(), false);
    blobs_.pop_front();
  } while (!blobs_.empty() && blobs_.front().dead);
}

void CompressedStack::pop_top() {
  std::lock_guard lock(mu_);
  EBB_CHECK_MSG(!blobs_.empty(), "pop_top() of an empty compressed stack");
  remove_top_locked();
}

void CompressedStack::pop_bottom() {
  std::lock_guard lock(mu_);
  EBB_CHECK_MSG(!blobs_.empty(), "pop_bottom() of an empty compressed stack");
  remove_bottom_locked();
}

void CompressedStack::erase(Handle h) {
  std::lock_guard lock(mu_);
  auto it = find(h);
  EBB_CHECK_MSG(it != blobs_.end() && !it->dead, "erase of a compressed stack handle that is not live");
  if (it == blobs_.end() - 1) {
    remove_top_locked();
  } else if (it == blobs_.begin()) {
    remove_bottom_locked();
  } else {
    Blob& b = blobs_[static_cast<size_t>(it - blobs_.begin())];
    b.dead = true;
    --live_;
    bytes_used_ -= b.size;
  }
}

uint64_t CompressedStack::bytes_used() const {
  std::lock_guard lock(mu_);
  return bytes_used_;
}

uint64_t CompressedStack::bytes_reserved() const {
  std::lock_guard lock(mu_);
  return bytes_reserved_;
}

size_t CompressedStack::segments() const {
  std::lock_guard lock(mu_);
  return segs_.size();
}

void CompressedStack::set_segment_bytes(uint64_t n) {
  std::lock_guard lock(mu_);
  EBB_CHECK(n >= kAlign);
  opts_.segment_bytes = align_up(n, kAlign);
}

uint64_t CompressedStack::segment_bytes() const {
  std::lock_guard lock(mu_);
  return opts_.segment_bytes;
}

}  // namespace ebb
