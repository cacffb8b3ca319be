#!/usr/bin/env bash
# Installs every Debian 12 package that ebb's build, tests and benchmarks need.
# Idempotent: skips apt entirely when everything is already installed.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev nlohmann-json3-dev libcli11-dev
  liburing-dev libzstd-dev liblz4-dev libedit-dev libcpp-httplib-dev nodejs
  libsqlite3-dev  # ebb serve --learn: the traces database
  chromium  # test_serve_memory renders ebb serve's page at / headless
  g++-aarch64-linux-gnu qemu-user
  clang libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer targets with ASan + UBSan
  libvulkan-dev glslc  # the Vulkan backend (EBB_VULKAN): the loader and headers, GLSL -> SPIR-V
  mesa-vulkan-drivers  # lavapipe, a CPU Vulkan 1.3 driver: test_vulkan_* run on it where no GPU is
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The official OpenAI client, which test_serve drives `ebb serve` with, in
# the build tree (EBB_BUILD_DIR, default build/): BUILD/npm/node_modules/openai.
# npm comes with NodeSource's nodejs; Debian's nodejs needs Debian's npm.
build_dir="${EBB_BUILD_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build}"
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: installing npm" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq npm >/dev/null
fi
# And ajv, a JSON Schema validator, which the tool-call and structured-output
# tests check the server's output with.
if [ ! -f "$build_dir/npm/node_modules/openai/package.json" ] || [ ! -f "$build_dir/npm/node_modules/ajv/package.json" ]; then
  echo "setup: npm install --prefix $build_dir/npm openai ajv" >&2
  npm install --silent --no-audit --no-fund --prefix "$build_dir/npm" openai ajv >/dev/null
fi
