#!/usr/bin/env python3
"""Load through a load balancer on 127.0.0.1 (used by scripts/replicas_demo.sh): C workers
send completions (every other one streamed) for T seconds and count successes, failures (any
status but 200, or a stream without its final `[DONE]`) and output tokens.

    replicas_load.py PORT CONCURRENCY SECONDS

Prints one JSON line: {"ok", "failed", "failures": [first few], "tokens", "seconds",
"tok_per_s"}. Standard library only; bounded in time.
"""
import http.client
import json
import sys
import threading
import time

PORT, CONC, SECONDS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
lock = threading.Lock()
stats = {"ok": 0, "failed": 0, "failures": [], "tokens": 0}


def one(i):
    stream = i % 2 == 1
    body = {"prompt": f"Request {i}: tell me about rivers and mountains", "max_tokens": 32,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read().decode(errors="replace")
        if r.status != 200:
            return False, f"status {r.status}: {data[:120]}", 0
        if stream:
            if "data: [DONE]" not in data:
                return False, "stream without [DONE]", 0
            return True, "", data.count('"text"')
        return True, "", json.loads(data)["usage"]["completion_tokens"]
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        return False, repr(e), 0
    finally:
        c.close()


def worker(w, deadline):
    i = w
    while time.time() < deadline:
        ok, why, tokens = one(i)
        with lock:
            if ok:
                stats["ok"] += 1
                stats["tokens"] += tokens
            else:
                stats["failed"] += 1
                if len(stats["failures"]) < 5:
                    stats["failures"].append(why)
        i += CONC


start = time.time()
threads = [threading.Thread(target=worker, args=(w, start + SECONDS)) for w in range(CONC)]
for t in threads:
    t.start()
for t in threads:
    t.join()
elapsed = time.time() - start
stats["seconds"] = round(elapsed, 1)
stats["tok_per_s"] = round(stats["tokens"] / elapsed, 1)
print(json.dumps(stats))
