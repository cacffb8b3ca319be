// Restoration of a device's dropped weight layers overlapped with the step
// that needs them (mzCache §4–5: the GPU prefills the layers it holds while
// the CPU reads the others back). A restore thread reads each dropped layer
// from the GGUF, lowest layer first: on a unified-memory device straight
// into the layer's mapped device buffer where the file's bytes are the
// device's (DeviceForward::restore_layer), else through a host copy and the
// backend's upload. Each layer it settles (back, or failed) it reports in
// order, so the step can go on:
//   - with timelines (BackendStream::supports_timeline()): the step has
//     allocated the dropped layers' buffers, records the whole step and
//     submits it in segments, the one that begins with dropped layer l
//     waiting on the device for the timeline to reach l's value, which the
//     report raises from the host. The host waits once, at the end.
//   - without: the step submits what it recorded when the next layer is not
//     back yet, and waits on that layer's latch and on the stream's fence.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ebb {

// Test hooks (counters, gates; never clocks). Called on the thread named.
struct DeviceRestoreHooks {
  // restore thread, before layer's read starts; an exception it throws fails
  // that layer's read (tests inject read errors so)
  std::function<void(int layer)> before_read;
  std::function<void(int layer)> after_submit;  // step thread, after the ops up to layer were submitted
  bool staged_only = false;  // every layer restored through a host copy and an upload (never the direct path)
  bool host_waits = false;   // the host-wait path even where the stream has timelines
};

// What the last step's (or restore()'s) restoration did, for tests and
// `ebb bench ttft` (counters, never clocks).
struct DeviceRestoreStats {
  bool timeline = false;      // the step's waits were timeline waits on the device
  int64_t layers = 0;         // dropped layers the step (or restore()) brought back or tried to
  int64_t submissions = 0;    // the step's submissions (segments and the final one)
  int64_t host_waits = 0;     // times the step thread blocked on the device or the restorer
  int64_t direct_layers = 0;  // read from the file straight into mapped device buffers
  int64_t staged_layers = 0;  // read into a host copy, then uploaded
};

// One step's restore thread over `layers` (ascending). `restore_one(l)`
// reads and uploads layer l, throwing ebb::Error on failure (the layer
// stays dropped). After a layer fails the thread stops: that layer's wait()
// throws its error, the later layers' wait() say an earlier layer failed.
// `settled(k)` (may be empty) is called on the restore thread each time the
// first k layers are settled (back or failed), k rising, and always with
// k = layers.size() before the thread ends (a failure or stop settles the
// rest at once): a timeline raised there never leaves the device waiting.
class LayerRestorer {
 public:
  LayerRestorer(std::vector<int> layers, std::function<void(int)> restore_one, const DeviceRestoreHooks* hooks,
                std::function<void(size_t)> settled = {});
  ~LayerRestorer();  // stops after the layer in progress and joins
  LayerRestorer(const LayerRestorer&) = delete;
  LayerRestorer& operator=(const LayerRestorer&) = delete;

  bool pending(int layer) const;  // one of this restorer's layers
  bool ready(int layer) const;    // back on the device (false while pending or failed)
  // Blocks until `layer` is back; throws ebb::Error naming it if its read failed.
  void wait(int layer);
  int64_t restored() const;  // layers back so far
  // Stops after the layer in progress and joins the thread: every layer is
  // settled after it (the ones not read failed). Idempotent.
  void finish();

 private:
  enum class State : uint8_t { kNone, kPending, kReady, kFailed };
  void run();

  std::vector<int> layers_;
  std::function<void(int)> restore_one_;
  const DeviceRestoreHooks* hooks_;
  std::function<void(size_t)> settled_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<State> state_;         // [max layer + 1]
  std::vector<std::string> error_;   // [max layer + 1]
  int64_t restored_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ebb
