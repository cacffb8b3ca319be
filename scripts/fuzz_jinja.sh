#!/usr/bin/env bash
# Fuzzes the Jinja engine (src/model/jinja/) with libFuzzer, AddressSanitizer
# and UBSan, starting from the golden chat templates:
#   bash scripts/fuzz_jinja.sh [SECONDS] [extra libFuzzer flags...]
# SECONDS defaults to 60. Needs Debian's clang and its runtime libraries
# (apt-get install clang libclang-rt-14-dev). The build and the corpus live
# in build-fuzz-jinja/; a crash leaves its input there as crash-* (rerun one
# with build-fuzz-jinja/fuzz_jinja FILE) and makes the script fail.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
out=build-fuzz-jinja
mkdir -p "$out/obj" "$out/corpus"
CXX="${CXX_FUZZ:-clang++}"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
       -fno-omit-frame-pointer -Isrc)
sources=(src/model/jinja/*.cpp src/model/chat_jinja.cpp src/platform/error.cpp)
objs=()
for s in "${sources[@]}"; do
  o="$out/obj/$(echo "$s" | tr / _).o"
  if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ -n "$(find src/model/jinja src/model/chat_jinja.h -name '*.h' -newer "$o")" ]; then
    "$CXX" "${flags[@]}" -c "$s" -o "$o" &
    while [ "$(jobs -r | wc -l)" -ge "$(nproc)" ]; do wait -n; done
  fi
  objs+=("$o")
done
wait
"$CXX" "${flags[@]}" -fsanitize=fuzzer tests/fuzz/fuzz_jinja.cpp "${objs[@]}" -o "$out/fuzz_jinja"

# Seeds: the golden templates. A dictionary of Jinja's tokens helps the
# mutator build syntax.
cp -n ../shared/golden/templates/*.jinja "$out/corpus/" 2>/dev/null || true
cat > "$out/jinja.dict" <<'DICT'
"{{"
"}}"
"{%"
"%}"
"{%-"
"-%}"
"{#"
"#}"
" if "
" elif "
" else "
" endif "
" for "
" in "
" endfor "
" set "
" endset "
" macro "
" endmacro "
" call "
" endcall "
" filter "
" endfilter "
" raw "
" endraw "
" break "
" continue "
" namespace("
" loop."
" is defined"
" is not none"
" | tojson"
" | map(attribute='x')"
" | selectattr("
" | join"
" | length"
" ~ "
" ** "
" // "
"messages"
"tools"
"range("
"caller()"
"raise_exception("
".items()"
".split("
DICT
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}" \
  "$out/fuzz_jinja" "$out/corpus" -dict="$out/jinja.dict" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$out/" -print_final_stats=1 "$@"
