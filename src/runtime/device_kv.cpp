// DeviceForward's KV transfers (declared in device_forward.h) and the
// host-side helpers of device_kv.h.
#include "runtime/device_kv.h"

#include <algorithm>
#include <cstring>

#include "memory/kv_cache.h"
#include "platform/error.h"
#include "runtime/device_forward.h"

namespace ebb {
namespace {

constexpr uint64_t kStagingBytes = 64ull << 20;  // host-visible staging per submission, at most

// Positions per submission: every layer's K and V rows of a block fit the
// staging cap (at least one position).
int64_t block_positions(int64_t n_layers, uint64_t row_bytes) {
  const uint64_t per_pos = 2 * static_cast<uint64_t>(n_layers) * row_bytes;
  return std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes / per_pos));
}

}  // namespace

void DeviceForward::read_kv(const KvCache& kv, int64_t p0, int64_t p1, uint16_t* k, uint16_t* v) {
  std::lock_guard lock(mu_);
  EBB_CHECK(0 <= p0 && p0 <= p1 && p1 <= kv.n_tokens());
  if (p0 == p1) return;
  const auto it = kv_.find(&kv);
  EBB_CHECK_MSG(it != kv_.end() && it->second.cap_chunks * it->second.chunk_size >= p1,
                "read_kv: the device holds fewer positions than the cache says");
  const SeqKv& s = it->second;
  const int64_t nl = model_.n_layers(), kvd = cfg_.kv_dim(), n = p1 - p0;
  const uint64_t row = static_cast<uint64_t>(kvd) * 2;
  const int64_t block = std::min(n, block_positions(nl, row));
  auto st = be_.alloc(2 * static_cast<uint64_t>(nl * block) * row, MemoryPlace::kHost);
  BackendStream& str = *stream_;
  for (int64_t a = p0; a < p1; a += block) {
    const int64_t m = std::min(block, p1 - a);
    const uint64_t part = static_cast<uint64_t>(m) * row;  // one layer's K (or V) rows of the block
    try {
      for (int64_t l = 0; l < nl; ++l) {
        str.copy({{s.k[l].get(), static_cast<uint64_t>(a) * row}, {st.get(), (2 * l) * part}, part});
        str.copy({{s.v[l].get(), static_cast<uint64_t>(a) * row}, {st.get(), (2 * l + 1) * part}, part});
      }
      str.submit();
      str.wait();
    } catch (...) {
      try {
        str.wait();  // nothing stays recorded for the next step
      } catch (const Error&) {
      }
      throw;
    }
    for (int64_t l = 0; l < nl; ++l) {
      st->read((2 * l) * part, k + (l * n + (a - p0)) * kvd, part);
      st->read((2 * l + 1) * part, v + (l * n + (a - p0)) * kvd, part);
    }
  }
}

void DeviceForward::write_kv(KvCache& kv, int64_t p0, int64_t p1, const uint16_t* k, const uint16_t* v) {
  std::lock_guard lock(mu_);
  EBB_CHECK(0 <= p0 && p0 <= p1 && p1 <= kv.options().max_tokens);
  if (p0 == p1) return;
  SeqKv& s = kv_for(kv, p1);
  const int64_t nl = model_.n_layers(), kvd = cfg_.kv_dim(), n = p1 - p0;
  const uint64_t row = static_cast<uint64_t>(kvd) * 2;
  const int64_t block = std::min(n, block_positions(nl, row));
  auto st = be_.alloc(2 * static_cast<uint64_t>(nl * block) * row, MemoryPlace::kHost);
  BackendStream& str = *stream_;
  for (int64_t a = p0; a < p1; a += block) {
    const int64_t m = std::min(block, p1 - a);
    const uint64_t part = static_cast<uint64_t>(m) * row;
    for (int64_t l = 0; l < nl; ++l) {
      st->write((2 * l) * part, k + (l * n + (a - p0)) * kvd, part);
      st->write((2 * l + 1) * part, v + (l * n + (a - p0)) * kvd, part);
    }
    try {
      for (int64_t l = 0; l < nl; ++l) {
        str.copy({{st.get(), (2 * l) * part}, {s.k[l].get(), static_cast<uint64_t>(a) * row}, part});
        str.copy({{st.get(), (2 * l + 1) * part}, {s.v[l].get(), static_cast<uint64_t>(a) * row}, part});
      }
      str.submit();
      str.wait();
    } catch (...) {
      try {
        str.wait();
      } catch (const Error&) {
      }
      throw;
    }
  }
}

void DeviceForward::copy_kv(const KvCache& src, KvCache& dst, int64_t n) {
  std::lock_guard lock(mu_);
  EBB_CHECK(&src != &dst && 0 <= n && n <= src.n_tokens() && n <= dst.options().max_tokens);
  if (n == 0) return;
  const auto it = kv_.find(&src);
  EBB_CHECK_MSG(it != kv_.end() && it->second.cap_chunks * it->second.chunk_size >= n,
                "copy_kv: the device holds fewer positions than the cache says");
  const SeqKv& s = it->second;
  SeqKv& d = kv_for(dst, n);  // std::map: s stays valid
  const uint64_t bytes = static_cast<uint64_t>(n * cfg_.kv_dim()) * 2;
  BackendStream& str = *stream_;
  try {
    for (int l = 0; l < model_.n_layers(); ++l) {
      str.copy({{s.k[l].get(), 0}, {d.k[l].get(), 0}, bytes});
      str.copy({{s.v[l].get(), 0}, {d.v[l].get(), 0}, bytes});
    }
    str.submit();
    str.wait();
  } catch (...) {
    try {
      str.wait();
    } catch (const Error&) {
    }
    throw;
  }
}

std::vector<std::vector<KvChunkHandle>> download_kv_chunks(DeviceForward& dev, const KvCache& kv, int64_t c0,
                                                           int64_t c1, KvPool& pool) {
  const int64_t cs = kv.options().chunk_size, nl = kv.shape().n_layer;
  const int64_t kvd = kv.shape().n_kv_heads * kv.shape().head_dim;
  EBB_CHECK(0 <= c0 && c0 <= c1 && c1 * cs <= kv.n_tokens());
  std::vector<std::vector<KvChunkHandle>> out;
  if (c0 == c1) return out;
  const int64_t n = (c1 - c0) * cs;
  std::vector<uint16_t> k(static_cast<size_t>(nl * n * kvd)), v(k.size());  // [nl, n, kvd]
  dev.read_kv(kv, c0 * cs, c1 * cs, k.data(), v.data());
  std::vector<int32_t> layers;
  for (int64_t c = c0; c < c1; ++c)
    for (int64_t l = 0; l < nl; ++l) layers.push_back(static_cast<int32_t>(l));
  std::vector<KvChunkHandle> fresh = pool.create(layers, cs, DType::kF16);
  const uint64_t part = static_cast<uint64_t>(cs * kvd) * 2;  // a chunk's K (or V) rows
  size_t next = 0;
  for (int64_t c = c0; c < c1; ++c) {
    std::vector<KvChunkHandle>& ch = out.emplace_back();
    for (int64_t l = 0; l < nl; ++l) {
      KvChunkHandle h = std::move(fresh[next++]);
      uint8_t* dst = h->storage.as<uint8_t>();
      const size_t from = static_cast<size_t>((l * n + (c - c0) * cs) * kvd);
      std::memcpy(dst, k.data() + from, part);
      std::memcpy(dst + part, v.data() + from, part);
      h->rows = cs;
      ch.push_back(std::move(h));
    }
  }
  return out;
}

void upload_kv_chunks(DeviceForward& dev, KvCache& kv, int64_t c0, std::span<const std::vector<KvChunkHandle>> chunks) {
  const int64_t cs = kv.options().chunk_size, nl = kv.shape().n_layer;
  const int64_t kvd = kv.shape().n_kv_heads * kv.shape().head_dim;
  if (chunks.empty()) return;
  const int64_t nc = static_cast<int64_t>(chunks.size()), n = nc * cs;
  std::vector<uint16_t> k(static_cast<size_t>(nl * n * kvd)), v(k.size());  // [nl, n, kvd]
  const uint64_t part = static_cast<uint64_t>(cs * kvd) * 2;
  for (int64_t c = 0; c < nc; ++c) {
    EBB_CHECK(static_cast<int64_t>(chunks[c].size()) == nl);
    for (int64_t l = 0; l < nl; ++l) {
      const KvChunk& h = *chunks[c][l];
      if (h.chunk_size != cs || h.type != DType::kF16 || h.rows < cs)
        throw Error("a KV chunk of " + std::to_string(h.chunk_size) + " tokens (" + std::to_string(h.rows) +
                    " rows) cannot go to a device session's KV of F16 chunks of " + std::to_string(cs));
      if (!h.resident()) throw Error("a KV chunk to upload to the device is not resident");
      const uint8_t* src = const_cast<KvChunk&>(h).storage.as<uint8_t>();
      const size_t at = static_cast<size_t>((l * n + c * cs) * kvd);
      std::memcpy(k.data() + at, src, part);
      std::memcpy(v.data() + at, src + part, part);
    }
  }
  dev.write_kv(kv, c0 * cs, (c0 + nc) * cs, k.data(), v.data());
}

}  // namespace ebb
