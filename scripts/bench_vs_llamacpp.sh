#!/usr/bin/env bash
# ebb against llama.cpp on the same GGUF files, in the same run, on this
# machine: the baseline issue 3's targets are set against ("about 10% above
# what a leading C++ engine reaches here").
#
#   bash scripts/bench_vs_llamacpp.sh [-t THREADS] [-r REPS] MODEL.gguf...
#
# llama.cpp is not a dependency of ebb and is never built by the tests. This
# script fetches its source the one way this project's machines allow: the
# npm package node-llama-cpp carries llama.cpp's source as a git bundle
# (llama/gitRelease.bundle). It builds only llama-bench (-DGGML_NATIVE=ON,
# about 10 minutes on 2 cores) under $EBB_LLAMACPP_DIR (default
# ~/.cache/ebb/llama.cpp-<version>) and reuses it afterwards. Needs node/npm,
# git and python3; ebb is built in build/ with the README's command.
#
# Per file: ebb bench speed (-p 512 -n 128), whose decode runs at context
# 512-640, then llama-bench pp512 and tg128 from an empty cache and tg128 at
# depth 512, the same context as ebb's decode. One table row and one JSON
# line per file; ratios are ebb / llama.cpp.
set -euo pipefail
cd "$(dirname "$0")/.."

threads=2 reps=3
while getopts "t:r:" o; do
  case $o in
    t) threads=$OPTARG ;;
    r) reps=$OPTARG ;;
    *) echo "usage: $0 [-t THREADS] [-r REPS] MODEL.gguf..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
(($#)) || { echo "usage: $0 [-t THREADS] [-r REPS] MODEL.gguf..." >&2; exit 2; }

nlc_version=3.22.1
dir=${EBB_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ebb/llama.cpp-nlc$nlc_version}
bench=$dir/src/build/bin/llama-bench
if [ ! -x "$bench" ]; then
  echo "bench_vs_llamacpp: building llama-bench in $dir (once)" >&2
  mkdir -p "$dir/npm"
  (cd "$dir/npm" && npm init -y >/dev/null && npm install --ignore-scripts "node-llama-cpp@$nlc_version" >/dev/null)
  rm -rf "$dir/src"
  git clone -q "$dir/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$dir/src"
  cmake -S "$dir/src" -B "$dir/src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  cmake --build "$dir/src/build" --target llama-bench -j"$(nproc)" >/dev/null
fi
[ -x build/ebb ] || { echo "bench_vs_llamacpp: build/ebb missing; build ebb first (README)" >&2; exit 1; }
commit=$(git -C "$dir/src" log -1 --format=%h)

rows=()
for m in "$@"; do
  e=$(build/ebb bench speed -m "$m" -p 512 -n 128 --reps "$reps" -t "$threads" --json 2>/dev/null)
  l=$("$bench" -m "$m" -p 512 -n 128 -r "$reps" -t "$threads" -o jsonl 2>/dev/null)
  d=$("$bench" -m "$m" -p 0 -n 128 -d 512 -r "$reps" -t "$threads" -o jsonl 2>/dev/null)
  rows+=("$(python3 - "$m" "$e" "$l" "$d" <<'EOF'
import json, os, sys
m, e, l, d = sys.argv[1], json.loads(sys.argv[2]), [json.loads(x) for x in sys.argv[3].splitlines()], [json.loads(x) for x in sys.argv[4].splitlines()]
pp = next(x["avg_ts"] for x in l if x["n_prompt"] > 0)
tg0 = next(x["avg_ts"] for x in l if x["n_gen"] > 0)
tg512 = d[0]["avg_ts"]
print(json.dumps({"model": os.path.basename(m), "ebb_prefill_tok_s": round(e["prefill_tok_s"], 1),
                  "llama_pp512_tok_s": round(pp, 1), "ebb_decode_tok_s": round(e["decode_tok_s"], 1),
                  "llama_tg128_d512_tok_s": round(tg512, 1), "llama_tg128_tok_s": round(tg0, 1),
                  "prefill_ratio": round(e["prefill_tok_s"] / pp, 2), "decode_ratio": round(e["decode_tok_s"] / tg512, 2),
                  "mem_bw_gbps": round(e["mem_bw_gbps"], 1)}))
EOF
)")
done

echo "ebb $(git rev-parse --short HEAD) vs llama.cpp $commit (node-llama-cpp $nlc_version), $threads threads, $reps reps"
printf '%-22s %9s %9s %6s %9s %10s %6s %9s %7s\n' model ebb_pp llama_pp ratio ebb_tg llama_tg@512 ratio llama_tg0 bw_GB/s
for r in "${rows[@]}"; do
  python3 -c '
import json, sys
r = json.loads(sys.argv[1])
print("%-22s %9.1f %9.1f %6.2f %9.1f %10.1f %6.2f %9.1f %7.1f" % (r["model"], r["ebb_prefill_tok_s"], r["llama_pp512_tok_s"],
      r["prefill_ratio"], r["ebb_decode_tok_s"], r["llama_tg128_d512_tok_s"], r["decode_ratio"], r["llama_tg128_tok_s"], r["mem_bw_gbps"]))' "$r"
done
printf '%s\n' "${rows[@]}"
