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

import json
import urllib.request

import driver  # exits 3 when the `openai` package is missing
from driver import check

MAX_TOKENS = 16
MIN = 6
QUESTION = "What is the capital of France? Answer in one word."
MARKERS = ("<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>")


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


def post_json(base_url, path, body):
    root = base_url.rstrip("/").removesuffix("/v1")
    req = urllib.request.Request(root + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def get_json(base_url, path):
    root = base_url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(root + path, timeout=30) as r:
        return json.load(r)


def end_of_turn(client, model, base_url):
    """The reply ends at <end_of_turn> with finish_reason stop and no marker in the text.

    `gemma3-270m` is the pretrained model: its turn markers are untrained (HF transformers
    gives <end_of_turn> a log-probability of about -35 after a user turn), so it never ends a
    turn by itself. A logit bias makes <end_of_turn> the most likely token, and `min_tokens`
    holds every end-of-sequence token back for MIN tokens: the greedy reply is then the first
    MIN tokens of the unbiased greedy reply, ended by <end_of_turn>."""
    eot = post_json(base_url, "/tokenize", {"prompt": "<end_of_turn>",
                                            "add_special_tokens": False})["tokens"]
    check(len(eot) == 1, f"<end_of_turn> is not one token: {eot}")
    msgs = [{"role": "user", "content": QUESTION}]
    plain = greedy(client, model, msgs, max_tokens=MIN).choices[0].message.content
    forced = dict(logit_bias={str(eot[0]): 100}, extra_body={"min_tokens": MIN})
    r = greedy(client, model, msgs, **forced)
    c = r.choices[0]
    text = c.message.content
    check(c.finish_reason == "stop", f"finish_reason {c.finish_reason} for {text!r}")
    check(r.usage.completion_tokens in (MIN, MIN + 1), f"usage {r.usage}")
    check(text == plain, f"reply {text!r} is not the first {MIN} greedy tokens {plain!r}")
    check(not any(m in text for m in MARKERS), f"a marker in the reply {text!r}")
    # <end_of_turn> is one of the ids that end a generation, and the bias alone ends the
    # reply at once.
    info = get_json(base_url, "/tokenizer_info")
    check(eot[0] in info["eos_token_ids"], f"<end_of_turn> not among {info['eos_token_ids']}")
    empty = greedy(client, model, msgs, logit_bias=forced["logit_bias"]).choices[0]
    check(empty.message.content == "" and empty.finish_reason == "stop",
          f"biased reply {empty.message.content!r} ({empty.finish_reason})")
    chunks = list(greedy(client, model, msgs, stream=True, **forced))
    deltas = [ch.choices[0].delta.content or "" for ch in chunks if ch.choices]
    finish = [ch.choices[0].finish_reason for ch in chunks
              if ch.choices and ch.choices[0].finish_reason]
    check("".join(deltas) == text and finish == ["stop"], f"stream {deltas} {finish}")


def template(client, model, base_url, reply):
    """The chat prompt's tokens are those of the hand-written Gemma format, and chat
    completions equal completions of that text."""
    cases = [
        ([{"role": "user", "content": QUESTION}], reply),
        ([{"role": "system", "content": "You are terse."},
          {"role": "user", "content": "Name a fruit."}], None),
        ([{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
          {"role": "user", "content": "Count to three."}], None),
    ]
    for msgs, r in cases:
        chat_ids = post_json(base_url, "/tokenize", {"messages": msgs})["tokens"]
        raw_ids = post_json(base_url, "/tokenize", {"prompt": render(msgs)})["tokens"]
        check(chat_ids == raw_ids, f"{msgs}: chat prompt {chat_ids} vs Gemma format {raw_ids}")
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
    check(finish == [reply.choices[0].finish_reason], f"stream finish reasons {finish}")
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
    check(len(lp) == r.usage.completion_tokens,
          f"{len(lp)} logprob entries for {r.usage.completion_tokens} tokens")
    shown = "".join(e.token for e in lp)
    check(shown == text, f"tokens {shown!r} do not spell the reply {text!r}")
    for e in lp:
        check(len(e.top_logprobs) == 3, f"top_logprobs {e.top_logprobs}")
        check(e.logprob <= 0, f"logprob {e.logprob}")
        best = e.top_logprobs[0]
        check(best.token == e.token and best.logprob == e.logprob,
              f"greedy token {e.token!r} ({e.logprob}) is not the most likely {best}")
        check(all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:])),
              "top_logprobs are not sorted")


def main():
    a, client = driver.connect()
    end_of_turn(client, a.model, a.base_url)
    reply = greedy(client, a.model, [{"role": "user", "content": QUESTION}])
    template(client, a.model, a.base_url, reply)
    streaming(client, a.model, reply)
    stop_string(client, a.model)
    logprobs(client, a.model, reply)
    print(f"gemma3 chat checks passed; greedy reply {reply.choices[0].message.content!r}")


if __name__ == "__main__":
    driver.run(main)
