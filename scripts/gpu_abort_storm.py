"""An abort storm against a tandem server on 127.0.0.1 (used by scripts/gpu_cli_check.sh):
N requests over 32 connections at a time, a third streamed and dropped after the first chunk,
a sixth malformed; then the server must be idle with 0 KV blocks in use, and the GPU memory
the server holds must not have grown between the first and the last quarter of the run.

    python3 scripts/gpu_abort_storm.py PORT N
"""
import http.client
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

PORT, N = int(sys.argv[1]), int(sys.argv[2])


def gpu_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0]) if out.strip() else -1


def wait_ready():
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def one(i):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    kind = i % 6
    if kind == 5:
        c.request("POST", "/v1/completions", body=b'{"prompt": 5, "max_tokens": -1}',
                  headers={"Content-Type": "application/json"})
        return c.getresponse().status
    body = {"prompt": f"request {i} says hello to the world " * (1 + i % 7),
            "max_tokens": 16 + i % 48, "temperature": 0.7, "seed": i,
            "stream": kind in (1, 3)}
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if body["stream"]:
        r.readline()  # the first chunk, then drop the connection
        c.sock.close()
        return "dropped"
    r.read()
    return r.status


def metric(name):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    return None


if not wait_ready():
    print("abort storm: the server never became ready")
    sys.exit(1)
start_mib = gpu_used_mib()
results, mib = {}, []
with ThreadPoolExecutor(32) as pool:
    for k, r in enumerate(pool.map(one, range(N))):
        results[r] = results.get(r, 0) + 1
        if k in (N // 4, N - 1):
            mib.append(gpu_used_mib())
for _ in range(100):  # dropped streams end within a step; let the engine drain
    if metric("vllm:num_requests_running") == 0 and metric("tandem:kv_blocks_in_use") == 0:
        break
    time.sleep(0.1)
print(f"abort storm: {N} requests {results}; GPU memory used (MiB) at start {start_mib}, "
      f"after a quarter {mib[0]}, at the end {mib[-1]}; running "
      f"{metric('vllm:num_requests_running')}, KV blocks in use {metric('tandem:kv_blocks_in_use')}")
