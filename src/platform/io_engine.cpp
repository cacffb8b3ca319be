// IoEngine: requests are cut into pieces of at most max_request bytes and kept
// in one pending queue; at most queue_depth pieces are in flight. Two backends
// share the bookkeeping:
//  - io_uring: submitters fill the SQ under the mutex; one reaper thread blocks
//    in io_uring_wait_cqe, finishes or resubmits pieces, and refills the SQ;
//  - threads: queue_depth workers take pieces and run pread/pwrite loops.
// Tickets finish out of order; waiters sleep on one condition variable.
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "platform/direct_io.h"
#include "platform/error.h"
#include "platform/thread_name.h"

namespace ebb {

namespace {

struct Piece {
  IoEngine::Ticket ticket = 0;
  int fd = -1;
  uint64_t offset = 0;
  uint8_t* buf = nullptr;
  uint64_t len = 0;
  uint64_t done = 0;  // bytes transferred so far
  bool write = false;
};

struct TicketState {
  uint64_t remaining = 0;  // pieces not yet finished
  std::string path;        // names the file in errors; may be empty
  std::string error;       // first failure
};

// fail_reads_for_test(): the path whose next `left` read batches fail.
struct InjectedFaults {
  std::mutex mu;
  std::string path;
  int left = 0;
};
InjectedFaults& injected() {
  static InjectedFaults f;
  return f;
}

// True (and one fault used) when a read batch for `path` is to fail.
bool take_injected_fault(std::span<const IoRequest> reqs, const std::string& path) {
  InjectedFaults& f = injected();
  std::lock_guard lock(f.mu);
  if (f.left <= 0 || path.empty() || path != f.path) return false;
  for (const IoRequest& r : reqs)
    if (r.write) return false;
  --f.left;
  return true;
}

// A read that stopped at an unaligned position hit end-of-file: with O_DIRECT
// only the last, partial block of a file can end a read off the alignment.
bool at_eof(const Piece& p) { return !p.write && (p.offset + p.done) % kDirectAlign != 0; }

}  // namespace

struct IoEngine::Impl {
  IoOptions opts;
  std::mutex mu;
  std::condition_variable cv_done;  // a ticket finished
  std::condition_variable cv_work;  // threads backend: a piece is pending, or stop
  std::unordered_map<Ticket, TicketState> tickets;
  Ticket next_ticket = 1;
  std::deque<Piece*> pending;  // owned; not yet in flight
  int in_flight = 0;
  bool stopping = false;

  bool uring = false;
  io_uring ring{};
  std::thread reaper;
  std::vector<std::thread> workers;

  ~Impl() {
    for (Piece* p : pending) delete p;
  }

  // Finishes a piece (err = 0 on success) and feeds the queue. Holds mu.
  void finish_locked(Piece* p, int err) {
    auto it = tickets.find(p->ticket);
    EBB_CHECK(it != tickets.end() && it->second.remaining > 0);
    TicketState& t = it->second;
    if (err != 0 && t.error.empty()) {
      char buf[256];
      t.error = (t.path.empty() ? "fd " + std::to_string(p->fd) : t.path) + ": " +
                (p->write ? "write" : "read") + " of " + std::to_string(p->len) + " bytes at offset " +
                std::to_string(p->offset) + " failed: " + strerror_r(err, buf, sizeof(buf));
    }
    if (!err && !p->write && p->done < p->len) std::memset(p->buf + p->done, 0, p->len - p->done);
    delete p;
    --in_flight;
    if (--t.remaining == 0 || (in_flight == 0 && pending.empty())) cv_done.notify_all();
    pump_locked();
  }

  // Moves pending pieces into flight up to queue_depth. Holds mu.
  void pump_locked() {
    if (!uring) {
      if (!pending.empty()) cv_work.notify_all();
      return;
    }
    int queued = 0;
    while (in_flight < opts.queue_depth && !pending.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      EBB_CHECK(sqe != nullptr);  // the ring has queue_depth entries and no more are in flight
      Piece* p = pending.front();
      pending.pop_front();
      const auto n = static_cast<unsigned>(p->len - p->done);
      if (p->write) {
        io_uring_prep_write(sqe, p->fd, p->buf + p->done, n, p->offset + p->done);
      } else {
        io_uring_prep_read(sqe, p->fd, p->buf + p->done, n, p->offset + p->done);
      }
      io_uring_sqe_set_data64(sqe, reinterpret_cast<uint64_t>(p));
      ++in_flight;
      ++queued;
    }
    if (queued > 0) submit_ring_locked();
  }

  void submit_ring_locked() {
    for (;;) {
      const int r = io_uring_submit(&ring);
      if (r >= 0) return;
      if (r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        char buf[256];
        check_failed("io_uring_submit", __FILE__, __LINE__, strerror_r(-r, buf, sizeof(buf)));
      }
    }
  }

  // Puts a partly done piece back at the head of the queue. Holds mu.
  void requeue_locked(Piece* p) {
    --in_flight;
    pending.push_front(p);
    pump_locked();
  }

  void reap_loop() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring, &cqe);
      if (r == -EINTR || r == -EAGAIN) continue;
      if (r < 0) {
        char buf[256];
        check_failed("io_uring_wait_cqe", __FILE__, __LINE__, strerror_r(-r, buf, sizeof(buf)));
      }
      const uint64_t data = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      if (data == 0) return;  // the stop NOP
      auto* p = reinterpret_cast<Piece*>(data);
      std::lock_guard lock(mu);
      if (res == -EINTR || res == -EAGAIN) {
        requeue_locked(p);
      } else if (res < 0) {
        finish_locked(p, -res);
      } else if (res == 0) {
        finish_locked(p, p->write ? EIO : 0);  // a read of 0 bytes is end-of-file
      } else {
        p->done += static_cast<uint64_t>(res);
        if (p->done == p->len || at_eof(*p)) {
          finish_locked(p, 0);
        } else {
          requeue_locked(p);  // short transfer: the rest goes again
        }
      }
    }
  }

  // Threads backend: runs one piece to completion; returns 0 or an errno.
  static int transfer(Piece& p) {
    while (p.done < p.len) {
      const auto off = static_cast<off_t>(p.offset + p.done);
      const ssize_t r = p.write ? ::pwrite(p.fd, p.buf + p.done, p.len - p.done, off)
                                : ::pread(p.fd, p.buf + p.done, p.len - p.done, off);
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return errno;
      }
      if (r == 0) return p.write ? EIO : 0;
      p.done += static_cast<uint64_t>(r);
      if (at_eof(p)) return 0;
    }
    return 0;
  }

  void work_loop() {
    std::unique_lock lock(mu);
    for (;;) {
      cv_work.wait(lock, [&] { return stopping || !pending.empty(); });
      if (pending.empty()) return;  // stopping and drained
      Piece* p = pending.front();
      pending.pop_front();
      ++in_flight;
      lock.unlock();
      const int err = transfer(*p);
      lock.lock();
      finish_locked(p, err);
    }
  }
};

IoEngine::IoEngine(IoOptions opts) : impl_(std::make_unique<Impl>()) {
  EBB_CHECK(opts.queue_depth >= 1 && opts.queue_depth <= 4096);
  EBB_CHECK(opts.max_request >= kDirectAlign && opts.max_request % kDirectAlign == 0 &&
            opts.max_request <= (1ull << 30));
  impl_->opts = opts;
  if (opts.use_uring && io_uring_queue_init(static_cast<unsigned>(opts.queue_depth), &impl_->ring, 0) == 0) {
    impl_->uring = true;
    impl_->reaper = std::thread([this] {
      set_current_thread_name("ebb-io-reap");
      impl_->reap_loop();
    });
  } else {
    impl_->opts.use_uring = false;
    for (int i = 0; i < opts.queue_depth; ++i) {
      impl_->workers.emplace_back([this] {
        set_current_thread_name("ebb-io");
        impl_->work_loop();
      });
    }
  }
}

IoEngine::~IoEngine() {
  Impl& m = *impl_;
  {
    std::unique_lock lock(m.mu);
    m.cv_done.wait(lock, [&] { return m.in_flight == 0 && m.pending.empty(); });
    m.stopping = true;
    if (m.uring) {
      io_uring_sqe* sqe = io_uring_get_sqe(&m.ring);
      EBB_CHECK(sqe != nullptr);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, 0);
      m.submit_ring_locked();
    }
    m.cv_work.notify_all();
  }
  if (m.uring) {
    m.reaper.join();
    io_uring_queue_exit(&m.ring);
  }
  for (auto& w : m.workers) w.join();
}

IoEngine::Ticket IoEngine::submit(std::span<const IoRequest> reqs) { return submit(reqs, std::string()); }

IoEngine::Ticket IoEngine::submit(std::span<const IoRequest> reqs, std::string path) {
  const uint64_t piece = impl_->opts.max_request;
  uint64_t n_pieces = 0;
  for (const IoRequest& r : reqs) {
    EBB_CHECK_MSG(r.fd >= 0 && r.buf != nullptr, "IoRequest needs an open fd and a buffer");
    EBB_CHECK_MSG(r.offset % kDirectAlign == 0 && r.len % kDirectAlign == 0 &&
                      reinterpret_cast<uintptr_t>(r.buf) % kDirectAlign == 0,
                  "direct I/O offsets, lengths and buffers must be multiples of kDirectAlign");
    n_pieces += (r.len + piece - 1) / piece;
  }
  const bool fail = n_pieces > 0 && take_injected_fault(reqs, path);
  std::lock_guard lock(impl_->mu);
  EBB_CHECK(!impl_->stopping);
  const Ticket t = impl_->next_ticket++;
  if (fail) {  // done at once, nothing read, the error kept for wait()
    impl_->tickets.emplace(t, TicketState{0, path, path + ": read failed: injected read fault"});
    return t;
  }
  if (n_pieces == 0) return t;  // nothing to do: unknown tickets read as done
  impl_->tickets.emplace(t, TicketState{n_pieces, std::move(path), {}});
  for (const IoRequest& r : reqs) {
    for (uint64_t off = 0; off < r.len; off += piece) {
      impl_->pending.push_back(new Piece{t, r.fd, r.offset + off, static_cast<uint8_t*>(r.buf) + off,
                                         std::min(piece, r.len - off), 0, r.write});
    }
  }
  impl_->pump_locked();
  return t;
}

void IoEngine::wait(Ticket t) {
  std::unique_lock lock(impl_->mu);
  auto& tickets = impl_->tickets;
  impl_->cv_done.wait(lock, [&] {
    auto it = tickets.find(t);
    return it == tickets.end() || it->second.remaining == 0;
  });
  auto it = tickets.find(t);
  if (it == tickets.end()) return;
  std::string error = std::move(it->second.error);
  tickets.erase(it);
  if (!error.empty()) throw Error(error);
}

bool IoEngine::done(Ticket t) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->tickets.find(t);
  if (it == impl_->tickets.end()) return true;
  if (it->second.remaining > 0) return false;
  if (it->second.error.empty()) impl_->tickets.erase(it);  // keep errors for wait()
  return true;
}

void IoEngine::run(std::span<const IoRequest> reqs) { wait(submit(reqs)); }
void IoEngine::run(std::span<const IoRequest> reqs, std::string path) { wait(submit(reqs, std::move(path))); }

const IoOptions& IoEngine::options() const { return impl_->opts; }
bool IoEngine::uses_uring() const { return impl_->uring; }

void fail_reads_for_test(const std::string& path, int n) {
  InjectedFaults& f = injected();
  std::lock_guard lock(f.mu);
  f.path = path;
  f.left = n;
}

}  // namespace ebb
