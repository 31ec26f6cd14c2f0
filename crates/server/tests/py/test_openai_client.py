#!/usr/bin/env python3
"""Checks a running tandem server with the official `openai` Python client.

Usage: python3 test_openai_client.py --base-url http://127.0.0.1:PORT/v1 --model NAME

Exit status: 0 when every check passes, 1 on a failed check, 3 when the `openai` package
is missing (install it with `pip install openai`).
"""

import argparse
import sys

try:
    import openai
except ImportError:
    print("the `openai` Python package is missing: pip install openai", file=sys.stderr)
    sys.exit(3)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default="none")
    a = p.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=120)
    models = [m.id for m in client.models.list()]
    check(a.model in models, f"models {models}")
    text = completions(client, a.model)
    chat(client, a.model)
    seeds(client, a.model)
    stops(client, a.model, text)
    errors(client, a.model)
    print("openai client checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
