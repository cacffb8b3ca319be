#!/usr/bin/env bash
# Cross-builds the kernels and their tests for aarch64 (cross/, with Debian's
# g++-aarch64-linux-gnu, linked statically) and runs them under qemu-user:
#   -cpu max         has the dot product and fp16 extensions: the tests run
#                    every kernel on the neon target as well as scalar;
#   -cpu cortex-a53  armv8.0, without them: neon must be reported
#                    unsupported, and the scalar kernels still pass (the
#                    baseline code holds no armv8.2 instruction).
# Packages: g++-aarch64-linux-gnu qemu-user (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
for p in g++-aarch64-linux-gnu qemu-user; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    echo "test_arm: package $p is missing (apt-get install g++-aarch64-linux-gnu qemu-user)" >&2
    exit 1
  fi
done
jobs=$(nproc)
build=build-arm
start=$SECONDS

cmake -S cross -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" >/dev/null
# The log keeps the linker's notes on static glibc (getaddrinfo in gtest).
if ! cmake --build "$build" -j"$jobs" >"$build/build.log" 2>&1; then
  grep -E -B2 -A8 'error|Error' "$build/build.log" | head -n 80
  exit 1
fi
echo "test_arm: built in $((SECONDS - start)) s"

# The targets a binary sees, from the test names (scalar_F32, neon_Q4_K, ref_engine_Q6_K, ...).
targets() {
  qemu-aarch64 -cpu "$1" "$build/test_matmul" --gtest_list_tests --gtest_filter='All/MatmulProduct.DequantizeRow/*' |
    awk '/^  / { t = $1; sub(/.*\//, "", t); sub(/_(F32|F16|BF16|Q8_0|Q4_0|Q4_K|Q5_K|Q6_K|Q8_K)$/, "", t); if (!seen[t]++) printf "%s ", t }'
}
on_max=$(targets max)
on_a53=$(targets cortex-a53)
echo "test_arm: targets under -cpu max: $on_max; under -cpu cortex-a53: $on_a53"
[[ " $on_max" == *" neon "* ]] || { echo "test_arm: neon is not supported under -cpu max" >&2; exit 1; }
[[ " $on_a53" != *" neon "* ]] || { echo "test_arm: neon reported on a CPU without dotprod" >&2; exit 1; }

# One test binary under one CPU model (and an optional gtest filter); the
# log is printed when it fails.
run_one() {
  local cpu=$1 name=$2 filter=${3:-*} log="$build/$2.$1.log" t0=$SECONDS
  if qemu-aarch64 -cpu "$cpu" "$build/$name" --gtest_filter="$filter" >"$log" 2>&1; then
    echo "  ok   $name -cpu $cpu: $(grep -E '^\[  PASSED  \]' "$log" | sed 's/.*PASSED  \] //') ($((SECONDS - t0)) s)"
  else
    echo "  FAIL $name -cpu $cpu"
    tail -n 60 "$log"
    return 1
  fi
}
export -f run_one
export build

# Longest first, two at a time on two cores. test_attention is built but not
# run here: attention has no Arm code (the scalar kernels serve kNeon) and
# takes minutes under qemu. QuantModels (every matrix of the shared model
# files against their F16 copies, and the weight quantizers' quality) takes
# many minutes under emulation and tests no Arm-specific code beyond one
# product per matrix, which test_matmul and test_quant_lowbit cover on the
# neon target: it runs natively in the CTest suite.
status=0
printf '%s\n' "max test_quant -QuantModels.*" "max test_quant_lowbit" "max test_matmul" "max test_ops" \
  "max test_lora_kernels" "max test_train_ops" "max test_train_lora" "max test_thread_pool" "cortex-a53 test_matmul" "cortex-a53 test_ops" \
  "cortex-a53 test_quant_lowbit" "cortex-a53 test_lora_kernels" "cortex-a53 test_train_ops" \
  "cortex-a53 test_train_lora" |
  xargs -P "$jobs" -L 1 bash -c 'run_one "$0" "$1" "$2"' || status=1
echo "test_arm: $((SECONDS - start)) s in all"
exit $status
