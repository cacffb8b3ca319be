#!/usr/bin/env bash
# Builds ebb and runs every test: the release suite through CTest, the C API
# installed into a temporary prefix and used from C (scripts/test_install.sh) and
# docs/c-api.md's and the README's commands run as written (test_c_api_doc.sh, check_readme.sh), the kernel
# tests cross-built for aarch64 under qemu-user (EBB_SKIP_ARM=1 skips them),
# then the GGUF mutation test again under AddressSanitizer + UBSan, the
# libFuzzer targets of the request and template parsers (EBB_SKIP_FUZZ=1
# skips), then the elastic and streaming fault tests under ThreadSanitizer
# (EBB_SKIP_TSAN=1 skips).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
# Each job's wall time, so a slow CI run says where its minutes went.
t0=$SECONDS
lap() { echo "== $1: $((SECONDS - t0)) s =="; t0=$SECONDS; }

# With the Vulkan backend, whose tests (test_vulkan_*) run on lavapipe
# (mesa-vulkan-drivers, from setup.sh): EBB_TEST_REQUIRE_VULKAN makes them
# fail, not skip, when no Vulkan device is found.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEBB_VULKAN=ON >/dev/null
cmake --build build -j"$jobs"
lap "release build"
EBB_TEST_REQUIRE_VULKAN=1 ctest --test-dir build --output-on-failure -j"$jobs"
lap "release tests"

echo "== install job: the C example built against an installed copy (pkg-config, find_package) =="
bash scripts/test_install.sh build
echo "== install job: docs/c-api.md's commands, as written =="
bash scripts/test_c_api_doc.sh
echo "== install job: the README's commands, as written (stories260K for the downloaded model) =="
bash scripts/check_readme.sh > /tmp/ebb-check-readme.log 2>&1 || { tail -n 40 /tmp/ebb-check-readme.log; exit 1; }
tail -n 1 /tmp/ebb-check-readme.log
lap "install job"

if [ "${EBB_SKIP_ARM:-0}" != 1 ]; then
  echo "== Arm job: kernels cross-built for aarch64, tests under qemu-user (neon and scalar) =="
  bash scripts/test_arm.sh
  lap "Arm job"
fi

if [ "${EBB_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== sanitizer job: GGUF reader and mutation test under ASan + UBSan =="
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEBB_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs" --target test_gguf
  ctest --test-dir build-asan --output-on-failure -R 'Gguf' -j"$jobs"
  lap "sanitizer job"
fi

if [ "${EBB_SKIP_FUZZ:-0}" != 1 ]; then
  # The parsers of untrusted input (HTTP requests and their JSON, chat
  # templates) under libFuzzer with ASan + UBSan, a bounded time each.
  echo "== fuzz job: libFuzzer targets in tests/fuzz/, ${FUZZ_SECONDS:-45} s each =="
  FUZZ_SECONDS="${FUZZ_SECONDS:-45}" bash scripts/fuzz.sh
  bash scripts/fuzz_jinja.sh "${FUZZ_SECONDS:-45}" 2>&1 | tail -n 12
  lap "fuzz job"
fi

if [ "${EBB_SKIP_TSAN:-0}" != 1 ]; then
  # The restore's I/O and decompression threads, the I/O engine's reaper and
  # the streaming windows run beside the forward pass: their tests run under
  # ThreadSanitizer. The filter keeps the job to a few minutes on 2 cores.
  echo "== ThreadSanitizer job: elastic restore and weight streaming =="
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEBB_TSAN=ON >/dev/null
  cmake --build build-tsan -j"$jobs" --target test_elastic test_budget test_swap test_kv_pool
  # The fault and streaming tests: restores with a corrupt swap slot or blob
  # (I/O and decompression threads both marking chunks lost), failed and
  # re-read streamed reads, weights changed under a stream, KV re-planning,
  # and chunks shared by sessions evicted and restored once (KvPool).
  # The slow exactness sweeps stay in the release job. A chunk a restore
  # loses is marked by an atomic flag on its pool entry (it was a racy
  # read-min-write of KvCache::lost_from_ from both restore threads).
  tsan_filter='BudgetStreaming|BudgetKv|SwapFileTest|CompressedStackTest|ElasticTest\.(Corrupt|FailedStreamed|StreamedLayer|OverTheMemoryLimit)|KvPool'
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R "$tsan_filter"
  lap "ThreadSanitizer job"
fi
