#!/usr/bin/env python3
"""Disaggregated prefill against one server (a benchmark, not a test).

Runs the same load on three set-ups of the same machine, alternating, and prints medians:
  colocated: one `tandem serve --threads 2` computes prompts and decodes;
  chunked:   the same with `--max-num-batched-tokens` (--chunk-budget, 128): long prompts
             are cut into small chunks, each batched with the decode steps (the way to bound
             interference without a second instance);
  disagg:    `tandem serve --kv-producer --threads 1` pinned to CPU 0 computes prompts,
             `tandem serve --prefill-peer ... --threads 1` pinned to CPU 1 decodes (its
             prompts' KV blocks come from the first).
The load: --streams decode streams (~100-token prompts, --gen-len tokens each, streamed)
and, while they run, --long-count long prompts (--long-words words, --long-max-tokens out)
arriving every --long-interval seconds. Reported: the decode streams' inter-token latency p50/p99 and output tokens/s, the
long requests' time to first token, and, for disagg, what crossed between the two servers
(blocks, MB, seconds waiting on the peer) from their /metrics, and what one long prompt's
blocks cost through /v1/kv/prefill when the producer has them cached (export, HTTP, copies).

usage:
  bench/disagg.py --model M.gguf [--reps 2] [--streams 4] [--gen-len 192]
      [--long-words 700] [--long-count 8] [--long-interval 1.0] [--json]
Standard library only; loopback only; bounded in requests and time.
"""
import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_load  # noqa: E402  (the streaming client and percentiles)

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "target/release/tandem"


def serve(port, threads, cpus, extra):
    cmd = ["taskset", "-c", cpus, str(BINARY), "serve", "--port", str(port), "--threads",
           str(threads)] + extra
    print("# " + " ".join(cmd), file=sys.stderr)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tandem:kv_transfer_"):
            name = line.split("{")[0][len("tandem:kv_transfer_"):]
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


async def load(url, model, a, seed):
    """The decode streams from t = 0 and --long-count long prompts at t = 0.5 s, then every
    --long-interval seconds, each on its own connection: the same offered load on every
    set-up."""
    rng = random.Random(seed)
    streams = [serve_load.prompt_text(rng) for _ in range(a.streams)]
    longs = [serve_load.prompt_text(rng, a.long_words) for _ in range(a.long_count)]

    async def long_prompt(i, p):
        await asyncio.sleep(0.5 + i * a.long_interval)
        times, _ = await serve_load.one_request(url, model, p, a.long_max_tokens)
        return times[0]

    t0 = time.perf_counter()
    decoded, ttft = await asyncio.gather(
        asyncio.gather(*(serve_load.one_request(url, model, p, a.gen_len) for p in streams)),
        asyncio.gather(*(long_prompt(i, p) for i, p in enumerate(longs))))
    elapsed = time.perf_counter() - t0
    itl = [b - x for times, _ in decoded for x, b in zip(times, times[1:])]
    tokens = sum(len(times) for times, _ in decoded)
    pct = serve_load.percentile
    return {"itl_p50_ms": 1e3 * pct(itl, 50), "itl_p99_ms": 1e3 * pct(itl, 99),
            "decode_tok_per_s": tokens / elapsed, "long_ttft_p50_ms": 1e3 * pct(ttft, 50),
            "long_ttft_p99_ms": 1e3 * pct(ttft, 99), "seconds": elapsed}


def post_json(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read()


def transfer_cost(producer, a):
    """Seconds and bytes of one long prompt's blocks through POST /v1/kv/prefill when the
    producer has them cached already (its second answer: one token computed, the rest is
    export, HTTP and copying), and the first answer's seconds (the prefill itself too)."""
    text = serve_load.prompt_text(random.Random(99), a.long_words)
    ids = json.loads(post_json(producer, "/tokenize", {"prompt": text}))["tokens"]
    timings = []
    for _ in range(3):
        t = time.perf_counter()
        size = len(post_json(producer, "/v1/kv/prefill", {"prompt_token_ids": ids}))
        timings.append(time.perf_counter() - t)
    return {"prompt_tokens": len(ids), "payload_mb": size / 1e6, "cold_ms": 1e3 * timings[0],
            "cached_ms": 1e3 * min(timings[1:]),
            "cached_mb_per_s": size / 1e6 / min(timings[1:])}


def run_setup(kind, a, rep):
    procs = []
    try:
        if kind in ("colocated", "chunked"):
            budget = ["--max-num-batched-tokens", str(a.chunk_budget)] if kind == "chunked" else []
            procs.append(serve(a.port, 2, "0,1", ["--model", a.model] + budget))
            url = f"http://127.0.0.1:{a.port}"
        else:
            procs.append(serve(a.port + 1, 1, "0", ["--model", a.model, "--kv-producer"]))
            serve_load.wait_ready(f"http://127.0.0.1:{a.port + 1}", procs[0])
            peer = f"127.0.0.1:{a.port + 1}"
            procs.append(serve(a.port, 1, "1", ["--model", a.model, "--prefill-peer", peer]))
            url = f"http://127.0.0.1:{a.port}"
        serve_load.wait_ready(url, procs[-1])
        model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
        asyncio.run(serve_load.one_request(url, model, "warm up", 4))
        result = asyncio.run(load(url, model, a, rep))
        if kind == "disagg":
            m = metrics(url)
            result.update(blocks_received=m.get("blocks_received_total"),
                          mb_received=m.get("bytes_received_total", 0) / 1e6,
                          peer_wait_s=m.get("fetch_seconds_total"),
                          failures=m.get("failures_total"))
            result.update(transfer_cost(f"http://127.0.0.1:{a.port + 1}", a))
        return result
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="GGUF path or model name")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--gen-len", type=int, default=192)
    p.add_argument("--long-words", type=int, default=700)
    p.add_argument("--long-max-tokens", type=int, default=4)
    p.add_argument("--long-count", type=int, default=8)
    p.add_argument("--long-interval", type=float, default=1.0, help="seconds between long prompts")
    p.add_argument("--chunk-budget", type=int, default=128, help="the chunked set-up's step budget")
    p.add_argument("--port", type=int, default=18230)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    runs = {"colocated": [], "chunked": [], "disagg": []}
    for rep in range(a.reps):
        for kind in runs:
            r = run_setup(kind, a, rep)
            print(f"# {kind} rep {rep}: {json.dumps(r)}", file=sys.stderr)
            runs[kind].append(r)
    summary = {k: {f: statistics.median(r[f] for r in rs) for f in rs[0] if rs[0][f] is not None}
               for k, rs in runs.items()}
    if a.json:
        print(json.dumps(summary, indent=1))
        return
    fields = ["itl_p50_ms", "itl_p99_ms", "decode_tok_per_s", "long_ttft_p50_ms", "seconds"]
    print(f"{'':>10} " + " ".join(f"{f:>17}" for f in fields))
    for k, s in summary.items():
        print(f"{k:>10} " + " ".join(f"{s[f]:>17.1f}" for f in fields))
    c, d = summary["colocated"], summary["disagg"]
    for k in ("chunked", "disagg"):
        x = summary[k]
        print(f"{k}/colocated: " + ", ".join(f"{f} {x[f] / c[f]:.2f}x" for f in fields[:4]))
    print(f"disagg transfer: {d.get('blocks_received', 0):.0f} blocks, "
          f"{d.get('mb_received', 0):.1f} MB, {d.get('peer_wait_s', 0):.2f} s waiting on the peer, "
          f"{d.get('failures', 0):.0f} failures")
    print(f"one {d['prompt_tokens']:.0f}-token prompt's blocks: {d['payload_mb']:.1f} MB; "
          f"/v1/kv/prefill {d['cold_ms']:.0f} ms cold (prefill on 1 thread), "
          f"{d['cached_ms']:.0f} ms cached ({d['cached_mb_per_s']:.0f} MB/s)")


if __name__ == "__main__":
    main()
