#!/usr/bin/env bash
# Runs docs/c-api.md's install-and-run code block exactly as written, from the
# repository root, with HOME set to a temporary directory (the block installs
# to ~/.local), in a fresh shell without PKG_CONFIG_PATH or LD_LIBRARY_PATH.
# Checks that it succeeds and that the example prints a story.
#
#   scripts/test_c_api_doc.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ebb-c-api-doc.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "test_c_api_doc: $*" >&2
  exit 1
}

# The first ```sh block after the marker line that names this script.
awk '/scripts\/test_c_api_doc.sh runs the next code block/ { armed = 1; next }
     armed && /^```sh/ { inside = 1; next }
     inside && /^```/ { exit }
     inside { print }' docs/c-api.md >"$tmp/block.sh"
grep -q 'cmake --install' "$tmp/block.sh" || fail "no install block found in docs/c-api.md"
echo "== docs/c-api.md's block =="
cat "$tmp/block.sh"

mkdir "$tmp/home"
env -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH HOME="$tmp/home" bash -euo pipefail "$tmp/block.sh" >"$tmp/out.txt" 2>"$tmp/err.txt" ||
  fail "the block failed: $(tail -5 "$tmp/err.txt")"
[ -x "$tmp/home/.local/lib/libebb.so.0" ] || [ -e "$tmp/home/.local/lib/libebb.so.0" ] ||
  fail "libebb.so.0 is not in ~/.local/lib"
[ -f ./story ] || fail "the block built no ./story"
# The example's story: its last line of output is the story ./story printed.
out=$(env -u LD_LIBRARY_PATH ./story ../shared/models/stories260K.gguf "Once upon a time" 16 2>/dev/null) ||
  fail "./story does not run on its own (libebb.so.0 not found?)"
rm -f ./story
[ -n "$out" ] || fail "./story printed nothing"
echo "test_c_api_doc: ok ($(printf %s "$out" | head -c 80)...)"
