#!/usr/bin/env python3
"""A bounded soak of `tandem serve` on 127.0.0.1: mixed traffic for a fixed time, reporting
the server's resident memory over time, errors, latency per minute, and the KV pool at the end.

    scripts/soak.py [--bin target/release/tandem] [--minutes 5] [--concurrency 6] [--json]

Traffic (each worker draws one kind per request, seeded): streamed and plain completions,
prompts behind a shared system prompt (prefix-cache hits), `n = 3`, beam search, chat,
`/v1/score` of a context and continuations, a structured-output request (a JSON schema),
streams dropped after their first chunk (aborts), and malformed bodies (must be 400).
The server runs with n-gram speculation on. Goals (issue "production hardening"): RSS growth
after warm-up at most 5 % (judged over the run's second half: the KV pool becomes resident as
the prefix cache touches it, which takes minutes with the default 2 GiB), 0 KV blocks in use
at the end, 0 responses of 5xx. Standard
library only; loopback only; bounded in time.
"""
import argparse
import http.client
import json
import random
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = "You are a careful assistant who answers about rivers, mountains and cities. " * 8
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                             "age": {"type": "integer"}},
          "required": ["name", "age"]}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss_mib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return -1.0


def request(port, kind, rng):
    """Sends one request of `kind`; returns (status or 'dropped', seconds)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    path, body, drop = "/v1/completions", None, False
    base = {"max_tokens": rng.randint(8, 48), "temperature": 0.8, "seed": rng.randint(0, 1 << 30)}
    if kind == "plain":
        body = {**base, "prompt": f"Tell me about river {rng.randint(0, 999)}"}
    elif kind == "stream":
        body = {**base, "prompt": f"Describe city {rng.randint(0, 999)}", "stream": True}
    elif kind == "prefix":
        body = {**base, "prompt": SYSTEM + f"Question {rng.randint(0, 999)}: which river?"}
    elif kind == "n3":
        body = {**base, "prompt": "Name a mountain:", "n": 3}
    elif kind == "beam":
        body = {"prompt": "The longest river is", "max_tokens": 12, "n": 2,
                "use_beam_search": True, "temperature": 0}
    elif kind == "chat":
        path = "/v1/chat/completions"
        body = {**base, "messages": [{"role": "user", "content": "Say something short."}]}
    elif kind == "score":
        path = "/v1/score"
        body = {"context": "The capital of France is", "continuations": [" Paris", " Rome"]}
    elif kind == "json":
        body = {**base, "prompt": "A person as JSON:", "max_tokens": 64,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "p", "schema": SCHEMA}}}
    elif kind == "drop":
        body = {**base, "prompt": "Count slowly:", "max_tokens": 200, "stream": True}
        drop = True
    data = b'{"prompt": ' if kind == "bad" else json.dumps(body).encode()
    start = time.time()
    try:
        c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if drop:
            r.readline()
            c.sock.close()
            return "dropped", time.time() - start
        r.read()
        return r.status, time.time() - start
    except (OSError, http.client.HTTPException) as e:
        return f"error {e!r}"[:80], time.time() - start
    finally:
        c.close()


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/release/tandem"))
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([a.bin, "serve", "--port", str(port), "--speculative", "ngram",
                               "--log-level", "warn"], stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        report = soak(a, port, server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
    report["exit_status"] = server.returncode
    print(json.dumps(report) if a.json else json.dumps(report, indent=1))


def soak(a, port, pid):
    kinds = ["plain", "stream", "prefix", "prefix", "n3", "beam", "chat", "score", "json",
             "drop", "bad"]
    lock, results = threading.Lock(), []  # (minute, kind, status, seconds)
    start = time.time()
    deadline = start + a.minutes * 60

    def worker(w):
        rng = random.Random(w)
        while time.time() < deadline:
            kind = rng.choice(kinds)
            status, secs = request(port, kind, rng)
            with lock:
                results.append((int((time.time() - start) // 60), kind, status, secs))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(a.concurrency)]
    for t in threads:
        t.start()
    rss = []
    while any(t.is_alive() for t in threads):
        rss.append((round(time.time() - start), round(rss_mib(pid), 1)))
        time.sleep(10)
    for t in threads:
        t.join()
    time.sleep(1)
    # Warm-up ends once the KV pool is resident (it is touched as the prefix cache keeps
    # blocks; with the default 2 GiB pool that takes minutes): judge the second half.
    warm = [m for s, m in rss if s >= a.minutes * 30] or [m for _, m in rss]
    per_minute = {}
    for minute, kind, status, secs in results:
        if status == 200 and kind not in ("drop",):
            per_minute.setdefault(minute, []).append(secs)
    statuses = {}
    for _, kind, status, _ in results:
        statuses[f"{kind}:{status}"] = statuses.get(f"{kind}:{status}", 0) + 1
    return {
        "minutes": a.minutes, "requests": len(results), "statuses": statuses,
        "server_errors": sum(1 for r in results if isinstance(r[2], int) and r[2] >= 500),
        "bad_requests_not_400": sum(1 for r in results if r[1] == "bad" and r[2] != 400),
        "rss_mib": rss, "rss_growth_second_half_pct":
            round(100 * (warm[-1] - warm[0]) / warm[0], 2) if warm and warm[0] > 0 else None,
        "latency_s_per_minute": {m: {"p50": round(statistics.median(v), 3),
                                     "p99": round(sorted(v)[int(0.99 * (len(v) - 1))], 3),
                                     "n": len(v)} for m, v in sorted(per_minute.items())},
        "kv_blocks_in_use_at_end": metric(port, "tandem:kv_blocks_in_use"),
        "running_at_end": metric(port, "vllm:num_requests_running"),
    }


if __name__ == "__main__":
    main()
