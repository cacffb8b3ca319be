// Streaming under a device memory limit, overlapped with the step
// (runtime/device_limit.cpp plans it). The layers a limit leaves out are
// read from the GGUF at every step into a ring of windows, each a device
// buffer the size of the largest layer (kept across steps while the engine
// streams) plus the layer's transient host copy. A reader thread fills
// window i % n_windows with the step's i-th streamed layer; the step
// records the layers up to it, submits, waits, and hands the window back.
// With two windows the read of the next streamed layer runs while the
// device computes this one (a step of k streamed layers takes about
// max(reads, compute) instead of their sum); with one, each is read, run and
// waited in turn. A window is refilled only after the submission that read
// it has been waited on (release()).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ebb {

// Test hooks (orders of events and samples of what is held; never clocks).
// `held` is DeviceForward::held() at that moment plus the live host copy.
struct DeviceStreamHooks {
  std::function<void(int layer, uint64_t held)> before_read;  // reader thread: the layer's read begins
  std::function<void(int layer, uint64_t held)> after_read;   // reader thread: in its window (held with the host copy it took)
  std::function<void(int layer, uint64_t held)> after_submit;  // step thread: the submission running the layer
  std::function<void(int layer)> before_wait;  // step thread: about to wait on that submission
};

// One step's reader over `layers` (ascending) through `n_windows` windows.
// read_one(layer, window) reads the layer into the window, throwing
// ebb::Error on failure; the thread then stops, that layer's acquire()
// throws "layer N could not be streamed to the device: ..." and the later
// ones say an earlier layer failed.
class LayerStreamer {
 public:
  LayerStreamer(std::vector<int> layers, int n_windows, std::function<void(int layer, int window)> read_one);
  ~LayerStreamer();  // stops after the read in progress and joins
  LayerStreamer(const LayerStreamer&) = delete;
  LayerStreamer& operator=(const LayerStreamer&) = delete;

  void start();  // the reader begins (idempotent); before it, nothing is read
  bool started() const { return thread_.joinable(); }
  bool ready(int layer) const;  // in its window
  // Blocks until `layer` is in its window and returns the window; throws
  // naming the layer when its read failed.
  int acquire(int layer);
  // The submission that read `layer`'s window is done: the window may be refilled.
  void release(int layer);
  int n_windows() const { return n_windows_; }

 private:
  enum class State : uint8_t { kPending, kReady, kFailed, kDone };
  void run();
  size_t index_of(int layer) const;  // position in layers_ (EBB_CHECK: one of ours)

  std::vector<int> layers_;
  int n_windows_;
  std::function<void(int, int)> read_one_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<State> state_;        // [layers_.size()]
  std::vector<std::string> error_;  // [layers_.size()]
  std::vector<char> window_free_;   // [n_windows]
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ebb
