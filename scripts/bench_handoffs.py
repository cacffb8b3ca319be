#!/usr/bin/env python3
"""What a handoff saves the target agent's request in ebb serve (docs/agents.md).

  scripts/bench_handoffs.py -m qwen3-q4_0.gguf [-n 6] [--prefix-words 600] [-t 2] [--json]

One `ebb serve` (its defaults: prefix cache on, KV chunks of 256 at this
context), 2n fresh agents (each its own namespace, so nothing is shared
between them). For pair i, in alternating order:
  with      POST /v1/handoffs {"prompt": PREFIX} to agent h_i, wait until its
            pre-prefill task has ended (GET /v1/handoffs), then the agent's
            /v1/completions request of PREFIX + SUFFIX, max_tokens 1
  without   agent c_i's same request, no handoff
The request's time with max_tokens 1 is its TTFT (prefill and one token)
seen by the client. Prints medians of both, their ratio, the cached tokens,
the background seconds each handoff's task took (stats.busy_s), and the
bound: with the prefix cached only the rest of the prompt is prefilled, so
the ratio cannot go below (prompt - cached) / prompt for a prefill-bound
TTFT. A table, or one JSON object with --json.
"""
import argparse
import json
import os
import statistics
import sys
import time

WORDS = ("the order of the customer was shipped late so the agent checks the refund policy and the tool looks up "
         "the status of each item in the warehouse before the critic reviews the plan").split()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ebb_server import Server as BaseServer  # noqa: E402


class Server(BaseServer):
    def __init__(self, ebb, model, threads, ctx):
        super().__init__(ebb, model, threads, ["--ctx", str(ctx)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-n", type=int, default=6, help="pairs (with, without)")
    ap.add_argument("--prefix-words", type=int, default=600)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--ebb", default=os.path.join(os.path.dirname(__file__), "..", "build", "ebb"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    prefix = " ".join(WORDS[i % len(WORDS)] for i in range(a.prefix_words))
    suffix = " Now the tool agent answers the next question about the order."
    s = Server(a.ebb, a.model, a.threads, a.ctx)
    try:
        with_s, without_s, busy, cached, prompt, fill = [], [], [], [], [], []

        def request(agent):
            t0 = time.perf_counter()
            r = s.call("POST", "/v1/completions",
                       {"agent": agent, "prompt": prefix + suffix, "max_tokens": 1, "temperature": 0})
            return time.perf_counter() - t0, r["usage"]

        for i in range(a.n):
            for name in (f"h{i}", f"c{i}"):
                s.call("POST", "/v1/agents", {"name": name})
            for kind in (("with", "without") if i % 2 == 0 else ("without", "with")):
                if kind == "without":
                    dt, u = request(f"c{i}")
                    without_s.append(dt)
                    continue
                before = s.call("GET", "/v1/handoffs")["stats"]
                h = s.call("POST", "/v1/handoffs", {"source": "planner", "targets": [f"h{i}"], "prompt": prefix})
                fill.append(h["targets"][0]["prefill_tokens"])
                end = time.time() + 300
                while True:
                    st = s.call("GET", "/v1/handoffs")["stats"]
                    if st["tasks_running"] == 0 and st["tasks_submitted"] > before["tasks_submitted"]:
                        break
                    if time.time() > end:
                        sys.exit("the pre-prefill task did not end within 300 s")
                    time.sleep(0.01)
                busy.append(st["busy_s"] - before["busy_s"])
                dt, u = request(f"h{i}")
                with_s.append(dt)
                cached.append(u["prompt_tokens_details"]["cached_tokens"])
                prompt.append(u["prompt_tokens"])
    finally:
        s.stop()

    med = statistics.median
    out = {
        "model": os.path.basename(a.model), "threads": a.threads, "pairs": a.n,
        "prompt_tokens": med(prompt), "prefill_tokens": med(fill), "cached_tokens": med(cached),
        "ttft_without_s": med(without_s), "ttft_with_s": med(with_s),
        "ratio": med(with_s) / med(without_s),
        "bound_ratio": (med(prompt) - med(cached)) / med(prompt),
        "preprefill_busy_s": med(busy),
    }
    if a.json:
        print(json.dumps(out))
        return
    print(f"{out['model']}, {a.threads} threads, {a.n} pairs; prompt {out['prompt_tokens']} tokens, "
          f"handoff prefix {out['prefill_tokens']} in whole chunks, cached {out['cached_tokens']}")
    print(f"{'':28}{'median':>10}")
    print(f"{'TTFT without handoff (s)':28}{out['ttft_without_s']:>10.4f}")
    print(f"{'TTFT with handoff (s)':28}{out['ttft_with_s']:>10.4f}")
    print(f"{'ratio (bound)':28}{out['ratio']:>10.3f}  ({out['bound_ratio']:.3f}: only the uncached rest prefilled)")
    print(f"{'pre-prefill task (s)':28}{out['preprefill_busy_s']:>10.4f}  (background, before the request)")


if __name__ == "__main__":
    main()
