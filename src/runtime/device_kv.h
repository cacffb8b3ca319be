// A session's KV on a compute device meets the host's KV chunks: the
// prefix cache (and its persistent tier) and session files keep the host's
// format, F16 chunks of [2, chunk_size, n_kv_heads, head_dim] (K rows, then
// V rows) per layer, so a device session publishes its full chunks by
// reading them back and reuses cached ones by uploading them instead of
// prefilling. DeviceForward::read_kv / write_kv / copy_kv move the rows
// (one submission each); these helpers cut them into chunks. On a split of
// the layers (-ngl N < n_layers) they move the device layers' rows only: the
// CPU layers' rows are in the host KvCache's chunks already.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "memory/kv_pool.h"

namespace ebb {

class DeviceForward;
class KvCache;

// Chunks [c0, c1) of kv's KV (c1 * chunk_size <= kv.n_tokens()) as host
// chunks: [c1 - c0][n_layers], each holding all chunk_size rows. The device
// layers' are new resident chunks taken from `pool`, read back; a split's
// CPU layers [0, kv.n_host_layers()) are the host cache's own, shared.
std::vector<std::vector<KvChunkHandle>> download_kv_chunks(DeviceForward& dev, const KvCache& kv, int64_t c0,
                                                           int64_t c1, KvPool& pool);

// Host chunks ([chunk][layer], F16, full, resident) written into kv's
// device KV as its chunks [c0, c0 + chunks.size()): the device layers'
// only (a split's CPU layers are the caller's: KvCache::adopt);
// kv.n_tokens() stays the caller's to set. Throws ebb::Error on a device
// layer's chunk of another geometry or one that is not resident.
void upload_kv_chunks(DeviceForward& dev, KvCache& kv, int64_t c0, std::span<const std::vector<KvChunkHandle>> chunks);

}  // namespace ebb
