#!/usr/bin/env bash
# Builds each libFuzzer target in tests/fuzz/ (clang, -fsanitize=fuzzer with
# ASan and UBSan) and runs it for a bounded time: FUZZ_SECONDS each (default
# 60), from a seed corpus in tests/fuzz/corpus/NAME/ when there is one.
# A target names its sources in a "// fuzz-sources:" line (globs allowed);
# the rest of the library comes from the release build's libebb.a (BUILD,
# default build/, built by scripts/test.sh before this runs).
# Usage: bash scripts/fuzz.sh [NAME...]   (NAME: fuzz_request, fuzz_jinja, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${EBB_BUILD_DIR:-build}"
secs="${FUZZ_SECONDS:-60}"
out="$build/fuzz"
mkdir -p "$out"
targets=("$@")
if ((${#targets[@]} == 0)); then
  # Targets with a script of their own (scripts/NAME.sh) are run by it.
  for f in tests/fuzz/fuzz_*.cpp; do
    grep -q '^// fuzz-sources:' "$f" && targets+=("$(basename "$f" .cpp)")
  done
fi
for t in "${targets[@]}"; do
  src="tests/fuzz/$t.cpp"
  sources=$(sed -n 's#^// fuzz-sources: ##p' "$src")
  files=()
  for g in $sources; do for f in $g; do [ -f "$f" ] && files+=("$f"); done; done
  echo "== $t: building (${files[*]}) =="
  clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Isrc -DPCRE2_CODE_UNIT_WIDTH=8 "$src" "${files[@]}" "$build/libebb.a" \
    $(pkg-config --libs libpcre2-8 liburing libzstd liblz4) -pthread -o "$out/$t"
  corpus="$out/corpus-$t"
  mkdir -p "$corpus"
  [ -d "tests/fuzz/corpus/$t" ] && cp -n tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  echo "== $t: fuzzing for $secs s =="
  "$out/$t" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=10 -print_final_stats=1 "$corpus" \
    2>&1 | tail -n 12
done
