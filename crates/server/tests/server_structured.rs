//! Structured outputs over real HTTP: the official `openai` client and `jsonschema`
//! (tests/py/test_structured.py; pinned, installed on first use under the target directory)
//! against the default model (a real model, so JSON strings close): 8 JSON schemas x 13
//! seeds (104 requests) at temperature 1 validate, `json_object`, `structured_outputs` and
//! `guided_*` on both endpoints, stream ≡ non-stream, the client's `parse` with a Pydantic
//! model, 400s naming the field, tool calls (`required`, named, streamed, a result in the
//! history).
//! Plus the raw-HTTP 400s (grammars, the size limit, tools) and a dead end, without Python.

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
    assert_eq!(r.status, 500, "{}", r.body);
    assert!(r.body.contains("grammar allows no token"), "{}", r.body);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x", "guided_choice": ["x", "y"], "max_tokens": 8}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    wait_health(addr, std::time::Duration::from_secs(5), idle);
    server.shutdown().expect("clean shutdown");
}
