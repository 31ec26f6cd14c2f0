#!/usr/bin/env python3
"""Checks LoRA adapters served by tandem with the official `openai` client: `models.list`
shows the base model and each adapter (with the base as `parent`), `models.retrieve` finds an
adapter, and a completion or chat completion whose `model` names an adapter answers under
that name. Prints one JSON object: the greedy completion text per model name, for the Rust
test to compare with its own reference.

Usage: python3 test_lora.py --base-url http://127.0.0.1:PORT/v1 --model BASE
           --adapters NAME[,NAME...] --prompt-ids 1,2,3
Exit status: 0 when every check passes, 1 on a failed check, 3 when the `openai` package is
missing or is not the release `--openai-version` names.
"""

import json

import driver  # exits 3 when the `openai` package is missing
from driver import check


def options(p):
    p.add_argument("--adapters", required=True)
    p.add_argument("--prompt-ids", required=True)


def main():
    a, client = driver.connect(options)
    adapters = a.adapters.split(",")
    prompt = [int(t) for t in a.prompt_ids.split(",")]
    cards = {m.id: m for m in client.models.list().data}
    check(list(cards) == [a.model] + adapters, f"models.list: {list(cards)}")
    for name in adapters:
        card = client.models.retrieve(name).model_dump()
        check(card["id"] == name and card["parent"] == a.model, f"retrieve {name}: {card}")
    texts = {}
    for name in [a.model] + adapters:
        r = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
        check(r.model == name, f"completion answered as {r.model}, asked {name}")
        texts[name] = r.choices[0].text
        chat = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hello"}], max_tokens=4,
            temperature=0)
        check(chat.model == name, f"chat answered as {chat.model}, asked {name}")
    print(json.dumps(texts))


driver.run(main)
