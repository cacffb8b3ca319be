#!/usr/bin/env bash
# Installs ebb from a build tree into a temporary prefix and builds the C
# example (examples/c/stream_story.c) against the installed copy twice, with
# the C compiler only: once with pkg-config, once as a C-only CMake project
# with find_package(ebb). Runs both on stories260K (with a LoRA adapter) for
# a few tokens and checks they print the same story as the example built in
# the tree.
#
#   scripts/test_install.sh [BUILD_DIR]    (default: build, already built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
src=$(pwd)
model=$(realpath "$src/../shared/models/stories260K.gguf")
cc=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ebb-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

fail() {
  echo "test_install: $*" >&2
  exit 1
}

cmake --install "$build" --prefix "$prefix" >/dev/null

# The public header and nothing else of the sources' headers.
headers=$(cd "$prefix/include" && find . -type f | sort)
[ "$headers" = "./ebb/ebb.h" ] || fail "installed headers are not only ebb/ebb.h: $headers"
pc=$(find "$prefix" -name ebb.pc)
[ -n "$pc" ] || fail "no ebb.pc installed"
[ -f "$(dirname "$pc")/../cmake/ebb/ebbConfig.cmake" ] || fail "no ebbConfig.cmake beside the library"
[ -f "$(dirname "$pc")/../cmake/ebb/ebbConfigVersion.cmake" ] || fail "no ebbConfigVersion.cmake"
lib=$(find "$prefix" -name 'libebb.so.*.*.*')
[ -n "$lib" ] || fail "no libebb.so installed"
# Only the C API leaves the library.
others=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^ebb_' | grep -v '^$' || true)
[ -z "$others" ] || fail "libebb.so exports symbols outside the C API: $(echo "$others" | head -5)"

# With a LoRA adapter, so that the adapter calls go through the installed library too.
adapter=$(realpath "$src/../shared/golden/lora/stories260K.lora-r4.gguf")
args=("$model" "Once upon a time" 16 42 "$adapter" 0.8)
"$build/stream_story" "${args[@]}" >"$tmp/want.txt" 2>/dev/null || fail "the in-tree example failed"
grep -q . "$tmp/want.txt" || fail "the in-tree example printed nothing"

echo "== C example against the installed library: pkg-config =="
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
libdir=$(pkg-config --variable=libdir ebb)
# shellcheck disable=SC2046  # pkg-config's flags are separate words
"$cc" -std=c99 -Wall -Wextra -Wpedantic -Werror examples/c/stream_story.c -o "$tmp/story_pc" \
  $(pkg-config --cflags --libs ebb) -Wl,-rpath,"$libdir"
"$tmp/story_pc" "${args[@]}" >"$tmp/pc.txt"
cmp -s "$tmp/want.txt" "$tmp/pc.txt" || fail "the pkg-config build printed another story: $(head -c 200 "$tmp/pc.txt")"
head -c 200 "$tmp/pc.txt"; echo

echo "== C example against the installed library: CMake find_package(ebb) =="
mkdir "$tmp/consumer"
cp examples/c/stream_story.c "$tmp/consumer/"
cat >"$tmp/consumer/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(story LANGUAGES C)
find_package(ebb 0.1 REQUIRED)
add_executable(stream_story stream_story.c)
set_target_properties(stream_story PROPERTIES C_STANDARD 99 C_EXTENSIONS OFF)
target_link_libraries(stream_story PRIVATE ebb::ebb)
EOF
CC="$cc" cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/consumer/build" >/dev/null
"$tmp/consumer/build/stream_story" "${args[@]}" >"$tmp/cmake.txt"
cmp -s "$tmp/want.txt" "$tmp/cmake.txt" || fail "the find_package build printed another story"
echo "test_install: ok (pkg-config and find_package builds print the in-tree story)"
