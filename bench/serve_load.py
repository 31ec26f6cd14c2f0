#!/usr/bin/env python3
"""Streaming load generator for OpenAI-compatible servers (a benchmark, not a test).

Sends streamed `/v1/completions` requests (~100-token prompts unless --prompt-words, 128
output tokens with `ignore_eos`, greedy) at a fixed concurrency and measures requests/s, output tokens/s, time to
first token (TTFT) and inter-token latency (ITL: the gaps between streamed chunks) p50/p90/p99.
Standard library only (asyncio + raw HTTP/1.1); loopback only; bounded in requests and time.

usage:
  bench/serve_load.py --url http://127.0.0.1:8000 [--concurrency 1 4 16] [--json]
      [--model auto] [--wait-ready SECONDS]
      measure a server that is already running (or starting: --wait-ready polls /health);
      --model auto sends the first model id the server lists
  bench/serve_load.py --compare --model M.gguf [--threads 2] [--reps 2]
      start `tandem serve` and llama.cpp's `llama-server` (bench/build_llama_cpp.sh) in turn on
      the same GGUF and threads, alternating, and print per-level medians and ratios
  bench/serve_load.py --compare-prefix-cache --model M.gguf --system-prompt-words 400
      start `tandem serve` with the prefix cache on and with --no-prefix-caching in turn,
      alternating, every prompt behind the same system prompt, and print the ratios on/off

--system-prompt-words N puts the same N-word text (a shared system prompt) before every
request's own ~100 tokens; --prompt-words N makes each request's own text N words (the
prompt's token count, as the server reports it, is in each level's `prompt_tokens_mean`).
"""
import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("the of and to in is was for on that with as by at from his her an which this are "
         "be had not have one all were they we there been has when who more will would their "
         "time if about up out them into only other some could what so its two may then first "
         "any new these over such our years most also state after people made city long many "
         "small world river house water great music light night story green market garden").split()


def prompt_text(rng, words=99):
    """About 100 tokens of varied text (distinct per request, so no prefix is shared)."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def read_chunked(reader):
    """Yields the body's pieces: chunked transfer coding or read-until-close."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    chunked = b"transfer-encoding: chunked" in head.lower()
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {head!r} {await reader.read(2000)!r}")
    if not chunked:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def one_request(url, model, prompt, max_tokens):
    """Returns ([chunk times after send], (prompt, output) tokens reported or None)."""
    u = urllib.parse.urlparse(url)
    assert u.hostname in ("127.0.0.1", "localhost", "::1"), "loopback only"
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    start = time.perf_counter()
    writer.write(head + body)
    await writer.drain()
    times, usage, buf = [], None, b""
    async for piece in read_chunked(reader):
        now = time.perf_counter() - start
        buf += piece
        while b"\n\n" in buf:
            frame, buf = buf.split(b"\n\n", 1)
            line = frame.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = (event["usage"].get("prompt_tokens"),
                         event["usage"].get("completion_tokens"))
            choices = event.get("choices") or []
            if choices and choices[0].get("text"):
                times.append(now)
    writer.close()
    return times, usage


SYSTEM_PROMPT_WORDS = 0
PROMPT_WORDS = 99


def system_prompt():
    """The shared prefix of every prompt (empty unless --system-prompt-words)."""
    if SYSTEM_PROMPT_WORDS == 0:
        return ""
    return prompt_text(random.Random(12345), SYSTEM_PROMPT_WORDS) + "\n\n"


async def run_level(url, model, concurrency, requests, max_tokens, time_limit, seed):
    rng = random.Random(seed)
    shared = system_prompt()
    prompts = [shared + prompt_text(rng, PROMPT_WORDS) for _ in range(requests)]
    queue = list(range(requests))
    results = []
    deadline = time.perf_counter() + time_limit

    async def worker():
        while queue and time.perf_counter() < deadline:
            i = queue.pop()
            times, usage = await one_request(url, model, prompts[i], max_tokens)
            results.append((times, usage))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    ttft = [t[0] for t, _ in results if t]
    itl = [b - a for t, _ in results for a, b in zip(t, t[1:])]
    tokens = sum(u[1] if u is not None else len(t) for t, u in results)
    prompt_tokens = [u[0] for _, u in results if u is not None and u[0] is not None]
    return {"concurrency": concurrency, "requests": len(results), "seconds": round(elapsed, 3),
            "req_per_s": len(results) / elapsed, "out_tok_per_s": tokens / elapsed,
            "ttft_p50": percentile(ttft, 50), "ttft_p90": percentile(ttft, 90),
            "ttft_p99": percentile(ttft, 99), "itl_p50": percentile(itl, 50),
            "itl_p90": percentile(itl, 90), "itl_p99": percentile(itl, 99),
            "output_tokens": tokens,
            "prompt_tokens_mean": statistics.mean(prompt_tokens) if prompt_tokens else None}


def measure(url, model, a):
    # One warm-up request, then each level.
    asyncio.run(run_level(url, model, 1, 1, a.max_tokens, a.time_limit, 0))
    out = []
    for c in a.concurrency:
        n = max(a.min_requests, a.requests_per_slot * c)
        out.append(asyncio.run(run_level(url, model, c, n, a.max_tokens, a.time_limit, c)))
    return out


def wait_ready(url, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server never became ready")


def start_server(kind, a, port):
    if kind == "tandem":
        cmd = [str(ROOT / "target/release/tandem"), "serve", "--model", a.model, "--threads",
               str(a.threads), "--port", str(port), "--max-num-seqs", str(max(a.concurrency))]
    elif kind == "tandem-no-cache":
        cmd = [str(ROOT / "target/release/tandem"), "serve", "--model", a.model, "--threads",
               str(a.threads), "--port", str(port), "--max-num-seqs", str(max(a.concurrency)),
               "--no-prefix-caching"]
    else:
        slots = max(a.concurrency)
        cmd = [str(a.llama_bin / "llama-server"), "-m", a.model, "-t", str(a.threads), "-tb",
               str(a.threads), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
               "-c", str(slots * 512), "-cb", "--no-webui"] + a.llama_extra.split()
    print("# " + " ".join(cmd), file=sys.stderr)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc


def compare_prefix_cache(a):
    """tandem with the prefix cache on vs off, alternating, per-level medians and ratios."""
    kinds = ["tandem", "tandem-no-cache"]
    runs = {k: [] for k in kinds}
    for rep in range(a.reps):
        for kind in kinds:
            port = 18000 + random.Random().randrange(20000)
            proc = start_server(kind, a, port)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_ready(url, proc)
                for row in measure(url, a.model, a):
                    row.update({"server": kind, "rep": rep,
                                "system_prompt_words": SYSTEM_PROMPT_WORDS})
                    print(json.dumps(row), flush=True)
                    runs[kind].append(row)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    print("\n| concurrency | metric | cache on | cache off | on / off |")
    print("| --- | --- | --- | --- | --- |")
    for c in a.concurrency:
        for k in ["out_tok_per_s", "req_per_s", "ttft_p50", "ttft_p90", "itl_p50"]:
            on = statistics.median(r[k] for r in runs["tandem"] if r["concurrency"] == c)
            off = statistics.median(r[k] for r in runs["tandem-no-cache"] if r["concurrency"] == c)
            unit = "" if k.endswith("per_s") else " s"
            print(f"| {c} | {k} | {on:.4g}{unit} | {off:.4g}{unit} | {on / off:.2f} |")


def compare(a):
    if a.llama_bin is None:
        out = subprocess.run(["bash", str(ROOT / "bench/build_llama_cpp.sh")], check=True,
                             capture_output=True, text=True).stdout
        a.llama_bin = Path(out.strip().splitlines()[-1])
    runs = {"tandem": [], "llama.cpp": []}
    for rep in range(a.reps):
        for kind in ("tandem", "llama.cpp"):
            port = 18000 + rep * 2 + (kind == "llama.cpp")
            proc = start_server(kind, a, port)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_ready(url, proc)
                for row in measure(url, a.model, a):
                    row.update(server=kind, rep=rep)
                    print(json.dumps(row), flush=True)
                    runs[kind].append(row)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    keys = ["req_per_s", "out_tok_per_s", "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50",
            "itl_p90", "itl_p99"]
    print("\n| concurrency | metric | tandem | llama.cpp | tandem / llama.cpp |")
    print("| --- | --- | --- | --- | --- |")
    for c in a.concurrency:
        for k in keys:
            t = statistics.median(r[k] for r in runs["tandem"] if r["concurrency"] == c)
            l = statistics.median(r[k] for r in runs["llama.cpp"] if r["concurrency"] == c)
            unit = "" if k.endswith("per_s") else " s"
            print(f"| {c} | {k} | {t:.4g}{unit} | {l:.4g}{unit} | {t / l:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running server (loopback)")
    p.add_argument("--model", default="model", help="GGUF path (--compare) or model name (--url)")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--compare-prefix-cache", action="store_true")
    p.add_argument("--system-prompt-words", type=int, default=0)
    p.add_argument("--prompt-words", type=int, default=99, help="words of each request's text")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--llama-bin", type=Path, help="llama.cpp build/bin (default: build it)")
    p.add_argument("--llama-extra", default="", help="more llama-server flags, e.g. '--poll 0'")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--requests-per-slot", type=int, default=2)
    p.add_argument("--min-requests", type=int, default=4)
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds per level at most")
    p.add_argument("--wait-ready", type=float, default=0.0,
                   help="--url: seconds to wait for /health first")
    a = p.parse_args()
    global SYSTEM_PROMPT_WORDS, PROMPT_WORDS
    SYSTEM_PROMPT_WORDS = a.system_prompt_words
    PROMPT_WORDS = a.prompt_words
    if a.compare_prefix_cache:
        compare_prefix_cache(a)
    elif a.compare:
        compare(a)
    elif a.url:
        url = a.url.rstrip("/")
        if a.wait_ready > 0:
            wait_ready(url, None, a.wait_ready)
        model = a.model
        if model == "auto":
            with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
                model = json.load(r)["data"][0]["id"]
        for row in measure(url, model, a):
            print(json.dumps(row), flush=True)
    else:
        p.error("give --url or --compare")


if __name__ == "__main__":
    main()
