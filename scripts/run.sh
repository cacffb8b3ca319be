#!/usr/bin/env bash
# Sets up, builds, and runs the main job: a short story from stories260K,
# streamed to stdout. Extra arguments go to `ebb run`. Builds the CLI and
# the C API's library (libebb.so), so `cmake --install build` works after it
# (docs/c-api.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target ebb_cli ebb_shared >/dev/null
exec build/ebb run -m ../shared/models/stories260K.gguf -p "Once upon a time" -n 120 "$@"
