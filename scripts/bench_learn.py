#!/usr/bin/env python3
"""What ebb serve's online learning loop costs the foreground (docs/agents.md).

  scripts/bench_learn.py ttft   -m stories260K.gguf [-n 60]
      Foreground TTFT of an agent's streamed stories on a server without
      --learn, then on one with --learn whose user corrects every story
      ("call her Zorba, not Lily"; a story without Lily gets a reward, +1
      with Zorba, else -1), so learning rounds (training phases on the
      scheduler, gates, publishes) run between and during the requests.
      Requests arrive every 30-80 ms (random, seeded). Prints p50/p95 per
      server and the ratio (target: p95 with learning <= 1.5x without).

  scripts/bench_learn.py decode -m qwen3-q4_0.gguf [-n 20]
      Decode tok/s of the same requests (ignore_eos, --max-tokens each) of
      three agents of one `ebb serve --learn`: one not learning, one learning
      without feedback (every turn a trace), one learning with feedback
      (every turn a trace, every answer a reward); no round starts
      (--learn-min-samples is out of reach). Requests go one at a time, the
      three in a rotating order. Prints medians, the costs of traces and of
      traces + feedback against the non-learning agent (target <= 2%,
      bound 0), and the CPU seconds of the server's threads meanwhile.

Both print a table and, with --json, one JSON object. One machine, one run:
the ratios compare servers measured in the same run.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ebb_server import Server as BaseServer  # noqa: E402


class Server(BaseServer):
    def __init__(self, ebb, model, extra, threads):
        super().__init__(ebb, model, threads, extra, timeout=120)

    def stream(self, body):
        """(ttft_s, decode tok/s, id, text) of a streamed completion."""
        body = dict(body, stream=True)
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", json.dumps(body), self.headers())
        r = c.getresponse()
        if r.status != 200:
            sys.exit(f"POST /v1/completions: {r.status} {r.read()[:300]!r}")
        first = last = None
        chunks = 0
        text, rid = "", None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            rid = j.get("id", rid)
            piece = j["choices"][0].get("text", "") if j.get("choices") else ""
            if piece:
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
                text += piece
        c.close()
        ttft = (first or time.perf_counter()) - t0
        rate = (chunks - 1) / (last - first) if chunks > 1 and last > first else 0.0
        return ttft, rate, rid, text


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def ttft(a):
    rng = random.Random(a.seed)
    gaps = [rng.uniform(0.03, 0.08) for _ in range(a.n)]
    out = {}
    for learn in (False, True):
        state = tempfile.mkdtemp(prefix="ebb-bench-learn-")
        extra = ["--state-dir", state] + (["--learn", "--learn-min-samples", "2", "--learn-steps", "64",
                                           "--commit-every", "16", "--learn-phase-seconds", str(a.phase_seconds)]
                                          + a.learn_arg if learn else [])
        s = Server(a.ebb, a.model, extra, a.threads)
        s.call("POST", "/v1/agents", {"name": "teller", "adapter": "names", "learn": True})
        t, fb = [], 0
        for i in range(a.n):
            x, _, rid, text = s.stream({"model": "base:agent/teller", "prompt": "Once upon a time", "max_tokens": 32,
                                        "seed": 1 + i})
            t.append(x)
            if learn:  # a correction where it applies, else a reward: rounds keep coming
                s.call("POST", "/v1/feedback", {"id": rid, "correction": "call her Zorba, not Lily"} if "Lily" in text
                       else {"id": rid, "reward": 1.0 if "Zorba" in text else -1.0})
                fb += 1
            time.sleep(gaps[i])
        l = s.call("GET", "/v1/learning")
        if learn:
            print("learning:", json.dumps(l["agents"]), file=sys.stderr)
        s.stop()
        out["learn" if learn else "base"] = {"ttft_p50_s": statistics.median(t), "ttft_p95_s": pct(t, 0.95),
                                             "requests": a.n, "feedback": fb, "train_steps": l["train_steps"],
                                             "committed": l["committed_versions"],
                                             "published": l["published_versions"]}
    out["ratio_p95"] = out["learn"]["ttft_p95_s"] / out["base"]["ttft_p95_s"]
    print(f"{'server':8} {'ttft p50 ms':>12} {'ttft p95 ms':>12} {'feedback':>9} {'steps':>6} {'commits':>8} {'publishes':>10}")
    for k in ("base", "learn"):
        r = out[k]
        print(f"{k:8} {r['ttft_p50_s']*1e3:12.2f} {r['ttft_p95_s']*1e3:12.2f} {r['feedback']:9d} {r['train_steps']:6d} "
              f"{r['committed']:8d} {r['published']:10d}")
    print(f"p95 ratio learn/base: {out['ratio_p95']:.2f} (target <= 1.5)")
    return out


def thread_cpu(pid):
    """CPU seconds of each of the process's threads, by thread name (Linux /proc)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for t in tasks:
        try:
            st = open(f"/proc/{pid}/task/{t}/stat").read()
        except FileNotFoundError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        f = st[st.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(f[11]) + int(f[12])) / tick
    return out


ARMS = ("none", "traces", "feedback")


def decode(a):
    # One server, three agents on the base model: "q" does not learn; "t"
    # learns without feedback (each turn a trace); "w" learns with feedback
    # (each turn a trace, each answer a reward). Requests go one at a time,
    # the three arms in a rotating order (ABC, BCA, CAB, ...), so all see
    # the same machine, memory and weights. No round starts
    # (--learn-min-samples out of reach): this measures recording and
    # feedback, not training.
    state = tempfile.mkdtemp(prefix="ebb-bench-learn-")
    s = Server(a.ebb, a.model, ["--state-dir", state, "--learn", "--learn-min-samples", "1000000"], a.threads)
    agent = {"none": "q", "traces": "t", "feedback": "w"}
    s.call("POST", "/v1/agents", {"name": "q"})
    s.call("POST", "/v1/agents", {"name": "t", "adapter": "t-ad", "learn": True})
    s.call("POST", "/v1/agents", {"name": "w", "adapter": "w-ad", "learn": True})
    rates = {k: [] for k in ARMS}
    body = {"prompt": "The quick brown fox", "max_tokens": a.max_tokens, "ignore_eos": True, "temperature": 0}
    for arm in ARMS:  # warm-up
        s.stream(dict(body, model="base:agent/" + agent[arm]))
    cpu0 = thread_cpu(s.p.pid)
    t0 = time.perf_counter()
    for i in range(a.n):
        for k in range(len(ARMS)):
            arm = ARMS[(i + k) % len(ARMS)]
            _, rate, rid, _ = s.stream(dict(body, model="base:agent/" + agent[arm]))
            rates[arm].append(rate)
            if arm == "feedback":
                s.call("POST", "/v1/feedback", {"id": rid, "reward": 1.0})
    wall = time.perf_counter() - t0
    cpu1 = thread_cpu(s.p.pid)
    l = s.call("GET", "/v1/learning")
    s.stop()
    cpu = {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1}
    med = {k: statistics.median(v) for k, v in rates.items()}
    out = {"decode_tok_s": med, "cost_traces": 1 - med["traces"] / med["none"],
           "cost_traces_feedback": 1 - med["feedback"] / med["none"],
           "cost_feedback_alone": 1 - med["feedback"] / med["traces"], "requests_per_arm": a.n,
           "max_tokens": a.max_tokens, "traces": l["traces"], "feedback": l["feedback"], "wall_s": wall,
           "thread_cpu_s": cpu, "load_avg": os.getloadavg()[0]}
    print(f"{'agent':28} {'decode tok/s (median)':>22} {'cost':>8}")
    print(f"{'not learning':28} {med['none']:22.2f}")
    print(f"{'learning, traces':28} {med['traces']:22.2f} {out['cost_traces']*100:7.2f}%")
    print(f"{'learning, traces + feedback':28} {med['feedback']:22.2f} {out['cost_traces_feedback']*100:7.2f}%")
    print(f"target <= 2% (bound 0); {l['traces']} traces, {l['feedback']} feedback; load average {out['load_avg']:.1f}")
    side = {k: v for k, v in cpu.items() if not (k.startswith("ebb-sched") or k.startswith("ebb-compute"))}
    print(f"CPU seconds over {wall:.1f} s: decode threads "
          f"{sum(v for k, v in cpu.items() if k not in side):.2f}; others " +
          ", ".join(f"{k} {v:.2f}" for k, v in sorted(side.items(), key=lambda x: -x[1]) if v > 0))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["ttft", "decode"])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--ebb", default="build/ebb")
    p.add_argument("-n", type=int, default=0, help="requests per server (ttft: 60) or per agent (decode: 20)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--phase-seconds", type=float, default=0.15, help="ttft: the server's --learn-phase-seconds")
    p.add_argument("--learn-arg", action="append", default=[], help="ttft: one more argument of the --learn server")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    a.n = a.n or (60 if a.what == "ttft" else 20)
    out = ttft(a) if a.what == "ttft" else decode(a)
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
