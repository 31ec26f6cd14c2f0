#!/usr/bin/env python3
"""Load-to-ready time and idle resident memory of `tandem serve` (issue: CPU performance).

Starts `tandem serve` on a free loopback port, polls GET /health until it answers 200, and
reports the time from process start to ready, then the resident memory (VmRSS) once idle
after one 16-token completion (which touches every weight page),
next to the model file's size and the KV pool's size as tandem reports it at start-up.
Repeats --reps times (warm page cache after the first) and prints one JSON line per run
and a median line. Only 127.0.0.1 is contacted.

    python3 bench/startup.py --binary target/release/tandem --reps 5 [-- extra serve flags]
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def one_run(binary, extra, timeout):
    port = free_port()
    start = time.monotonic()
    proc = subprocess.Popen(
        [binary, "serve", "--port", str(port), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/health"
        ready = None
        while time.monotonic() - start < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited: {proc.stderr.read()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        ready = time.monotonic() - start
                        break
            except OSError:
                pass
            time.sleep(0.01)
        if ready is None:
            raise RuntimeError("not ready in time")
        # One request touches every weight page, then the server idles.
        body = json.dumps({"prompt": "The quick brown fox", "max_tokens": 16}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            json.load(r)
        time.sleep(1.0)
        rss = rss_bytes(proc.pid)
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    m = re.search(r"KV cache (\d+) blocks x (\d+) tokens = (\d+) tokens \((\d+) MiB(?:, \w+)?\)", err or "")
    kv_mib = int(m.group(4)) if m else None
    return ready, rss, kv_mib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/tandem")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/tandem/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("extra", nargs="*", help="extra `tandem serve` flags (after --)")
    a = ap.parse_args()
    model_bytes = os.path.getsize(a.model)
    runs = []
    for i in range(a.reps):
        ready, rss, kv_mib = one_run(a.binary, a.extra, a.timeout)
        runs.append((ready, rss))
        print(json.dumps({"run": i, "ready_s": round(ready, 3), "idle_rss_mib": round(rss / 2**20, 1),
                          "model_file_mib": round(model_bytes / 2**20, 1), "kv_pool_mib": kv_mib}))
    ready = statistics.median(r for r, _ in runs)
    rss = statistics.median(m for _, m in runs)
    print(json.dumps({"median_ready_s": round(ready, 3), "median_idle_rss_mib": round(rss / 2**20, 1),
                      "model_file_mib": round(model_bytes / 2**20, 1),
                      "rss_over_model_mib": round((rss - model_bytes) / 2**20, 1)}))


if __name__ == "__main__":
    main()
