#!/usr/bin/env bash
# Runs the README's command blocks as written, in a temporary directory,
# with M set to stories260K instead of a downloaded model (the set-up
# commands and the download are left out). Needs build/ebb, build/npm (both
# from scripts/run.sh) and port 8080 free. Exit status 0 when every command
# succeeded.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$root/build" "$work/build"
python3 - "$root/README.md" > "$work/readme.sh" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
print("set -e")
for block in re.findall(r"```sh\n(.*?)```", text, re.S):
    if "scripts/run.sh" in block or "curl -L -O" in block:
        continue
    print(block)
PY
cd "$work"
export M="$root/../shared/models/stories260K.gguf"
bash ./readme.sh </dev/null
echo "check_readme: every README command ran"
