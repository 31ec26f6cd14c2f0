#!/usr/bin/env python3
"""Checks a tandem server running Gemma 3 (`gemma3-270m`) with the official `openai` client:
the chat template, the end-of-turn stop, streaming, `stop` strings and logprobs, all greedy.

Gemma's turn format, written out here from Google's model card (not taken from the server):
    <bos><start_of_turn>user\\n{system}\\n\\n{user}<end_of_turn>\\n<start_of_turn>model\\n
(`{system}\\n\\n` only with a system message; an assistant turn is
`<start_of_turn>model\\n{text}<end_of_turn>\\n`). A completion of that text (the server adds
<bos> to a completion prompt, as the GGUF asks) must equal the chat completion of the
messages, token for token.

Usage: python3 test_gemma3_chat.py --base-url http://127.0.0.1:PORT/v1 --model NAME
Exit status: 0 when every check passes, 1 on a failed check, 3 when the `openai` package is
missing or is not the release `--openai-version` names.
"""

import argparse
import sys

try:
    import openai
except ImportError:
    print("the `openai` Python package is missing (the Rust test installs the pinned release;"
          " by hand: pip install openai)", file=sys.stderr)
    sys.exit(3)

MAX_TOKENS = 32
QUESTION = "What is the capital of France? Answer in one word."
MARKERS = ("<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>")


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def turn(role, text):
    return f"<start_of_turn>{role}\n{text}<end_of_turn>\n"


def render(messages):
    """Gemma 3's chat format for `messages`, ready for the model's reply."""
    out, system = "", None
    for m in messages:
        if m["role"] == "system":
            system = m["content"]
        elif m["role"] == "user":
            text = m["content"] if system is None else f"{system}\n\n{m['content']}"
            system = None
            out += turn("user", text)
        else:
            out += turn("model", m["content"])
    return out + "<start_of_turn>model\n"


def greedy(client, model, messages, **kw):
    return client.chat.completions.create(model=model, messages=messages, temperature=0,
                                          max_tokens=kw.pop("max_tokens", MAX_TOKENS), **kw)


def end_of_turn(client, model):
    """The reply ends at <end_of_turn>: finish_reason stop before max_tokens, no marker in
    the text; past the stop (ignore_eos, special tokens kept) the next token is <end_of_turn>."""
    msgs = [{"role": "user", "content": QUESTION}]
    r = greedy(client, model, msgs)
    c = r.choices[0]
    text = c.message.content
    check(c.finish_reason == "stop", f"finish_reason {c.finish_reason} for {text!r}")
    check(0 < r.usage.completion_tokens < MAX_TOKENS, f"usage {r.usage}")
    check(text.strip() and not any(m in text for m in MARKERS), f"reply {text!r}")
    check("paris" in text.lower(), f"greedy reply {text!r} does not name Paris")
    past = greedy(client, model, msgs, max_tokens=r.usage.completion_tokens + 2,
                  extra_body={"ignore_eos": True, "skip_special_tokens": False}).choices[0]
    check(past.message.content.startswith(text + "<end_of_turn>"),
          f"the token after {text!r} is not <end_of_turn>: {past.message.content!r}")
    return r


def template(client, model, reply):
    """Chat completions equal completions of the hand-written Gemma format."""
    cases = [
        ([{"role": "user", "content": QUESTION}], reply),
        ([{"role": "system", "content": "You are terse."},
          {"role": "user", "content": "Name a fruit."}], None),
        ([{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
          {"role": "user", "content": "Count to three."}], None),
    ]
    for msgs, r in cases:
        r = r or greedy(client, model, msgs)
        raw = client.completions.create(model=model, prompt=render(msgs), temperature=0,
                                        max_tokens=MAX_TOKENS)
        check(raw.usage.prompt_tokens == r.usage.prompt_tokens,
              f"{msgs}: chat prompt has {r.usage.prompt_tokens} tokens, the Gemma format "
              f"{raw.usage.prompt_tokens}")
        check(raw.choices[0].text == r.choices[0].message.content,
              f"{msgs}: chat {r.choices[0].message.content!r} vs raw {raw.choices[0].text!r}")
        check(raw.choices[0].finish_reason == r.choices[0].finish_reason, "finish reasons")


def streaming(client, model, reply):
    msgs = [{"role": "user", "content": QUESTION}]
    chunks = list(greedy(client, model, msgs, stream=True))
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    text = reply.choices[0].message.content
    check("".join(deltas) == text, f"stream {''.join(deltas)!r} != {text!r}")
    check(finish == ["stop"], f"stream finish reasons {finish}")
    check(not any(m in d for d in deltas for m in MARKERS), f"a marker streamed: {deltas}")


def stop_string(client, model):
    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    text = greedy(client, model, msgs).choices[0].message.content
    mid = len(text) // 2
    stop = text[mid:mid + 3]
    check(len(stop) == 3, f"reply too short to pick a stop string: {text!r}")
    want = text[: text.index(stop)]
    got = greedy(client, model, msgs, stop=[stop]).choices[0]
    check(got.message.content == want and got.finish_reason == "stop",
          f"stop {stop!r}: {got.message.content!r} ({got.finish_reason}) vs {want!r}")
    pieces = [c.choices[0].delta.content or "" for c in greedy(client, model, msgs, stop=[stop],
                                                              stream=True) if c.choices]
    check("".join(pieces) == want, f"streamed stop text {pieces}")


def logprobs(client, model, reply):
    msgs = [{"role": "user", "content": QUESTION}]
    r = greedy(client, model, msgs, logprobs=True, top_logprobs=3)
    text = r.choices[0].message.content
    check(text == reply.choices[0].message.content, "logprobs change the greedy reply")
    lp = r.choices[0].logprobs.content
    check(len(lp) == r.usage.completion_tokens - 1 or len(lp) == r.usage.completion_tokens,
          f"{len(lp)} logprob entries for {r.usage.completion_tokens} tokens")
    shown = "".join(e.token for e in lp)
    check(shown.startswith(text), f"tokens {shown!r} do not spell the reply {text!r}")
    for e in lp:
        check(len(e.top_logprobs) == 3, f"top_logprobs {e.top_logprobs}")
        check(e.logprob <= 0, f"logprob {e.logprob}")
        best = e.top_logprobs[0]
        check(best.token == e.token and best.logprob == e.logprob,
              f"greedy token {e.token!r} ({e.logprob}) is not the most likely {best}")
        check(all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:])),
              "top_logprobs are not sorted")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--openai-version", help="the `openai` release required")
    a = p.parse_args()
    if a.openai_version and openai.__version__ != a.openai_version:
        print(f"openai {openai.__version__} was imported (from {openai.__file__}),"
              f" but the checks need {a.openai_version}", file=sys.stderr)
        sys.exit(3)
    client = openai.OpenAI(base_url=a.base_url, api_key="none", max_retries=0, timeout=120)
    reply = end_of_turn(client, a.model)
    template(client, a.model, reply)
    streaming(client, a.model, reply)
    stop_string(client, a.model)
    logprobs(client, a.model, reply)
    print(f"gemma3 chat checks passed; greedy reply {reply.choices[0].message.content!r}")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
