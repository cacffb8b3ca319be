#include "runtime/device_restore.h"

#include <algorithm>
#include <exception>

#include "platform/error.h"
#include "platform/thread_name.h"

namespace ebb {

LayerRestorer::LayerRestorer(std::vector<int> layers, std::function<void(int)> restore_one,
                             const DeviceRestoreHooks* hooks, std::function<void(size_t)> settled)
    : layers_(std::move(layers)), restore_one_(std::move(restore_one)), hooks_(hooks), settled_(std::move(settled)) {
  EBB_CHECK(std::is_sorted(layers_.begin(), layers_.end()));
  const size_t n = layers_.empty() ? 0 : static_cast<size_t>(layers_.back()) + 1;
  state_.assign(n, State::kNone);
  error_.resize(n);
  for (int l : layers_) {
    EBB_CHECK(l >= 0);
    state_[static_cast<size_t>(l)] = State::kPending;
  }
  if (!layers_.empty()) thread_ = std::thread([this] { run(); });
}

LayerRestorer::~LayerRestorer() { finish(); }

void LayerRestorer::finish() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void LayerRestorer::run() {
  set_current_thread_name("ebb-dev-restore");
  // Raising a timeline must not throw out of the thread (nothing to do then
  // but let the step's wait find out).
  auto report = [&](size_t k) {
    if (!settled_) return;
    try {
      settled_(k);
    } catch (...) {
    }
  };
  size_t done = 0;
  for (int l : layers_) {
    {
      std::lock_guard lock(mu_);
      if (stop_) break;
    }
    std::string err;
    try {
      if (hooks_ && hooks_->before_read) hooks_->before_read(l);
      restore_one_(l);
    } catch (const std::exception& e) {
      err = e.what();
    }
    std::unique_lock lock(mu_);
    if (err.empty()) {
      state_[static_cast<size_t>(l)] = State::kReady;
      ++restored_;
    } else {
      // This layer and the ones after it stay dropped; their waits say why.
      state_[static_cast<size_t>(l)] = State::kFailed;
      error_[static_cast<size_t>(l)] = "layer " + std::to_string(l) + " could not be restored to the device: " + err;
      for (int m : layers_)
        if (m > l) {
          state_[static_cast<size_t>(m)] = State::kFailed;
          error_[static_cast<size_t>(m)] = "layer " + std::to_string(m) + " was not restored: layer " +
                                           std::to_string(l) + " failed before it (" + err + ")";
        }
      stop_ = true;
    }
    ++done;
    cv_.notify_all();
    if (stop_) break;
    lock.unlock();
    report(done);
  }
  // Stopped early (the step gave up): whatever is still pending is failed,
  // so no wait() blocks forever.
  {
    std::lock_guard lock(mu_);
    for (int m : layers_)
      if (state_[static_cast<size_t>(m)] == State::kPending) {
        state_[static_cast<size_t>(m)] = State::kFailed;
        error_[static_cast<size_t>(m)] = "layer " + std::to_string(m) + " was not restored: the step stopped first";
      }
    cv_.notify_all();
  }
  report(layers_.size());
}

bool LayerRestorer::pending(int layer) const {
  std::lock_guard lock(mu_);
  return layer >= 0 && static_cast<size_t>(layer) < state_.size() && state_[static_cast<size_t>(layer)] != State::kNone;
}

bool LayerRestorer::ready(int layer) const {
  std::lock_guard lock(mu_);
  return layer >= 0 && static_cast<size_t>(layer) < state_.size() && state_[static_cast<size_t>(layer)] == State::kReady;
}

void LayerRestorer::wait(int layer) {
  std::unique_lock lock(mu_);
  if (layer < 0 || static_cast<size_t>(layer) >= state_.size() || state_[static_cast<size_t>(layer)] == State::kNone)
    return;  // not one of ours: resident already
  const size_t i = static_cast<size_t>(layer);
  cv_.wait(lock, [&] { return state_[i] != State::kPending; });
  if (state_[i] == State::kFailed) throw Error(error_[i]);
}

int64_t LayerRestorer::restored() const {
  std::lock_guard lock(mu_);
  return restored_;
}

}  // namespace ebb
