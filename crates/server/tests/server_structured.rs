//! Structured outputs over real HTTP: the official `openai` client and `jsonschema`
//! (tests/py/test_structured.py; pinned, installed on first use under the target directory)
//! against the default model (a real model, so JSON strings close): 8 JSON schemas x 13
//! seeds (104 requests) at temperature 1 validate, `json_object`, `structured_outputs` and
//! `guided_*` on both endpoints, stream ≡ non-stream, the client's `parse` with a Pydantic
//! model, 400s naming the field, tool calls (`required`, named, streamed, a result in the
//! history).
//! Plus the raw-HTTP 400s (grammars, the size limit, tools), a dead end, and grammars as deep
//! as the size limit allows, without Python.

mod server_common;

use serde_json::json;
use server_common::*;

#[test]
fn openai_client_structured_outputs_validate() {
    let server = start_server(&default_model_path(), |_| {});
    let stdout = python_env::run_script(
        server.addr(),
        "test_structured.py",
        "test-model",
        &["--rounds", "13"],
    );
    eprintln!("{stdout}");
    wait_health(server.addr(), std::time::Duration::from_secs(10), idle);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn bad_and_oversized_grammars_are_400s_naming_the_field() {
    let server = start_server(&fixture_path(), |c| c.limits.max_grammar_bytes = 64);
    let addr = server.addr();
    let cases = [
        (json!({"prompt": "x", "guided_regex": "("}), "guided_regex"),
        (
            json!({"prompt": "x", "structured_outputs": {"grammar": "start: nothing"}}),
            "structured_outputs",
        ),
        (
            json!({"prompt": "x", "guided_json": {"type": "object", "properties": {
                "a_very_long_property_name_that_is_over_the_limit": {"type": "string"}}}}),
            "guided_json",
        ),
    ];
    for (body, field) in cases {
        let r = post(addr, "/v1/completions", &body);
        assert_error(&r, 400, Some(field));
    }
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let tool = json!([{"type": "function", "function": {"name": "f"}}]);
    let chat_cases = [
        (
            json!({"messages": msgs, "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"messages": msgs, "tools": tool,
                   "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (json!({"messages": msgs, "tools": []}), "tools"),
        (
            json!({"messages": msgs, "tools": tool, "tool_choice": "required",
                   "guided_regex": "a"}),
            "tool_choice",
        ),
    ];
    for (body, field) in chat_cases {
        let r = post(addr, "/v1/chat/completions", &body);
        assert_error(&r, 400, Some(field));
    }
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x", "guided_choice": ["left", "right"], "max_tokens": 8,
                "temperature": 1.0, "seed": 3}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.json()["choices"][0]["text"].as_str().map(str::to_string);
    assert!(
        matches!(text.as_deref(), Some("left" | "right")),
        "{}",
        r.body
    );
    server.shutdown().expect("clean shutdown");
}

#[test]
fn a_grammar_dead_end_fails_that_request_only() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    // Complete after "x", while min_tokens forbids EOS: no token is allowed.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x", "guided_choice": ["x"], "min_tokens": 5, "max_tokens": 8}),
    );
    // The request's own mistake, found while generating: a 400, not a fault of the server.
    assert_error(&r, 400, None);
    assert!(r.body.contains("grammar allows no token"), "{}", r.body);
    // Streamed, the 200 has gone out: the error arrives as a frame with the same body.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x", "guided_choice": ["x"], "min_tokens": 5, "max_tokens": 8,
                "stream": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let frames = r.sse_data();
    let error = frames
        .iter()
        .filter_map(|f| serde_json::from_str::<serde_json::Value>(f).ok())
        .find(|v| v["error"].is_object())
        .unwrap_or_else(|| panic!("no error frame: {frames:?}"));
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x", "guided_choice": ["x", "y"], "max_tokens": 8}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    wait_health(addr, std::time::Duration::from_secs(5), idle);
    server.shutdown().expect("clean shutdown");
}

/// A chain of Lark rules and one of schema `$ref`s, each just under the default 64 KiB
/// limit: llguidance recurses through such chains, which overflowed the stack of the thread
/// compiling them and aborted the server. Both compile and constrain their completions.
#[test]
fn grammars_as_deep_as_the_size_limit_allows_are_served() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let limit = tandem_server::limits::DEFAULT_MAX_GRAMMAR_BYTES;
    let rules = (limit - 100) / "r0000: r0001\n".len();
    let lark: String = (0..rules)
        .map(|i| format!("r{i:04}: r{:04}\n", i + 1))
        .chain([format!("start: r0000\nr{rules:04}: \"a\"\n")])
        .collect();
    let refs = (limit - 100) / r##""d0000":{"$ref":"#/$defs/d0001"},"##.len();
    let mut defs: serde_json::Map<String, serde_json::Value> = (0..refs)
        .map(|i| {
            (
                format!("d{i:04}"),
                json!({"$ref": format!("#/$defs/d{:04}", i + 1)}),
            )
        })
        .collect();
    defs.insert(format!("d{refs:04}"), json!({"type": "integer"}));
    let schema = json!({"$ref": "#/$defs/d0000", "$defs": defs});
    let cases = [
        json!({"structured_outputs": {"grammar": lark}}),
        json!({"guided_json": schema}),
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let mut body = json!({"prompt": "x", "max_tokens": 12, "temperature": 1.0, "seed": 7});
        body.as_object_mut()
            .expect("an object")
            .extend(case.as_object().expect("an object").clone());
        let r = post(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let text = r.json()["choices"][0]["text"].as_str().map(str::to_string);
        let text = text.expect("a text");
        let allowed = if i == 0 {
            text == "a"
        } else {
            text.is_empty()
                || text
                    .trim_start_matches('-')
                    .chars()
                    .all(|c| c.is_ascii_digit())
        };
        assert!(allowed, "{text:?}");
    }
    wait_health(addr, std::time::Duration::from_secs(5), idle);
    server.shutdown().expect("clean shutdown");
}
