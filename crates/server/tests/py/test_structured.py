#!/usr/bin/env python3
"""Checks tandem's structured outputs with the official `openai` client and `jsonschema`.

Usage: python3 test_structured.py --base-url http://127.0.0.1:PORT/v1 --model NAME
         [--rounds R] [--openai-version V]

Against a server running a real (small) model: `response_format` JSON schemas of many shapes
at temperature 1 always validate; `json_object`, vLLM's `structured_outputs` and the older
`guided_*` fields (regex, choice, grammar) on both endpoints; streaming equals non-streaming
for seeded requests; the client's `parse` helper with a Pydantic model; a bad schema, regex
or grammar is a 400 naming the field. Tool calls: `tool_choice` `required` and a named
function always give calls whose arguments validate, streamed fragments assemble to the
same calls, and a call's result in the history renders.

Exit status: 0 when every check passes, 1 on a failed check, 3 when a package is missing.
"""

import json
import re
import sys
from typing import Literal

import driver  # exits 3 when the `openai` package is missing
from driver import check

try:
    import jsonschema
    import openai
    import pydantic
except ImportError as e:
    print(f"a Python package is missing: {e}", file=sys.stderr)
    sys.exit(3)


S = {"type": "string", "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0,
                                                         "maximum": 150}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"city": S, "address": {
        "type": "object", "properties": {"street": S, "zip": {"type": "string",
                                                              "pattern": "^[0-9]{5}$"}},
        "required": ["street", "zip"], "additionalProperties": False}},
     "required": ["city", "address"], "additionalProperties": False},
    {"type": "object", "properties": {"colors": {"type": "array", "items": {
        "enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4}},
     "required": ["colors"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [
        {"type": "integer", "minimum": -5, "maximum": 5}, {"type": "boolean"},
        {"type": "string", "minLength": 2, "maxLength": 5}]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                      "ok": {"type": "boolean"}},
     "required": ["when", "ok"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 99}, "tag": S},
        "required": ["id", "tag"], "additionalProperties": False},
     "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"kind": {"const": "point"}, "xy": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2, "maxItems": 2}},
     "required": ["kind", "xy"], "additionalProperties": False},
    {"$defs": {"item": {"type": "object", "properties": {"n": S},
                        "required": ["n"], "additionalProperties": False}},
     "type": "object", "properties": {"items": {"type": "array", "items": {
         "$ref": "#/$defs/item"}, "maxItems": 2}},
     "required": ["items"], "additionalProperties": False},
]


def schemas(client, model, rounds):
    n = 0
    for i, schema in enumerate(SCHEMAS):
        for seed in range(rounds):
            fmt = {"type": "json_schema",
                   "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
            r = client.chat.completions.create(
                model=model, temperature=1.0, seed=seed, max_tokens=200,
                messages=[{"role": "user", "content": "Reply with JSON."}],
                response_format=fmt)
            text = r.choices[0].message.content
            check(r.choices[0].finish_reason == "stop",
                  f"schema {i} seed {seed}: finish {r.choices[0].finish_reason}: {text!r}")
            try:
                jsonschema.validate(json.loads(text), schema)
            except (ValueError, jsonschema.ValidationError) as e:
                raise AssertionError(f"schema {i} seed {seed}: {text!r}: {e}")
            n += 1
    return n


def json_object_and_stream(client, model):
    args = dict(model=model, temperature=1.0, seed=7, max_tokens=200,
                messages=[{"role": "user", "content": "Give a JSON object describing a cat."}],
                response_format={"type": "json_schema", "json_schema": {
                    "name": "cat", "schema": SCHEMAS[0]}})
    full = client.chat.completions.create(**args).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(stream=True, **args)
                       if c.choices)
    check(streamed == full, f"stream {streamed!r} != non-stream {full!r}")
    r = client.chat.completions.create(
        model=model, temperature=0, max_tokens=300,
        messages=[{"role": "user", "content": "Give a JSON object with a name."}],
        response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(r.choices[0].message.content), dict), "json_object")


def completions_fields(client, model):
    rx = "[a-z]{2,8}@[a-z]{2,6}\\.(com|org)"
    cases = [
        ({"guided_regex": rx}, lambda t: re.fullmatch(rx, t)),
        ({"structured_outputs": {"regex": rx}}, lambda t: re.fullmatch(rx, t)),
        ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
        ({"structured_outputs": {"choice": ["red", "blue"]}}, lambda t: t in ("red", "blue")),
        ({"guided_grammar": 'start: "a" bc bc? "!"\nbc: "b" | "c"'},
         lambda t: re.fullmatch("a[bc]{1,2}!", t)),
        ({"guided_json": SCHEMAS[2]},
         lambda t: jsonschema.validate(json.loads(t), SCHEMAS[2]) is None),
    ]
    for extra, ok in cases:
        for seed in range(3):
            r = client.completions.create(model=model, prompt="The answer is", max_tokens=60,
                                          temperature=1.0, seed=seed, extra_body=extra)
            t = r.choices[0].text
            check(r.choices[0].finish_reason == "stop" and ok(t), f"{extra}: {t!r}")
            s = "".join(c.choices[0].text for c in client.completions.create(
                model=model, prompt="The answer is", max_tokens=60, temperature=1.0,
                seed=seed, stream=True, extra_body=extra) if c.choices)
            check(s == t, f"{extra}: stream {s!r} != {t!r}")


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=10)
    age: int = pydantic.Field(ge=0, le=120)
    pets: list[Literal["cat", "dog", "fish"]] = pydantic.Field(max_length=2)


def parse_helper(client, model):
    chat = getattr(client, "chat").completions
    parse = getattr(chat, "parse", None) or client.beta.chat.completions.parse
    for seed in range(3):
        r = parse(model=model, temperature=1.0, seed=seed, max_tokens=200,
                  messages=[{"role": "user", "content": "Describe a person as JSON."}],
                  response_format=Person)
        p = r.choices[0].message.parsed
        check(isinstance(p, Person), f"parsed {p!r}")


WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 2, "maxLength": 20},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["tz"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMA_OF = {"get_weather": WEATHER, "get_time": TIME}


def tool_calls(client, model):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, finish in (("required", "tool_calls"), (named, "stop")):
        for seed in range(4):
            args = dict(model=model, messages=ask, tools=TOOLS, tool_choice=choice,
                        temperature=1.0, seed=seed, max_tokens=120)
            r = client.chat.completions.create(**args)
            c = r.choices[0]
            check(c.finish_reason == finish, f"{choice}: finish {c.finish_reason}: {c.message}")
            calls = c.message.tool_calls
            check(calls and len(calls) == 1, f"{choice}: calls {c.message}")
            name = calls[0].function.name
            check(choice == "required" or name == "get_weather", f"named: {name}")
            jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMA_OF[name])
            parts = {}
            for chunk in client.chat.completions.create(stream=True, **args):
                for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    p = parts.setdefault(d.index, {"name": "", "arguments": ""})
                    p["name"] += d.function.name or ""
                    p["arguments"] += d.function.arguments or ""
            check(parts == {0: {"name": name, "arguments": calls[0].function.arguments}},
                  f"{choice}: streamed {parts} != {calls}")
    # Logprobs asked for: a streamed tool call carries those of the whole answer.
    args = dict(model=model, messages=ask, tools=TOOLS, tool_choice="required",
                temperature=1.0, seed=0, max_tokens=120, logprobs=True)
    whole = client.chat.completions.create(**args).choices[0].logprobs.content
    streamed = [t for chunk in client.chat.completions.create(stream=True, **args)
                if chunk.choices and chunk.choices[0].logprobs
                for t in chunk.choices[0].logprobs.content]
    pairs = lambda ts: [(t.token, t.logprob) for t in ts]
    check(whole and pairs(streamed) == pairs(whole),
          f"streamed logprobs {pairs(streamed)} != {pairs(whole)}")
    # The call and its result in the history, then an answer.
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather",
                         "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}
    history = ask + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"}]
    r = client.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                       tool_choice="none", max_tokens=30, temperature=0)
    check(isinstance(r.choices[0].message.content, str) and not r.choices[0].message.tool_calls,
          f"answer after the tool result: {r.choices[0].message}")
    r = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=60,
                                       temperature=0)
    check(r.choices[0].finish_reason in ("stop", "tool_calls", "length"), "auto")


def errors(client, model):
    cases = [
        (dict(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "nonsense"}}}), "response_format"),
        (dict(extra_body={"guided_regex": "(unclosed"}), "guided_regex"),
        (dict(extra_body={"guided_grammar": "start: missing"}), "guided_grammar"),
        (dict(extra_body={"structured_outputs": {"json": "{not json"}}), "structured_outputs"),
        (dict(extra_body={"guided_regex": "a", "guided_choice": ["b"]}), "guided_choice"),
    ]
    for kwargs, param in cases:
        try:
            client.chat.completions.create(
                model=model, max_tokens=4,
                messages=[{"role": "user", "content": "x"}], **kwargs)
        except openai.BadRequestError as e:
            check(isinstance(e.body, dict) and e.body.get("param") == param,
                  f"{kwargs}: body {e.body}")
        else:
            raise AssertionError(f"no error for {kwargs}")


def main():
    a, client = driver.connect(lambda p: p.add_argument("--rounds", type=int, default=4),
                               timeout=300)
    errors(client, a.model)
    n = schemas(client, a.model, a.rounds)
    json_object_and_stream(client, a.model)
    completions_fields(client, a.model)
    parse_helper(client, a.model)
    tool_calls(client, a.model)
    print(f"structured output checks passed ({n} schema requests)")


if __name__ == "__main__":
    driver.run(main)
