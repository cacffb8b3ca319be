#include "memory/device_profile.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>

#include "kernels/kv_codec.h"
#include "platform/allocator.h"
#include "platform/direct_io.h"
#include "platform/error.h"
#include "platform/fp16.h"
#include "platform/timer.h"

namespace ebb {

namespace fs = std::filesystem;

// ---- derived times ----------------------------------------------------------

const CodecPoint* DeviceProfile::find_codec(std::string_view codec) const {
  for (const CodecPoint& c : codecs) {
    if (c.codec == codec) return &c;
  }
  return nullptr;
}

UnitTimes DeviceProfile::unit_times(uint64_t kv_chunk_bytes, uint64_t weight_layer_bytes,
                                    std::string_view codec) const {
  const CodecPoint* c = find_codec(codec);
  if (c == nullptr) {
    std::string have;
    for (const CodecPoint& p : codecs) have += (have.empty() ? "" : ", ") + p.codec;
    throw Error("device profile has no figures for KV codec '" + std::string(codec) + "' (it has: " +
                (have.empty() ? "none" : have) + ")");
  }
  if (!(read_gbps > 0) || !(c->decompress_gbps > 0)) {
    throw Error("device profile: read (" + std::to_string(read_gbps) + " GB/s) and " + c->codec +
                " decompression (" + std::to_string(c->decompress_gbps) + " GB/s) throughputs must be positive");
  }
  const double chunk = static_cast<double>(kv_chunk_bytes);
  UnitTimes t;
  t.t_d = chunk / (c->decompress_gbps * 1e9);
  if (alloc_gbps > 0) t.t_d += chunk / (alloc_gbps * 1e9);
  t.t_rkv = chunk / (read_gbps * 1e9);
  t.t_rw = static_cast<double>(weight_layer_bytes) / (read_gbps * 1e9);
  return t;
}

// ---- JSON -------------------------------------------------------------------

nlohmann::json DeviceProfile::to_json() const {
  nlohmann::json j;
  j["version"] = 1;
  j["device"] = device;
  j["direct_io"] = direct_io;
  j["best_request_bytes"] = best_request_bytes;
  j["best_queue_depth"] = best_queue_depth;
  j["read_gbps"] = read_gbps;
  j["write_gbps"] = write_gbps;
  j["alloc_gbps"] = alloc_gbps;
  j["reads"] = nlohmann::json::array();
  for (const ReadPoint& r : reads) {
    j["reads"].push_back({{"request_bytes", r.request_bytes},
                          {"queue_depth", r.queue_depth},
                          {"gbps", r.gbps},
                          {"confirmed", r.confirmed}});
  }
  j["codecs"] = nlohmann::json::array();
  for (const CodecPoint& c : codecs) {
    j["codecs"].push_back({{"codec", c.codec},
                           {"compress_gbps", c.compress_gbps},
                           {"decompress_gbps", c.decompress_gbps},
                           {"ratio", c.ratio}});
  }
  return j;
}

namespace {

template <class T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw Error("device profile: missing field '" + where + key + "'");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw Error("device profile: field '" + where + key + "' has the wrong type (" + e.what() + ")");
  }
}

}  // namespace

DeviceProfile DeviceProfile::from_json(const nlohmann::json& j) {
  DeviceProfile p;
  p.device = field<std::string>(j, "device", "");
  p.direct_io = field<bool>(j, "direct_io", "");
  p.best_request_bytes = field<uint64_t>(j, "best_request_bytes", "");
  p.best_queue_depth = field<int>(j, "best_queue_depth", "");
  p.read_gbps = field<double>(j, "read_gbps", "");
  p.write_gbps = field<double>(j, "write_gbps", "");
  p.alloc_gbps = field<double>(j, "alloc_gbps", "");
  const auto reads = field<nlohmann::json>(j, "reads", "");
  const auto codecs = field<nlohmann::json>(j, "codecs", "");
  if (!reads.is_array() || !codecs.is_array()) throw Error("device profile: 'reads' and 'codecs' must be arrays");
  for (size_t i = 0; i < reads.size(); ++i) {
    const std::string w = "reads[" + std::to_string(i) + "].";
    p.reads.push_back({field<uint64_t>(reads[i], "request_bytes", w), field<int>(reads[i], "queue_depth", w),
                       field<double>(reads[i], "gbps", w),
                       // Absent in profiles saved before points were confirmed.
                       reads[i].is_object() && reads[i].value("confirmed", false)});
  }
  for (size_t i = 0; i < codecs.size(); ++i) {
    const std::string w = "codecs[" + std::to_string(i) + "].";
    p.codecs.push_back({field<std::string>(codecs[i], "codec", w), field<double>(codecs[i], "compress_gbps", w),
                        field<double>(codecs[i], "decompress_gbps", w), field<double>(codecs[i], "ratio", w)});
  }
  return p;
}

void DeviceProfile::save(const std::string& path) const {
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw Error("cannot write device profile '" + tmp + "': " + std::strerror(errno));
    out << to_json().dump(2) << '\n';
    if (!out.flush()) throw Error("cannot write device profile '" + tmp + "': " + std::strerror(errno));
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp);
    throw Error("cannot move device profile into place at '" + path + "': " + ec.message());
  }
}

DeviceProfile DeviceProfile::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read device profile '" + path + "': " + std::strerror(errno));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error("device profile '" + path + "' is not valid JSON: " + e.what());
  }
  try {
    return from_json(j);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

DeviceProfile DeviceProfile::defaults() {
  DeviceProfile p;
  p.device = "defaults (not measured; run `ebb profile`)";
  p.best_request_bytes = 4ull << 20;
  p.best_queue_depth = 8;
  p.read_gbps = 2.0;
  p.write_gbps = 1.0;
  p.alloc_gbps = 5.0;
  p.codecs = {{"int8", 1.5, 3.0, 0.52}, {"int4", 1.0, 3.0, 0.29}};
  return p;
}

namespace {

std::string cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') return std::string(x) + "/ebb";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return std::string(h) + "/.cache/ebb";
  return "/tmp/ebb";
}

}  // namespace

std::string default_profile_path() { return cache_dir() + "/profile.json"; }
std::string default_profile_dir() { return cache_dir() + "/swap"; }

DeviceProfile load_profile_or_defaults(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return DeviceProfile::defaults();
  return DeviceProfile::load(path);
}

// ---- measurement -------------------------------------------------------------

namespace {

// "DIR on nvme0n1 (Samsung SSD ...)" when sysfs knows the block device.
std::string describe_device(const std::string& dir) {
  std::string s = dir;
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return s;
  const std::string sys = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  std::error_code ec;
  const fs::path real = fs::canonical(sys, ec);
  if (ec) return s;
  s += " on " + real.filename().string();
  for (const fs::path& m : {real / "device" / "model", real.parent_path() / "device" / "model"}) {
    std::ifstream in(m);
    std::string model;
    if (in && std::getline(in, model)) {
      model.erase(model.find_last_not_of(" \t\n") + 1);
      if (!model.empty()) s += " (" + model + ")";
      break;
    }
  }
  return s;
}

// Removes the test file however measurement ends.
struct FileRemover {
  std::string path;
  ~FileRemover() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

// Keeps qd requests of `req` bytes in flight at random 4 KiB-aligned offsets
// for `seconds`; returns GB/s. bufs: qd * req bytes, 4 KiB aligned.
double timed_random_io(const DirectFile& f, uint64_t file_bytes, uint64_t req, int qd, double seconds, bool write,
                       uint8_t* bufs, std::mt19937_64& rng) {
  IoEngine io(IoOptions{qd, req, true});
  std::uniform_int_distribution<uint64_t> pick(0, (file_bytes - req) / kDirectAlign);
  auto submit = [&](int slot) {
    const IoRequest r{f.fd(), pick(rng) * kDirectAlign, bufs + static_cast<uint64_t>(slot) * req, req, write};
    return io.submit(std::span<const IoRequest>(&r, 1), f.path());
  };
  if (!write) f.drop_cache(0, file_bytes);
  std::vector<IoEngine::Ticket> tickets(static_cast<size_t>(qd));
  const Stopwatch sw;
  for (int i = 0; i < qd; ++i) tickets[i] = submit(i);
  uint64_t bytes = 0;
  for (int slot = 0; sw.seconds() < seconds; slot = (slot + 1) % qd) {
    io.wait(tickets[slot]);
    bytes += req;
    tickets[slot] = submit(slot);
  }
  for (int i = 0; i < qd; ++i) {
    io.wait(tickets[i]);
    bytes += req;
  }
  return static_cast<double>(bytes) / sw.seconds() / 1e9;
}

// Raw bytes per second of `fn` run over the chunks repeatedly for `seconds`
// (at least twice, after one warm-up).
template <class Fn>
double timed_gbps(double seconds, uint64_t bytes_per_run, Fn fn) {
  fn();
  const Stopwatch sw;
  int runs = 0;
  while (runs < 2 || sw.seconds() < seconds) {
    fn();
    ++runs;
  }
  return static_cast<double>(bytes_per_run) * runs / sw.seconds() / 1e9;
}

CodecPoint measure_codec(KvCodecId id, Isa isa, double seconds, int n_chunks, Allocator& alloc) {
  // A realistic chunk: 256 tokens of 8 KV heads x 128, F16, normal values
  // with per-channel scales (KV channels differ in magnitude).
  const KvChunkShape shape{256, 256, 1024, DType::kF16};
  const uint64_t raw = 2ull * shape.chunk_tokens * shape.row_dim * 2;
  const KvCodec& codec = kv_codec(id, isa);
  const uint64_t max_blob = codec.max_compressed_bytes(shape);
  Buffer src = alloc.allocate(raw * n_chunks, MemCategory::kScratch);   // [n_chunks][2][256][1024] f16
  Buffer blobs = alloc.allocate(max_blob * n_chunks, MemCategory::kScratch);
  Buffer dst = alloc.allocate(raw * n_chunks, MemCategory::kScratch);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(std::log(0.25f), std::log(4.0f));
  std::vector<float> scale(static_cast<size_t>(shape.row_dim));
  for (float& s : scale) s = std::exp(log_scale(rng));
  auto* h = src.as<uint16_t>();
  for (uint64_t i = 0; i < raw * n_chunks / 2; ++i) h[i] = fp32_to_fp16(normal(rng) * scale[i % shape.row_dim]);

  std::vector<size_t> sizes(static_cast<size_t>(n_chunks));
  const uint64_t total = raw * n_chunks;
  CodecPoint p;
  p.codec = std::string(codec.name());
  p.compress_gbps = timed_gbps(seconds, total, [&] {
    for (int c = 0; c < n_chunks; ++c) {
      sizes[c] = codec.compress(shape, src.as<uint8_t>() + c * raw, blobs.as<uint8_t>() + c * max_blob);
    }
  });
  p.decompress_gbps = timed_gbps(seconds, total, [&] {
    for (int c = 0; c < n_chunks; ++c) {
      codec.decompress(shape, blobs.as<uint8_t>() + c * max_blob, sizes[c], dst.as<uint8_t>() + c * raw);
    }
  });
  uint64_t packed = 0;
  for (size_t s : sizes) packed += s;
  p.ratio = static_cast<double>(packed) / static_cast<double>(total);
  return p;
}

double measure_alloc(Allocator& alloc, uint64_t block, double seconds) {
  return timed_gbps(seconds, block, [&] {
    Buffer b = alloc.allocate(block, MemCategory::kOther, kDirectAlign);
    std::memset(b.data(), 0x5a, block);
  });
}

}  // namespace

const ReadPoint& choose_read_point(const std::vector<ReadPoint>& reads) {
  if (reads.empty()) throw Error("profile: no read points to choose from");
  double top = 0;
  for (const ReadPoint& r : reads) top = std::max(top, r.gbps);
  const ReadPoint* best = nullptr;
  auto inflight = [](const ReadPoint& r) { return r.request_bytes * static_cast<uint64_t>(r.queue_depth); };
  for (const ReadPoint& r : reads) {
    if (r.gbps < 0.95 * top) continue;
    if (best == nullptr || inflight(r) < inflight(*best) ||
        (inflight(r) == inflight(*best) && r.request_bytes < best->request_bytes)) {
      best = &r;
    }
  }
  return *best;
}

int confirm_read_points(std::vector<ReadPoint>& reads, double band,
                        const std::function<double(uint64_t, int)>& measure) {
  int measured = 0;
  for (;;) {
    double top = 0;
    for (const ReadPoint& r : reads) top = std::max(top, r.gbps);
    // The fastest unconfirmed point in the band, if any.
    ReadPoint* next = nullptr;
    for (ReadPoint& r : reads) {
      if (r.confirmed || r.gbps < (1.0 - band) * top) continue;
      if (next == nullptr || r.gbps > next->gbps) next = &r;
    }
    if (next == nullptr) return measured;
    next->gbps = std::min(next->gbps, measure(next->request_bytes, next->queue_depth));
    next->confirmed = true;
    ++measured;
  }
}

DeviceProfile measure_device_profile(const ProfileOptions& opts,
                                     const std::function<void(std::string_view)>& progress) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  ProfileOptions o = opts;
  if (o.dir.empty()) o.dir = default_profile_dir();
  if (o.quick) {
    o.file_bytes = std::min<uint64_t>(o.file_bytes, 32ull << 20);
    o.request_sizes = {256ull << 10, 4ull << 20};
    o.queue_depths = {1, 8};
    o.seconds_per_point = std::min(o.seconds_per_point, 0.05);
  }
  o.file_bytes = align_up(o.file_bytes);
  std::erase_if(o.request_sizes, [&](uint64_t r) { return r == 0 || r % kDirectAlign != 0 || r > o.file_bytes; });
  std::erase_if(o.queue_depths, [](int q) { return q < 1; });
  if (o.request_sizes.empty() || o.queue_depths.empty()) {
    throw Error("profile: no usable request size (multiples of 4 KiB up to the " + std::to_string(o.file_bytes) +
                "-byte test file) or queue depth (>= 1)");
  }
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec) throw Error("profile: cannot create directory '" + o.dir + "': " + ec.message());

  DeviceProfile p;
  p.device = describe_device(o.dir);
  Ledger ledger;
  Allocator alloc(&ledger);
  std::mt19937_64 rng(7);

  // The test file, written with direct I/O so none of it sits in the page cache.
  const FileRemover remover{o.dir + "/ebb-profile-" + std::to_string(::getpid()) + ".bin"};
  DirectFile f = DirectFile::create(remover.path, o.file_bytes);
  p.direct_io = f.direct();
  const uint64_t max_req = *std::max_element(o.request_sizes.begin(), o.request_sizes.end());
  const int max_qd = *std::max_element(o.queue_depths.begin(), o.queue_depths.end());
  Buffer bufs = alloc.allocate(max_req * static_cast<uint64_t>(max_qd), MemCategory::kIoBuffer, kDirectAlign);
  for (uint64_t i = 0; i < bufs.size() / 8; ++i) bufs.as<uint64_t>()[i] = rng();  // incompressible
  say("profile: writing a " + std::to_string(o.file_bytes >> 20) + " MiB test file in " + o.dir);
  {
    const uint64_t piece = std::min<uint64_t>(max_req, 4ull << 20);
    std::vector<IoRequest> reqs;
    for (uint64_t off = 0; off < o.file_bytes; off += piece) {
      reqs.push_back({f.fd(), off, bufs.data(), std::min(piece, o.file_bytes - off), true});
    }
    IoEngine io(IoOptions{8, piece, true});
    io.run(reqs, f.path());
  }

  for (uint64_t req : o.request_sizes) {
    for (int qd : o.queue_depths) {
      const double g = timed_random_io(f, o.file_bytes, req, qd, o.seconds_per_point, false, bufs.as<uint8_t>(), rng);
      p.reads.push_back({req, qd, g});
      say("profile: read " + std::to_string(req >> 10) + " KiB x " + std::to_string(qd) + ": " +
          std::to_string(g) + " GB/s");
    }
  }
  const int again = confirm_read_points(p.reads, 0.10, [&](uint64_t req, int qd) {
    return timed_random_io(f, o.file_bytes, req, qd, o.seconds_per_point, false, bufs.as<uint8_t>(), rng);
  });
  say("profile: measured the " + std::to_string(again) + " fastest points again; each keeps its lower figure");
  const ReadPoint* best = &choose_read_point(p.reads);
  p.best_request_bytes = best->request_bytes;
  p.best_queue_depth = best->queue_depth;
  p.read_gbps = best->gbps;
  p.write_gbps = timed_random_io(f, o.file_bytes, p.best_request_bytes, p.best_queue_depth, o.seconds_per_point,
                                 true, bufs.as<uint8_t>(), rng);
  say("profile: write at the chosen point: " + std::to_string(p.write_gbps) + " GB/s");
  bufs.reset();
  f.close();

  for (KvCodecId id : {KvCodecId::kInt8, KvCodecId::kInt4}) {
    p.codecs.push_back(measure_codec(id, o.isa, o.seconds_per_point, o.quick ? 2 : 8, alloc));
    say("profile: codec " + p.codecs.back().codec + ": decompress " + std::to_string(p.codecs.back().decompress_gbps) +
        " GB/s");
  }
  p.alloc_gbps = measure_alloc(alloc, o.quick ? (16ull << 20) : (64ull << 20), o.seconds_per_point);
  say("profile: allocate + first touch: " + std::to_string(p.alloc_gbps) + " GB/s");
  return p;
}

}  // namespace ebb
