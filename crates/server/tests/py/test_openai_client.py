#!/usr/bin/env python3
"""Checks a running tandem server with the official `openai` Python client.

Usage: python3 test_openai_client.py --base-url http://127.0.0.1:PORT/v1 --model NAME
       python3 test_openai_client.py --base-url ... --model NAME --api-key KEY --limits
         (a server with that key, a 64 KiB body limit, one running sequence and a waiting
         queue of one: checks 401, 404, 413 and 429 with the SDK's exception types)

The Rust test (tests/server_openai.rs) runs this script with the pinned `openai` release
on PYTHONPATH, installed on first use under the cargo target directory; `--openai-version V`
makes the script refuse any other release.

Exit status: 0 when every check passes, 1 on a failed check, 3 when the `openai` package
is missing or is not the release `--openai-version` names.
"""

import json
import threading
import time
import urllib.request

import driver  # exits 3 when the `openai` package is missing
import openai
from driver import check


def completions(client, model):
    args = dict(model=model, prompt="hello world", max_tokens=16, temperature=0,
                extra_body={"ignore_eos": True})
    full = client.completions.create(**args)
    text = full.choices[0].text
    check(full.choices[0].finish_reason == "length", f"finish_reason {full.choices[0].finish_reason}")
    check(full.usage.completion_tokens == 16, f"usage {full.usage}")
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    check(streamed == text, f"stream {streamed!r} != non-stream {text!r}")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16,
          f"final usage chunk {chunks[-1]}")
    return text


def chat(client, model):
    msgs = [{"role": "user", "content": "Say hi"}]
    args = dict(model=model, messages=msgs, max_tokens=12, temperature=0,
                extra_body={"ignore_eos": True})
    full = client.chat.completions.create(logprobs=True, top_logprobs=2, **args)
    text = full.choices[0].message.content
    check(full.choices[0].message.role == "assistant", "role")
    lp = full.choices[0].logprobs.content
    check(len(lp) == 12, f"{len(lp)} logprob entries")
    check(all(len(e.top_logprobs) == 2 for e in lp), "top_logprobs count")
    check(all(e.logprob <= 0 for e in lp), "logprobs are <= 0")
    stream = client.chat.completions.create(stream=True, **args)
    streamed = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    check(streamed == text, f"chat stream {streamed!r} != {text!r}")


def seeds(client, model):
    args = dict(model=model, prompt="once upon a time", max_tokens=12, temperature=1.0, seed=7, n=2,
                extra_body={"ignore_eos": True})
    a = [c.text for c in client.completions.create(**args).choices]
    b = [c.text for c in client.completions.create(**args).choices]
    check(a == b, f"seeded runs differ: {a} vs {b}")


def stops(client, model, text):
    stop = text[len(text) // 2: len(text) // 2 + 2]
    check(len(stop) == 2, f"text too short to pick a stop string: {text!r}")
    want = text[: text.index(stop)]
    args = dict(model=model, prompt="hello world", max_tokens=16, temperature=0, stop=[stop],
                extra_body={"ignore_eos": True})
    got = client.completions.create(**args).choices[0]
    check(got.text == want and got.finish_reason == "stop", f"stop: {got.text!r} vs {want!r}")
    pieces = [c.choices[0].text for c in client.completions.create(stream=True, **args)]
    check("".join(pieces) == want, "streamed stop text")
    check(all(stop not in p for p in pieces), "stop string streamed")


def post_json(base_url, path, body):
    req = urllib.request.Request(base_url.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def echo_scores(client, model, base_url):
    """lm-evaluation-harness's log-likelihood request: echo + logprobs on token ids, with
    max_tokens 0 and 1; the prompt's logprobs equal /v1/score's on the same ids."""
    ids = [5, 17, 42, 99, 7, 250, 31, 64]
    scored = post_json(base_url, "/score", {"model": model, "input": ids, "top_logprobs": 1})
    want = scored["data"][0]["token_logprobs"]
    check(want[0] is None and len(want) == len(ids), f"score {scored}")
    for max_tokens in (0, 1):
        c = client.completions.create(model=model, prompt=ids, echo=True, logprobs=1,
                                      max_tokens=max_tokens, temperature=0).choices[0]
        lp = c.logprobs
        check(len(lp.tokens) == len(ids) + max_tokens, f"{len(lp.tokens)} tokens")
        check(lp.token_logprobs[: len(ids)] == want, f"echo {lp.token_logprobs} vs score {want}")
        check(lp.top_logprobs[0] is None and all(lp.top_logprobs[1:]), "top_logprobs")
        check(c.finish_reason == "length", c.finish_reason)
        if max_tokens == 1:
            gen = lp.token_logprobs[-1]
            check(gen == max(lp.top_logprobs[-1].values()), "greedy token is the most likely")
    # A context and its continuation, as lm-eval sums token_logprobs[ctxlen:].
    ctx, cont = ids[:3], ids[3:]
    part = post_json(base_url, "/score", {"context": ctx, "continuations": [cont]})["data"][0]
    check(part["token_logprobs"] == want[3:], "continuation scores")
    check(abs(part["sum_logprob"] - sum(want[3:])) < 1e-9, "continuation sum")
    # Streaming sends the echoed prompt first; the text equals the non-streamed text.
    args = dict(model=model, prompt=ids, echo=True, max_tokens=1, temperature=0)
    full = client.completions.create(**args).choices[0].text
    chunks = [c.choices[0].text for c in client.completions.create(stream=True, **args) if c.choices]
    check("".join(chunks) == full, f"echo stream {chunks} vs {full!r}")


def errors(client, model):
    cases = [
        (dict(prompt="x", temperature=-1), "temperature"),
        (dict(prompt="x", n=0), "n"),
        (dict(prompt=[5] * 400), "prompt"),
        (dict(prompt="x", extra_body={"top_k": "many"}), "top_k"),
    ]
    for kwargs, param in cases:
        try:
            client.completions.create(model=model, max_tokens=2, **kwargs)
        except openai.BadRequestError as e:
            check(e.status_code == 400, f"status {e.status_code}")
            check(isinstance(e.body, dict) and e.body.get("param") == param, f"body {e.body}")
        else:
            raise AssertionError(f"no error for {kwargs}")
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    except openai.NotFoundError as e:
        check(e.status_code == 404, "404 for an unknown model")
    else:
        raise AssertionError("no error for an unknown model")


def get_json(base_url, path):
    root = base_url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(root + path, timeout=30) as r:
        return json.load(r)


def request_ids(client, model):
    raw = client.completions.with_raw_response.create(
        model=model, prompt="hi", max_tokens=2, extra_headers={"x-request-id": "py-trace-7"})
    check(raw.headers.get("x-request-id") == "py-trace-7", f"x-request-id {raw.headers}")
    check(raw.parse().choices[0].text is not None, "parsed body")


def limits(client, model, base_url):
    """401, 404, 413 and 429, each with the SDK's exception type and an OpenAI error body."""
    bad = openai.OpenAI(base_url=base_url, api_key="wrong-key", max_retries=0, timeout=60)
    try:
        bad.completions.create(model=model, prompt="x", max_tokens=1)
    except openai.AuthenticationError as e:
        check(e.status_code == 401 and e.body.get("code") == "invalid_api_key", f"401 {e.body}")
    else:
        raise AssertionError("no error for a wrong key")
    try:
        client.models.retrieve("no-such-model")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "404 for an unknown model card")
    else:
        raise AssertionError("no error for an unknown model card")
    try:
        client.completions.create(model=model, prompt="a " * (40 * 1024), max_tokens=1)
    except openai.APIStatusError as e:
        check(e.status_code == 413, f"status {e.status_code}")
        check(not isinstance(e, openai.InternalServerError), "413 is not a server error")
    else:
        raise AssertionError("no error for an oversized body")

    # One long stream runs, one request waits (the queue holds one): the next gets 429.
    long = client.completions.create(model=model, prompt="Tell a long story.", max_tokens=400,
                                     temperature=0, stream=True, extra_body={"ignore_eos": True})
    next(iter(long))
    waiting = {}

    def wait_in_queue():
        waiting["result"] = client.completions.create(model=model, prompt="The sky is",
                                                      max_tokens=3, temperature=0)
    t = threading.Thread(target=wait_in_queue)
    t.start()
    deadline = time.time() + 60
    while get_json(base_url, "/health")["waiting"] != 1:
        check(time.time() < deadline, "the second request never queued")
        time.sleep(0.02)
    try:
        client.completions.create(model=model, prompt="x", max_tokens=1)
    except openai.RateLimitError as e:
        check(e.status_code == 429, f"status {e.status_code}")
        check(e.body.get("code") == "queue_full", f"429 body {e.body}")
        check(int(e.response.headers.get("retry-after", "0")) >= 1, "Retry-After")
    else:
        raise AssertionError("no 429 with a full queue")
    long.close()
    t.join(timeout=120)
    check(waiting.get("result") is not None and waiting["result"].choices[0].finish_reason,
          "the queued request completed")
    done = client.completions.create(model=model, prompt="x", max_tokens=1)
    check(done.usage.completion_tokens == 1, "service is normal after a 429")


def options(p):
    p.add_argument("--api-key", default="none")
    p.add_argument("--limits", action="store_true")


def main():
    a, client = driver.connect(options)
    if a.limits:
        limits(client, a.model, a.base_url)
        print("openai client limit checks passed")
        return
    models = [m.id for m in client.models.list()]
    check(a.model in models, f"models {models}")
    text = completions(client, a.model)
    chat(client, a.model)
    seeds(client, a.model)
    stops(client, a.model, text)
    echo_scores(client, a.model, a.base_url)
    errors(client, a.model)
    request_ids(client, a.model)
    print("openai client checks passed")


if __name__ == "__main__":
    driver.run(main)
