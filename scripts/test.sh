#!/usr/bin/env bash
# Builds ebb and runs every test: the release suite through CTest, the C API
# installed into a temporary prefix and used from C (scripts/test_install.sh), the kernel
# tests cross-built for aarch64 under qemu-user (EBB_SKIP_ARM=1 skips them),
# then the GGUF mutation test again under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== install job: the C example built against an installed copy (pkg-config, find_package) =="
bash scripts/test_install.sh build

if [ "${EBB_SKIP_ARM:-0}" != 1 ]; then
  echo "== Arm job: kernels cross-built for aarch64, tests under qemu-user (neon and scalar) =="
  bash scripts/test_arm.sh
fi

if [ "${EBB_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== sanitizer job: GGUF reader and mutation test under ASan + UBSan =="
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEBB_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs" --target test_gguf
  ctest --test-dir build-asan --output-on-failure -R 'Gguf' -j"$jobs"
fi
