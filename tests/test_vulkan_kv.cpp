// A session's KV on a Vulkan device meets the host (runtime/device_kv.h):
// the prefix cache (a prefix published by one device session is uploaded
// into another instead of prefilled; namespaces and adapter versions never
// share; the persistent tier across engines), forks copied on the device
// (two continuations each equal an unforked run), session files saved on
// the device and loaded on the CPU and the reverse, and the device ledger
// back where it was once the sessions and the engine are gone, and the
// device KV of live sessions parked on the host by evict() and brought back
// by their next steps (serve's
// n > 1 and cached tokens on a device: test_serve_vulkan.cpp). Skips without a Vulkan device
// unless EBB_TEST_REQUIRE_VULKAN=1 (vulkan_support.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "memory/kv_cache.h"
#include "model/model.h"
#include "platform/error.h"
#include "runtime/device_forward.h"
#include "runtime/device_kv.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "support.h"
#include "vulkan_engine_support.h"
#include "vulkan_support.h"

namespace ebb {
namespace {

using test::chunked;
using test::copy;
using test::long_tokens;
using test::nmse;
using test::cpu_options;

EngineOptions device_options(const std::string& model, Backend* be, bool prefix_cache = false) {
  EngineOptions eo = cpu_options(model);
  eo.backend = be;
  eo.prefix_cache = prefix_cache;
  return eo;
}

// The transfers themselves, through a staging buffer of 3 positions (so a
// transfer takes several submissions): rows written to the device read back
// bit for bit, whole and in part; a fork's device copy holds the source's
// rows; chunks downloaded for the prefix cache hold the rows in the host's
// chunk layout and upload into another place exactly; the host-visible
// staging is freed with the last session's KV.
TEST(VulkanKv, TransfersRoundTripBitForBitInBlocks) {
  EBB_REQUIRE_VULKAN(be);
  Ledger ledger;
  Allocator alloc(&ledger);
  std::unique_ptr<Model> model = Model::load(test::model_path("stories260K.gguf"), alloc);
  const ModelConfig& c = model->config();
  const int64_t nl = c.n_layer, kvd = c.kv_dim(), n = 11;
  const MemoryLedger host0 = be->ledger(MemoryPlace::kHost);
  DeviceForwardOptions o;
  o.max_batch = 8;
  o.kv_staging_bytes = static_cast<uint64_t>(2 * nl * kvd * 2 * 3);
  DeviceForward df(*be, *model, alloc, o);
  KvPool pool(KvShape{c.n_layer, c.n_head_kv, c.head_dim}, &alloc);
  KvCacheOptions ko;
  ko.chunk_size = 4;
  ko.max_tokens = 64;
  ko.host_layers = 0;  // every layer's rows on the device
  {
    KvCache a(pool, ko), b(pool, ko);
    std::vector<uint16_t> k(static_cast<size_t>(nl * n * kvd)), v(k.size());  // [nl, n, kvd]
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<uint16_t>((i * 7919) % 0x7bff);  // finite F16 bit patterns, all different nearby
      v[i] = static_cast<uint16_t>((i * 104729 + 5) % 0x7bff);
    }
    auto slice = [&](const std::vector<uint16_t>& x, int64_t p0, int64_t p1) {
      std::vector<uint16_t> out;
      for (int64_t l = 0; l < nl; ++l)
        out.insert(out.end(), x.begin() + (l * n + p0) * kvd, x.begin() + (l * n + p1) * kvd);
      return out;
    };
    auto read = [&](const KvCache& kv, int64_t p0, int64_t p1) {
      std::vector<uint16_t> rk(static_cast<size_t>(nl * (p1 - p0) * kvd)), rv(rk.size());
      df.read_kv(kv, p0, p1, rk.data(), rv.data());
      return std::make_pair(rk, rv);
    };
    df.write_kv(a, 0, n, k.data(), v.data());
    a.set_n_tokens(n);
    auto [rk, rv] = read(a, 0, n);
    EXPECT_EQ(rk, k);
    EXPECT_EQ(rv, v);
    auto [pk, pv] = read(a, 2, 9);
    EXPECT_EQ(pk, slice(k, 2, 9));
    EXPECT_EQ(pv, slice(v, 2, 9));
    // A fork's copy on the device.
    df.copy_kv(a, b, 9);
    b.set_n_tokens(9);
    auto [fk, fv] = read(b, 0, 9);
    EXPECT_EQ(fk, slice(k, 0, 9));
    EXPECT_EQ(fv, slice(v, 0, 9));
    // Chunk 1 of a (positions 4..7) as host chunks: K rows then V rows.
    const std::vector<std::vector<KvChunkHandle>> ch = download_kv_chunks(df, a, 1, 2, pool);
    ASSERT_EQ(ch.size(), 1u);
    ASSERT_EQ(ch[0].size(), static_cast<size_t>(nl));
    for (int64_t l = 0; l < nl; ++l) {
      const uint16_t* got = ch[0][l]->storage.as<uint16_t>();
      EXPECT_EQ(ch[0][l]->rows, 4);
      EXPECT_TRUE(std::equal(got, got + 4 * kvd, k.begin() + (l * n + 4) * kvd)) << "layer " << l;
      EXPECT_TRUE(std::equal(got + 4 * kvd, got + 8 * kvd, v.begin() + (l * n + 4) * kvd)) << "layer " << l;
    }
    // Uploaded as b's chunk 2 (positions 8..11).
    upload_kv_chunks(df, b, 2, ch);
    b.set_n_tokens(12);
    auto [uk, uv] = read(b, 8, 12);
    EXPECT_EQ(uk, slice(k, 4, 8));
    EXPECT_EQ(uv, slice(v, 4, 8));
    EXPECT_GT(be->ledger(MemoryPlace::kHost).buffer_bytes, host0.buffer_bytes) << "the staging is kept";
    df.release(&a);
    df.release(&b);
  }
  EXPECT_EQ(be->ledger(MemoryPlace::kHost).buffer_bytes, host0.buffer_bytes);
  EXPECT_EQ(be->ledger(MemoryPlace::kHost).n_buffers, host0.n_buffers);
}

// Device session A publishes its full chunks (read back into the host's
// prefix cache); device session B with a longer prompt takes them (uploaded,
// counted as reused, not run) and its logits equal a cold prefill's and the
// CPU engine's; B's own new chunk is published by reading back that chunk
// alone. Another namespace shares nothing.
TEST(VulkanKv, APrefixCachedByOneDeviceSessionIsReusedByAnother) {
  EBB_REQUIRE_VULKAN(be);
  const std::vector<int32_t> all = long_tokens();
  ASSERT_GE(all.size(), 13u);
  const std::vector<int32_t> toks(all.begin(), all.begin() + 13);
  const std::vector<int32_t> first(all.begin(), all.begin() + 9);  // 2 whole chunks of 4
  Engine gpu(device_options("stories260K", be, /*prefix_cache=*/true));
  PrefixCache* pc = gpu.prefix_cache();
  ASSERT_NE(pc, nullptr);
  Session a(gpu, chunked());
  a.feed(first);
  EXPECT_EQ(pc->stats().inserted_chunks, 2);
  EXPECT_EQ(pc->covered(a.cache_key(), first), 8);
  EXPECT_GT(gpu.footprint().kv(), 0u) << "the cache's chunks live on the host";
  Session b(gpu, chunked());
  const std::vector<float> lb = copy(b.feed(toks));
  EXPECT_EQ(b.reused_tokens(), 8);
  EXPECT_EQ(b.tokens_run(), 5);
  EXPECT_EQ(pc->stats().inserted_chunks, 3) << "b's third chunk (positions 8..11) is published";
  EXPECT_EQ(pc->covered(b.cache_key(), toks), 12);
  // A cold prefill on the device, and the CPU engine.
  SessionOptions cold = chunked();
  cold.use_prefix_cache = false;
  Session c(gpu, cold);
  const std::vector<float> lc = copy(c.feed(toks));
  EXPECT_EQ(c.reused_tokens(), 0);
  EXPECT_LE(nmse(lb, lc), 1e-9);
  Engine cpu(cpu_options("stories260K"));
  Session r(cpu, chunked());
  EXPECT_LE(nmse(lb, r.feed(toks)), 1e-6);
  // A decode step after the reuse still equals the cold session's.
  const int32_t next = static_cast<int32_t>(std::max_element(lb.begin(), lb.end()) - lb.begin());
  EXPECT_LE(nmse(b.feed({&next, 1}), c.feed({&next, 1})), 1e-9);
  // Another namespace: nothing shared, same logits.
  SessionOptions other = chunked();
  other.cache_namespace = "elsewhere";
  Session d(gpu, other);
  EXPECT_LE(nmse(d.feed(toks), lc), 1e-9);
  EXPECT_EQ(d.reused_tokens(), 0);
}

// Keys carry the adapter and its version: chunks a device session publishes
// under one adapter version are found under exactly that key, never under
// another version, another adapter or the base model.
TEST(VulkanKv, AdapterVersionsNeverShareDeviceChunks) {
  EBB_REQUIRE_VULKAN(be);
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> toks(all.begin(), all.begin() + 9);
  Engine gpu(device_options("stories260K", be, true));
  PrefixCache* pc = gpu.prefix_cache();
  SessionOptions so = chunked();
  so.use_prefix_cache = false;  // nothing recorded under the base key by the session itself
  Session a(gpu, so);
  a.feed(toks);
  CacheKey v1 = a.cache_key();
  v1.adapters = {AdapterKey{"style", 1, 0x1111, 1.0f}};
  CacheKey v2 = v1;
  v2.adapters[0].version = 2;
  v2.adapters[0].digest = 0x2222;
  CacheKey other = v1;
  other.adapters[0].name = "other";
  a.insert_into(*pc, v1, toks);
  EXPECT_EQ(pc->stats().inserted_chunks, 2);
  EXPECT_EQ(pc->covered(v1, toks), 8);
  EXPECT_EQ(pc->covered(v2, toks), 0);
  EXPECT_EQ(pc->covered(other, toks), 0);
  EXPECT_EQ(pc->covered(a.cache_key(), toks), 0);
  EXPECT_EQ(pc->lookup(v2, toks).n_tokens, 0);
  // Published again: nothing new is read back or inserted.
  a.insert_into(*pc, v1, toks);
  EXPECT_EQ(pc->stats().inserted_chunks, 2);
  // The chunks found under v1 hold the device's rows: uploaded into a fresh
  // session's device KV, they give the logits of the session that made them.
  const PrefixHit hit = pc->lookup(v1, toks);
  ASSERT_EQ(hit.n_tokens, 8);
  Session base(gpu, chunked());
  const std::vector<float> ref = copy(a.last_logits());
  EXPECT_LE(nmse(base.feed(toks), ref), 1e-9);
  EXPECT_EQ(base.reused_tokens(), 0) << "the base key holds nothing";
}

// The persistent tier works unchanged: chunks a device engine published
// are written to --cache-dir, and a second device engine (another process's
// place) reads them back from there and uploads them.
TEST(VulkanKv, ThePersistentTierServesASecondDeviceEngine) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vkkv");
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> toks(all.begin(), all.begin() + 13);
  std::vector<float> ref;
  {
    EngineOptions eo = device_options("stories260K", be, true);
    eo.cache_dir = dir.path();
    Engine gpu(eo);
    Session a(gpu, chunked());
    ref = copy(a.feed(toks));
    EXPECT_EQ(gpu.prefix_cache()->stats().inserted_chunks, 3);
  }
  EngineOptions eo = device_options("stories260K", be, true);
  eo.cache_dir = dir.path();
  Engine gpu(eo);
  Session b(gpu, chunked());
  EXPECT_LE(nmse(b.feed(toks), ref), 1e-9);
  EXPECT_EQ(b.reused_tokens(), 12);
  EXPECT_EQ(gpu.prefix_cache()->stats().read_from_store, 3);
}

// A fork copies the KV on the device: the forked session and the original
// continue differently, each equal to an unforked run of its tokens; a fork
// at a point before the end runs the rest.
TEST(VulkanKv, ForkThenTwoContinuationsEachEqualAnUnforkedRun) {
  EBB_REQUIRE_VULKAN(be);
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 9);
  const std::vector<int32_t> cont1 = {all[9], all[10]}, cont2 = {all[11]};
  Engine gpu(device_options("stories260K", be));
  const MemoryLedger loaded = be->ledger(MemoryPlace::kDevice);
  {
    Session a(gpu, chunked());
    a.feed(prompt);
    Session b(gpu, chunked());
    b.fork_from(a, static_cast<int64_t>(prompt.size()));
    ASSERT_TRUE(b.has_logits());
    EXPECT_EQ(b.tokens(), a.tokens());
    EXPECT_LE(nmse(b.last_logits(), a.last_logits()), 0.0);
    const std::vector<float> l1 = copy(b.feed(cont1));
    const std::vector<float> l2 = copy(a.feed(cont2));
    auto unforked = [&](const std::vector<int32_t>& tail) {
      std::vector<int32_t> t = prompt;
      t.insert(t.end(), tail.begin(), tail.end());
      Session s(gpu, chunked());
      return copy(s.feed(t));
    };
    EXPECT_LE(nmse(l1, unforked(cont1)), 1e-9);
    EXPECT_LE(nmse(l2, unforked(cont2)), 1e-9);
    EXPECT_GT(nmse(l1, l2), 1e-3) << "the two continuations differ";
    // Fork at 6 of a's 10 tokens: the fork runs from there.
    Session c(gpu, chunked());
    c.fork_from(a, 6);
    EXPECT_FALSE(c.has_logits());
    std::vector<int32_t> rest(all.begin() + 6, all.begin() + 11);
    const std::vector<float> l3 = copy(c.feed(rest));
    EXPECT_EQ(c.tokens_run(), 5);
    EXPECT_LE(nmse(l3, unforked({all[9], all[10]})), 1e-9);
    EXPECT_GT(gpu.footprint().device->kv, 0u);
  }
  EXPECT_EQ(gpu.footprint().device->kv, 0u);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, loaded.buffer_bytes);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, loaded.n_buffers);
}

// A session file saved on the device loads on the CPU and the reverse (and
// an F32 file from the CPU loads on the device, rounded to F16): same
// tokens, and the next token's logits within F16 tolerance of a run on the
// loading side. A bad file leaves the device session as it was.
TEST(VulkanKv, SaveOnTheDeviceLoadOnTheCpuAndTheReverse) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vkkv");
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 10);
  const int32_t next = all[10];
  std::vector<int32_t> longer = prompt;
  longer.push_back(next);
  Engine cpu(cpu_options("stories260K"));
  Engine gpu(device_options("stories260K", be));
  std::vector<float> cpu_ref, gpu_ref;
  {
    Session s(cpu);
    cpu_ref = copy(s.feed(longer));
    Session t(gpu);
    gpu_ref = copy(t.feed(longer));
  }
  // Device -> CPU.
  Session g(gpu, chunked());
  g.feed(prompt);
  g.save(dir.file("g.ebbs"));
  Session c(cpu);
  c.load(dir.file("g.ebbs"));
  EXPECT_EQ(c.tokens(), prompt);
  EXPECT_EQ(c.n_processed(), static_cast<int64_t>(prompt.size()));
  const std::vector<float> lc = copy(c.feed({&next, 1}));
  EXPECT_EQ(c.tokens_run(), 1) << "the KV came from the file";
  EXPECT_LE(nmse(lc, cpu_ref), 1e-6);
  // CPU -> device (F16 and F32 files).
  for (const DType type : {DType::kF16, DType::kF32}) {
    SessionOptions so;
    so.kv_type = type;
    Session s(cpu, so);
    s.feed(prompt);
    const std::string f = dir.file(std::string("c_") + std::string(dtype_name(type)) + ".ebbs");
    s.save(f);
    Session d(gpu, chunked(8));
    d.feed(std::vector<int32_t>{all[0], all[1], all[2]});  // something to replace
    d.load(f);
    EXPECT_EQ(d.tokens(), prompt);
    EXPECT_EQ(d.n_processed(), static_cast<int64_t>(prompt.size()));
    const std::vector<float> ld = copy(d.feed({&next, 1}));
    EXPECT_EQ(d.tokens_run(), 3 + 1) << "3 before the load, then the new token only";
    EXPECT_LE(nmse(ld, gpu_ref), 1e-6) << dtype_name(type);
  }
  // Device -> device, then a corrupt file: refused, the session unchanged.
  Session e(gpu);
  e.load(dir.file("g.ebbs"));
  EXPECT_LE(nmse(e.feed({&next, 1}), gpu_ref), 1e-9);
  {
    std::ifstream in(dir.file("g.ebbs"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes[bytes.size() / 2] ^= 0x40;
    std::ofstream(dir.file("bad.ebbs"), std::ios::binary) << bytes;
  }
  const uint64_t kv_before = gpu.footprint().device->kv;
  try {
    e.load(dir.file("bad.ebbs"));
    ADD_FAILURE() << "a corrupt file loaded";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("checksum"), std::string::npos) << err.what();
  }
  EXPECT_EQ(gpu.footprint().device->kv, kv_before);
  EXPECT_EQ(e.n_processed(), static_cast<int64_t>(longer.size()));
}

// KV eviction on the device: evict(everything) with two live sessions
// gives back the weights and both sessions' device KV (read back to the
// host, exactly their rows); each session's next step brings its own KV
// back (the other stays parked) and its logits equal those of the same
// steps on an engine never evicted; a fork of a parked session and a
// session file saved from one read the KV back first; once the sessions go,
// both ledgers are where they were.
TEST(VulkanKv, EvictParksLiveSessionsKvAndTheirNextStepsBringItBack) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vkkv");
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> pa(all.begin(), all.begin() + 9), pb(all.begin() + 2, all.begin() + 7);
  const std::vector<int32_t> next = {all[9], all[10], all[11]};
  // The reference: the same sessions and steps, never evicted.
  std::vector<std::vector<float>> ref_a, ref_b;
  {
    Engine ref(device_options("stories260K", be));
    Session a(ref, chunked()), b(ref, chunked());
    a.feed(pa);
    b.feed(pb);
    for (const int32_t t : next) {
      ref_a.push_back(copy(a.feed({&t, 1})));
      ref_b.push_back(copy(b.feed({&t, 1})));
    }
  }
  Engine gpu(device_options("stories260K", be));
  const int64_t nl = gpu.config().n_layer, kvd = gpu.config().kv_dim();
  const MemoryLedger loaded = be->ledger(MemoryPlace::kDevice);
  const int64_t host0 = gpu.ledger().total();
  {
    Session a(gpu, chunked()), b(gpu, chunked());
    a.feed(pa);
    b.feed(pb);
    const Footprint f = gpu.footprint();
    ASSERT_GT(f.device->kv, 0u);
    const MemoryLedger held = be->ledger(MemoryPlace::kDevice);
    const int64_t host_held = gpu.ledger().total();
    const EvictReport r = gpu.evict(UINT64_MAX);
    EXPECT_EQ(r.freed, held.buffer_bytes - be->ledger(MemoryPlace::kDevice).buffer_bytes);
    EXPECT_GE(r.freed, f.device->weights() + f.device->kv) << "the device's bytes fall by the weights' and the KV's";
    EXPECT_EQ(gpu.footprint().device->kv, 0u);
    EXPECT_EQ(gpu.device()->n_parked(), 2);
    const uint64_t rows = static_cast<uint64_t>(2 * nl * (pa.size() + pb.size()) * kvd) * 2;
    EXPECT_EQ(gpu.footprint().device->kv_parked, rows);
    EXPECT_EQ(gpu.ledger().total() - host_held, static_cast<int64_t>(rows)) << "the host holds the rows, exactly";
    EXPECT_EQ(gpu.footprint().kv_parked, rows);
    EXPECT_EQ(static_cast<int64_t>(gpu.footprint().total()) - static_cast<int64_t>(f.total()),
              gpu.ledger().total() - host_held) << "the host footprint counts them";
    EXPECT_NE(r.note.find("2 sessions"), std::string::npos) << r.note;
    // a's next step: its KV goes up, b's stays parked.
    EXPECT_LE(nmse(a.feed({&next[0], 1}), ref_a[0]), 1e-12);
    EXPECT_EQ(gpu.device()->n_parked(), 1);
    EXPECT_EQ(a.tokens_run(), static_cast<int64_t>(pa.size()) + 1) << "nothing recomputed";
    for (size_t i = 0; i < next.size(); ++i) EXPECT_LE(nmse(b.feed({&next[i], 1}), ref_b[i]), 1e-12) << i;
    EXPECT_EQ(gpu.device()->n_parked(), 0);
    for (size_t i = 1; i < next.size(); ++i) EXPECT_LE(nmse(a.feed({&next[i], 1}), ref_a[i]), 1e-12) << i;
    // Parked again: a fork and a save read the KV back first.
    gpu.evict(UINT64_MAX);
    EXPECT_EQ(gpu.device()->n_parked(), 2);
    Session c(gpu, chunked());
    c.fork_from(a, static_cast<int64_t>(pa.size()));
    EXPECT_LE(nmse(c.feed(next), ref_a.back()), 1e-12);
    b.save(dir.file("b.ebbs"));
    EXPECT_EQ(gpu.device()->n_parked(), 0);
    Session d(gpu);
    d.load(dir.file("b.ebbs"));
    EXPECT_EQ(d.n_processed(), b.n_processed());
    // Parked sessions that go away take their host rows with them.
    gpu.evict(UINT64_MAX);
  }
  EXPECT_EQ(gpu.device()->n_parked(), 0);
  EXPECT_EQ(gpu.footprint().device->kv_parked, 0u);
  gpu.restore();
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, loaded.buffer_bytes);
  EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, loaded.n_buffers);
  EXPECT_EQ(gpu.ledger().total(), host0);
}

// Every device byte comes back: sessions that published, reused, forked,
// saved and loaded, then the engine, leave the device's ledgers (device and
// host-visible memory) where they were.
TEST(VulkanKv, TheLedgerIsBackToItsStartAfterTheSessionsGo) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vkkv");
  const MemoryLedger dev0 = be->ledger(MemoryPlace::kDevice), host0 = be->ledger(MemoryPlace::kHost);
  const std::vector<int32_t> all = long_tokens();
  const std::vector<int32_t> toks(all.begin(), all.begin() + 13);
  {
    Engine gpu(device_options("stories260K", be, true));
    const MemoryLedger loaded = be->ledger(MemoryPlace::kDevice);
    {
      Session a(gpu, chunked()), b(gpu, chunked()), c(gpu, chunked());
      a.feed(toks);
      b.feed(toks);
      EXPECT_EQ(b.reused_tokens(), 12);
      c.fork_from(b, 10);
      c.save(dir.file("c.ebbs"));
      a.load(dir.file("c.ebbs"));
      EXPECT_GT(gpu.footprint().device->kv, 0u);
    }
    EXPECT_EQ(gpu.footprint().device->kv, 0u);
    EXPECT_EQ(be->ledger(MemoryPlace::kDevice).buffer_bytes, loaded.buffer_bytes);
    EXPECT_EQ(be->ledger(MemoryPlace::kDevice).n_buffers, loaded.n_buffers);
  }
  const MemoryLedger dev1 = be->ledger(MemoryPlace::kDevice), host1 = be->ledger(MemoryPlace::kHost);
  EXPECT_EQ(dev1.buffer_bytes, dev0.buffer_bytes);
  EXPECT_EQ(dev1.n_buffers, dev0.n_buffers);
  EXPECT_EQ(dev1.slab_bytes, dev0.slab_bytes);
  EXPECT_EQ(host1.buffer_bytes, host0.buffer_bytes);
  EXPECT_EQ(host1.n_buffers, host0.n_buffers);
}

// The command line: `ebb chat` saves a session on the device and loads it
// on the CPU and the reverse (the next turn's text is the same either way),
// and `--prefix-cache` / `--cache-dir` run on a device.
TEST(VulkanKvCli, ChatSaveAndLoadAcrossDevicesAndThePrefixCache) {
  EBB_REQUIRE_VULKAN(be);
  test::TempDir dir("ebb-vkkv");
  const std::string m = "chat -m " + test::model_path("stories260K.gguf") + " --temp 0 -n 8 --threads 1 --quiet";
  const std::string dev = " --device vulkan";
  const test::CliResult sg = test::run_cli(m + dev, "Lily and the cat\n/save " + dir.file("g.bin") + "\n");
  ASSERT_EQ(sg.status, 0) << sg.err;
  const test::CliResult sc = test::run_cli(m, "Lily and the cat\n/save " + dir.file("c.bin") + "\n");
  ASSERT_EQ(sc.status, 0) << sc.err;
  EXPECT_EQ(sg.out, sc.out);
  for (const char* f : {"g.bin", "c.bin"}) {
    const std::string turn = "/load " + dir.file(f) + "\nThe dog\n";
    const test::CliResult on_cpu = test::run_cli(m, turn);
    const test::CliResult on_dev = test::run_cli(m + dev, turn);
    ASSERT_EQ(on_cpu.status, 0) << f << ": " << on_cpu.err;
    ASSERT_EQ(on_dev.status, 0) << f << ": " << on_dev.err;
    EXPECT_FALSE(on_cpu.out.empty()) << f;
    EXPECT_EQ(on_dev.out, on_cpu.out) << f;
  }
  // The prompt's whole chunks of 4 go to the directory in the first run and
  // come back in the second, which runs only the rest (the summary line's
  // "prompt N tok" counts the tokens run).
  const std::string run = "run -m " + test::model_path("stories260K.gguf") +
                          " -p 'Once upon a time there was a little girl named Lily' --temp 0 -n 4 --threads 1 ";
  const test::CliResult cpu = test::run_cli(run);
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  auto prompt_run = [](const std::string& err) {
    const size_t at = err.find("| prompt ");
    return at == std::string::npos ? -1 : std::stoi(err.substr(at + 9));
  };
  std::vector<int> ran;
  for (int i = 0; i < 2; ++i) {
    const test::CliResult r = test::run_cli(run + "--device vulkan --kv-chunk 4 --cache-dir " + dir.file("kv"));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, cpu.out);
    ran.push_back(prompt_run(r.err));
  }
  EXPECT_GT(ran[0], 8);
  EXPECT_EQ(ran[1], ran[0] - (ran[0] - 1) / 4 * 4) << "the second run takes the whole chunks from the directory";
}

}  // namespace
}  // namespace ebb
