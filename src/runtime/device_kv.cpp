// DeviceForward's KV transfers (declared in device_forward.h), parking a
// session's device KV on the host (evict) and back, and the host-side
// helpers of device_kv.h.
#include "runtime/device_kv.h"

#include <algorithm>
#include <cstring>

#include "memory/kv_cache.h"
#include "platform/error.h"
#include "runtime/device_forward.h"

namespace ebb {
namespace {

// Positions per submission: every layer's K and V rows of a block fit the
// staging cap (at least one position).
int64_t block_positions(int64_t n_layers, uint64_t row_bytes, uint64_t cap) {
  const uint64_t per_pos = 2 * static_cast<uint64_t>(n_layers) * row_bytes;
  return std::max<int64_t>(1, static_cast<int64_t>(cap / per_pos));
}

}  // namespace

BackendBuffer& DeviceForward::staging(uint64_t bytes) {
  if (!staging_ || staging_->size() < bytes) {
    staging_.reset();  // its slab goes back before a larger one is taken
    staging_ = be_.alloc(bytes, MemoryPlace::kHost);
  }
  return *staging_;
}

void DeviceForward::transfer_kv(SeqKv& s, int64_t p0, int64_t p1, bool to_device, const KvRows& host) {
  // A split's CPU layers [0, first_layer) hold their rows in the host
  // cache: only the device layers' rows move here.
  const int64_t l0 = opts_.first_layer, nl = model_.n_layers() - l0, kvd = cfg_.kv_dim();
  const uint64_t row = static_cast<uint64_t>(kvd) * 2;
  const int64_t block = std::min(p1 - p0, block_positions(nl, row, opts_.kv_staging_bytes));
  BackendBuffer& st = staging(2 * static_cast<uint64_t>(nl * block) * row);
  auto* mapped = static_cast<uint8_t*>(st.host_data());
  std::vector<uint8_t> bounce;  // staging the host cannot address (not seen yet): through read/write
  if (!mapped) bounce.resize(2 * static_cast<uint64_t>(nl * block) * row);
  uint8_t* base = mapped ? mapped : bounce.data();
  BackendStream& str = *stream_;
  for (int64_t a = p0; a < p1; a += block) {
    const int64_t m = std::min(block, p1 - a);
    const uint64_t part = static_cast<uint64_t>(m) * row;  // one layer's K (or V) rows of the block
    auto each = [&](const auto& f) {
      for (int64_t i = 0; i < nl; ++i)
        for (const bool v : {false, true}) f(l0 + i, v, (2 * i + (v ? 1 : 0)) * part);
    };
    if (to_device) {
      each([&](int64_t l, bool v, uint64_t off) { host(l, v, a, m, reinterpret_cast<uint16_t*>(base + off)); });
      if (!mapped) st.write(0, base, 2 * nl * part);
    }
    run_on(str, [&] {
      each([&](int64_t l, bool v, uint64_t off) {
        const TensorRef dev{(v ? s.v : s.k)[l].get(), static_cast<uint64_t>(a) * row}, stage{&st, off};
        str.copy({to_device ? stage : dev, to_device ? dev : stage, part});
      });
    });
    if (!to_device) {
      if (!mapped) st.read(0, base, 2 * nl * part);
      each([&](int64_t l, bool v, uint64_t off) { host(l, v, a, m, reinterpret_cast<uint16_t*>(base + off)); });
    }
  }
}

void DeviceForward::park(SeqKv& s, int64_t n) {
  if (s.is_parked || s.cap_chunks == 0) return;
  const int64_t l0 = opts_.first_layer, nd = model_.n_layers() - l0;
  const uint64_t row = static_cast<uint64_t>(cfg_.kv_dim()) * 2;
  Buffer host;
  if (n > 0) {
    host = alloc_.allocate(2 * static_cast<uint64_t>(nd * n) * row, MemCategory::kKvCache);
    uint8_t* base = host.as<uint8_t>();
    transfer_kv(s, 0, n, false, [&](int64_t l, bool v, int64_t p, int64_t m, uint16_t* rows) {
      std::memcpy(base + ((2 * (l - l0) + (v ? 1 : 0)) * n + p) * row, rows, m * row);
    });
  }
  s.parked = std::move(host);
  s.parked_tokens = n;
  s.is_parked = true;
  for (auto* side : {&s.k, &s.v})
    for (auto& b : *side) b.reset();
  s.table.reset();  // cap_chunks stays: unpark() takes the same capacity again
}

void DeviceForward::unpark(SeqKv& s) {
  if (!s.is_parked) return;
  const int64_t l0 = opts_.first_layer, n = s.parked_tokens;
  const uint64_t row = static_cast<uint64_t>(cfg_.kv_dim()) * 2;
  const uint64_t bytes = static_cast<uint64_t>(s.cap_chunks * s.chunk_size) * row;
  // A failure (device memory) leaves the session parked; what was taken is kept for the next try.
  for (int l = opts_.first_layer; l < model_.n_layers(); ++l)
    for (auto* side : {&s.k, &s.v})
      if (!(*side)[l]) (*side)[l] = be_.alloc(bytes, MemoryPlace::kDevice);
  if (!s.table) make_table(s, s.cap_chunks);
  if (n > 0) {
    const uint8_t* base = s.parked.as<uint8_t>();
    transfer_kv(s, 0, n, true, [&](int64_t l, bool v, int64_t p, int64_t m, uint16_t* rows) {
      std::memcpy(rows, base + ((2 * (l - l0) + (v ? 1 : 0)) * n + p) * row, m * row);
    });
  }
  s.parked = Buffer{};
  s.parked_tokens = 0;
  s.is_parked = false;
}

void DeviceForward::read_kv(const KvCache& kv, int64_t p0, int64_t p1, const KvRows& take) {
  std::lock_guard lock(mu_);
  EBB_CHECK(0 <= p0 && p0 <= p1 && p1 <= kv.n_tokens());
  if (p0 == p1) return;
  const auto it = kv_.find(&kv);
  EBB_CHECK_MSG(it != kv_.end() && it->second.cap_chunks * it->second.chunk_size >= p1,
                "read_kv: the device holds fewer positions than the cache says");
  unpark(it->second);
  transfer_kv(it->second, p0, p1, false, take);
}

void DeviceForward::write_kv(KvCache& kv, int64_t p0, int64_t p1, const KvRows& fill) {
  std::lock_guard lock(mu_);
  EBB_CHECK(0 <= p0 && p0 <= p1 && p1 <= kv.options().max_tokens);
  if (p0 == p1) return;
  transfer_kv(kv_for(kv, p1), p0, p1, true, fill);
}

void DeviceForward::read_kv(const KvCache& kv, int64_t p0, int64_t p1, uint16_t* k, uint16_t* v) {
  const int64_t n = p1 - p0, kvd = cfg_.kv_dim();
  read_kv(kv, p0, p1, [&](int64_t l, bool is_v, int64_t p, int64_t m, uint16_t* rows) {
    std::memcpy((is_v ? v : k) + (l * n + (p - p0)) * kvd, rows, static_cast<size_t>(m * kvd) * 2);
  });
}

void DeviceForward::write_kv(KvCache& kv, int64_t p0, int64_t p1, const uint16_t* k, const uint16_t* v) {
  const int64_t n = p1 - p0, kvd = cfg_.kv_dim();
  write_kv(kv, p0, p1, [&](int64_t l, bool is_v, int64_t p, int64_t m, uint16_t* rows) {
    std::memcpy(rows, (is_v ? v : k) + (l * n + (p - p0)) * kvd, static_cast<size_t>(m * kvd) * 2);
  });
}

void DeviceForward::copy_kv(const KvCache& src, KvCache& dst, int64_t n) {
  std::lock_guard lock(mu_);
  EBB_CHECK(&src != &dst && 0 <= n && n <= src.n_tokens() && n <= dst.options().max_tokens);
  if (n == 0) return;
  const auto it = kv_.find(&src);
  EBB_CHECK_MSG(it != kv_.end() && it->second.cap_chunks * it->second.chunk_size >= n,
                "copy_kv: the device holds fewer positions than the cache says");
  unpark(it->second);
  const SeqKv& s = it->second;
  SeqKv& d = kv_for(dst, n);  // std::map: s stays valid
  const uint64_t bytes = static_cast<uint64_t>(n * cfg_.kv_dim()) * 2;
  BackendStream& str = *stream_;
  run_on(str, [&] {
    for (int l = opts_.first_layer; l < model_.n_layers(); ++l) {  // a split's CPU layers: the host cache's
      str.copy({{s.k[l].get(), 0}, {d.k[l].get(), 0}, bytes});
      str.copy({{s.v[l].get(), 0}, {d.v[l].get(), 0}, bytes});
    }
  });
}

std::vector<std::vector<KvChunkHandle>> download_kv_chunks(DeviceForward& dev, const KvCache& kv, int64_t c0,
                                                           int64_t c1, KvPool& pool) {
  const int64_t cs = kv.options().chunk_size, nl = kv.shape().n_layer, nh = kv.n_host_layers();
  const int64_t kvd = kv.shape().n_kv_heads * kv.shape().head_dim;
  EBB_CHECK(0 <= c0 && c0 <= c1 && c1 * cs <= kv.n_tokens());
  EBB_CHECK(nh == dev.first_layer());
  std::vector<std::vector<KvChunkHandle>> out;
  if (c0 == c1) return out;
  std::vector<int32_t> layers;  // the device layers' chunks are new
  for (int64_t c = c0; c < c1; ++c)
    for (int64_t l = nh; l < nl; ++l) layers.push_back(static_cast<int32_t>(l));
  std::vector<KvChunkHandle> fresh = pool.create(layers, cs, DType::kF16);
  size_t next = 0;
  for (int64_t c = c0; c < c1; ++c) {
    std::vector<KvChunkHandle>& ch = out.emplace_back();
    // A split's CPU layers: the host cache's own (full) chunks, shared.
    for (int64_t l = 0; l < nh; ++l) {
      EBB_CHECK(kv.chunk(l, c).rows >= cs);
      ch.push_back(kv.handle(l, c));
    }
    for (int64_t l = nh; l < nl; ++l) {
      fresh[next]->rows = cs;
      ch.push_back(std::move(fresh[next++]));
    }
  }
  // Straight from staging into the chunks: K rows, then V rows, of each.
  const uint64_t row = static_cast<uint64_t>(kvd) * 2;
  dev.read_kv(kv, c0 * cs, c1 * cs, [&](int64_t l, bool v, int64_t p, int64_t n, uint16_t* rows) {
    for (int64_t q = p; q < p + n;) {
      const int64_t c = q / cs, in = q % cs, m = std::min(cs - in, p + n - q);
      uint8_t* dst = out[static_cast<size_t>(c - c0)][static_cast<size_t>(l)]->storage.as<uint8_t>();
      std::memcpy(dst + (v ? cs : 0) * row + in * row, rows + (q - p) * kvd, m * row);
      q += m;
    }
  });
  return out;
}

void upload_kv_chunks(DeviceForward& dev, KvCache& kv, int64_t c0, std::span<const std::vector<KvChunkHandle>> chunks) {
  const int64_t cs = kv.options().chunk_size, nl = kv.shape().n_layer, nh = kv.n_host_layers();
  const int64_t kvd = kv.shape().n_kv_heads * kv.shape().head_dim;
  EBB_CHECK(nh == dev.first_layer());
  if (chunks.empty()) return;
  const int64_t nc = static_cast<int64_t>(chunks.size());
  for (int64_t c = 0; c < nc; ++c) {
    EBB_CHECK(static_cast<int64_t>(chunks[c].size()) == nl);
    for (int64_t l = nh; l < nl; ++l) {  // a split's CPU layers are the host cache's (KvCache::adopt)
      const KvChunk& h = *chunks[c][l];
      if (h.chunk_size != cs || h.type != DType::kF16 || h.rows < cs)
        throw Error("a KV chunk of " + std::to_string(h.chunk_size) + " tokens (" + std::to_string(h.rows) +
                    " rows) cannot go to a device session's KV of F16 chunks of " + std::to_string(cs));
      if (!h.resident()) throw Error("a KV chunk to upload to the device is not resident");
    }
  }
  const uint64_t row = static_cast<uint64_t>(kvd) * 2;
  const int64_t p0 = c0 * cs;
  dev.write_kv(kv, p0, (c0 + nc) * cs, [&](int64_t l, bool v, int64_t p, int64_t n, uint16_t* rows) {
    for (int64_t q = p; q < p + n;) {
      const int64_t c = (q - p0) / cs, in = (q - p0) % cs, m = std::min(cs - in, p + n - q);
      const uint8_t* src = chunks[static_cast<size_t>(c)][static_cast<size_t>(l)]->storage.as<uint8_t>();
      std::memcpy(rows + (q - p) * kvd, src + (v ? cs : 0) * row + in * row, m * row);
      q += m;
    }
  });
}

}  // namespace ebb
