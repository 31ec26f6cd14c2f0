#!/usr/bin/env python3
"""Tokenizer time on pathological inputs (long runs of one character, mixed whitespace,
CJK, combining marks, random code points) through `POST /tokenize`: is it linear in the
input's size? A tokenizer that is quadratic on some input lets one request hold a server
thread for minutes.

Starts `tandem serve` on a free loopback port, sends each input at 100 k, 400 k and
1.6 M characters (the last is refused with 413 where its JSON passes the 4 MiB body limit),
and prints seconds and token counts per size; a linear tokenizer takes about 4 times as
long for 4 times the input. Only 127.0.0.1 is contacted.

    python3 bench/tokenize_time.py --binary target/release/tandem [--model FILE.gguf]
"""
import argparse
import json
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request

SIZES = (100_000, 400_000, 1_600_000)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inputs():
    rng = random.Random(1)

    def code_point():
        return chr(rng.choice([rng.randint(32, 0xD7FF), rng.randint(0xE000, 0x10FFFF)]))

    return {
        "spaces": lambda n: " " * n,
        "newlines": lambda n: "\n" * n,
        "letter a": lambda n: "a" * n,
        "digits": lambda n: "1" * n,
        "punctuation": lambda n: "!" * n,
        "mixed whitespace": lambda n: "".join(rng.choice(" \t\n") for _ in range(n)),
        "CJK": lambda n: "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(n // 3)),
        "combining marks": lambda n: "e" + "\u0301" * (n // 2),
        "random code points": lambda n: "".join(code_point() for _ in range(n // 4)),
    }


def tokenize(port, text):
    body = json.dumps({"prompt": text, "add_special_tokens": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=body,
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            count = json.load(r)["count"]
    except (urllib.error.HTTPError, urllib.error.URLError, ConnectionError) as e:
        count = f"refused ({getattr(e, 'code', None) or type(e).__name__})"
    return time.monotonic() - start, count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/tandem")
    ap.add_argument("--model", help="a GGUF file (default: the default model)")
    args = ap.parse_args()
    port = free_port()
    cmd = [args.binary, "serve", "--port", str(port), "--threads", "2"]
    if args.model:
        cmd += ["--model", args.model]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        for name, make in inputs().items():
            cells = []
            for n in SIZES:
                seconds, count = tokenize(port, make(n))
                cells.append(f"{n}: {seconds:.3f} s, {count} tokens")
            print(f"{name:20} " + " | ".join(cells), flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
