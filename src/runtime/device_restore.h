// Restoration of a device's dropped weight layers overlapped with the step
// that needs them (mzCache §4–5: the GPU prefills the layers it holds while
// the CPU reads the others back). A restore thread reads each dropped layer
// from the GGUF and uploads it into a fresh device buffer (on a
// unified-memory device a write into mapped memory; elsewhere the backend's
// staging copy), lowest layer first, opening that layer's latch. The step
// records the layers it can, submits them when the next one is not back
// yet, and waits on that layer's latch and on the stream's fence before it
// records on: the device computes layer l while layer l+1 is still read.
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
  std::function<void(int layer)> before_read;   // restore thread, before layer's read starts
  std::function<void(int layer)> after_submit;  // step thread, after the ops up to layer were submitted
};

// One step's restore thread over `layers` (ascending). `restore_one(l)`
// reads and uploads layer l, throwing ebb::Error on failure (the layer
// stays dropped). After a layer fails the thread stops: that layer's wait()
// throws its error, the later layers' wait() say an earlier layer failed.
class LayerRestorer {
 public:
  LayerRestorer(std::vector<int> layers, std::function<void(int)> restore_one, const DeviceRestoreHooks* hooks);
  ~LayerRestorer();  // stops after the layer in progress and joins
  LayerRestorer(const LayerRestorer&) = delete;
  LayerRestorer& operator=(const LayerRestorer&) = delete;

  bool pending(int layer) const;  // one of this restorer's layers
  bool ready(int layer) const;    // back on the device (false while pending or failed)
  // Blocks until `layer` is back; throws ebb::Error naming it if its read failed.
  void wait(int layer);
  int64_t restored() const;  // layers back so far

 private:
  enum class State : uint8_t { kNone, kPending, kReady, kFailed };
  void run();

  std::vector<int> layers_;
  std::function<void(int)> restore_one_;
  const DeviceRestoreHooks* hooks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<State> state_;         // [max layer + 1]
  std::vector<std::string> error_;   // [max layer + 1]
  int64_t restored_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ebb
