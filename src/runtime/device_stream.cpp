#include "runtime/device_stream.h"

#include <algorithm>
#include <exception>

#include "platform/error.h"
#include "platform/thread_name.h"

namespace ebb {

LayerStreamer::LayerStreamer(std::vector<int> layers, int n_windows, std::function<void(int, int)> read_one)
    : layers_(std::move(layers)), n_windows_(n_windows), read_one_(std::move(read_one)) {
  EBB_CHECK(std::is_sorted(layers_.begin(), layers_.end()));
  EBB_CHECK(n_windows_ >= 1);
  state_.assign(layers_.size(), State::kPending);
  error_.resize(layers_.size());
  window_free_.assign(static_cast<size_t>(n_windows_), 1);
}

LayerStreamer::~LayerStreamer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LayerStreamer::start() {
  if (!thread_.joinable() && !layers_.empty()) thread_ = std::thread([this] { run(); });
}

size_t LayerStreamer::index_of(int layer) const {
  const auto it = std::lower_bound(layers_.begin(), layers_.end(), layer);
  EBB_CHECK_MSG(it != layers_.end() && *it == layer, "a layer this step does not stream");
  return static_cast<size_t>(it - layers_.begin());
}

void LayerStreamer::run() {
  set_current_thread_name("ebb-dev-stream");
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int l = layers_[i];
    const size_t w = i % static_cast<size_t>(n_windows_);
    {
      // The window's last layer must have been run and waited on first.
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || window_free_[w]; });
      if (stop_) break;
      window_free_[w] = 0;
    }
    std::string err;
    try {
      read_one_(l, static_cast<int>(w));
    } catch (const std::exception& e) {
      err = e.what();
    }
    std::lock_guard lock(mu_);
    if (err.empty()) {
      state_[i] = State::kReady;
    } else {
      state_[i] = State::kFailed;
      error_[i] = "layer " + std::to_string(l) + " could not be streamed to the device: " + err;
      for (size_t m = i + 1; m < layers_.size(); ++m) {
        state_[m] = State::kFailed;
        error_[m] = "layer " + std::to_string(layers_[m]) + " was not streamed: layer " + std::to_string(l) +
                    " failed before it (" + err + ")";
      }
      stop_ = true;
    }
    cv_.notify_all();
    if (stop_) break;
  }
  // Stopped early (the step gave up): nothing waits forever.
  std::lock_guard lock(mu_);
  for (size_t m = 0; m < layers_.size(); ++m)
    if (state_[m] == State::kPending) {
      state_[m] = State::kFailed;
      error_[m] = "layer " + std::to_string(layers_[m]) + " was not streamed: the step stopped first";
    }
  cv_.notify_all();
}

bool LayerStreamer::ready(int layer) const {
  const size_t i = index_of(layer);
  std::lock_guard lock(mu_);
  return state_[i] == State::kReady;
}

int LayerStreamer::acquire(int layer) {
  const size_t i = index_of(layer);
  EBB_CHECK_MSG(thread_.joinable(), "acquire() before start()");
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return state_[i] != State::kPending; });
  if (state_[i] == State::kFailed) throw Error(error_[i]);
  EBB_CHECK(state_[i] == State::kReady);
  return static_cast<int>(i % static_cast<size_t>(n_windows_));
}

void LayerStreamer::release(int layer) {
  const size_t i = index_of(layer);
  {
    std::lock_guard lock(mu_);
    EBB_CHECK(state_[i] == State::kReady);
    state_[i] = State::kDone;
    window_free_[i % static_cast<size_t>(n_windows_)] = 1;
  }
  cv_.notify_all();
}

}  // namespace ebb
