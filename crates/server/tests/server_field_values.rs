//! Every field of the generation and scoring routes with values of every JSON type and at the edges
//! (null, booleans, 0, -1, huge numbers, NaN-like strings, empty and long strings, empty and
//! nested lists and objects): each answer is a 2xx or a 4xx with an OpenAI-style error body,
//! never a 5xx, and the engine is idle afterwards (no request or KV block left behind).

mod server_common;

use serde_json::{json, Value};
use server_common::*;

/// Values of every JSON type and at the edges of their ranges.
fn values() -> Vec<Value> {
    vec![
        Value::Null,
        json!(true),
        json!(false),
        json!(0),
        json!(-1),
        json!(1),
        json!(3),
        json!(0.5),
        json!(-0.0),
        json!(1e308),
        json!(-1e308),
        json!(i64::MAX),
        json!(u64::MAX),
        json!(""),
        json!("NaN"),
        json!("x".repeat(5000)),
        json!("<|im_end|>"),
        json!([]),
        json!([""]),
        json!([null]),
        json!([1, -1, 1e9]),
        json!([[]]),
        json!(["a", "b", "c", "d", "e", "f"]),
        json!({}),
        json!({"": 1}),
        json!({"5": 100, "7": -100}),
        json!({"type": "text"}),
        json!({"a": {"b": {"c": [1, {"d": null}]}}}),
    ]
}

const COMPLETION_FIELDS: [&str; 38] = [
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "user",
    "best_of",
    "use_beam_search",
    "cache_salt",
    "length_penalty",
    "logprobs",
    "echo",
    "prompt_logprobs",
    "suffix",
    "add_special_tokens",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "priority",
];

const CHAT_FIELDS: [&str; 12] = [
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "add_generation_prompt",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "n",
    "stop",
    "chat_template_kwargs",
];

const SCORE_FIELDS: [&str; 7] = [
    "input",
    "context",
    "continuations",
    "top_logprobs",
    "add_special_tokens",
    "cache_salt",
    "model",
];

/// Posts `base` with `field` set to each value; asserts no answer is a 5xx and every error
/// has an OpenAI-style body.
fn probe(addr: std::net::SocketAddr, path: &str, base: &Value, fields: &[&str]) -> usize {
    let mut refused = 0;
    for field in fields {
        for value in values() {
            let mut body = base.clone();
            body[*field] = value.clone();
            let r = post(addr, path, &body);
            assert!(
                r.status < 500,
                "{path} {field}={value}: {} {}",
                r.status,
                r.body
            );
            if r.status >= 400 {
                assert_error(&r, r.status, None);
                refused += 1;
            }
        }
    }
    refused
}

#[test]
fn no_field_value_gets_a_server_error_or_leaves_work_behind() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let completion = json!({"prompt": "hi", "max_tokens": 2});
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let refused = probe(addr, "/v1/completions", &completion, &COMPLETION_FIELDS)
        + probe(addr, "/v1/chat/completions", &chat, &CHAT_FIELDS)
        + probe(
            addr,
            "/v1/score",
            &json!({"input": "hi there"}),
            &SCORE_FIELDS,
        );
    // The probe reaches validation, not only the happy path.
    assert!(refused > 300, "{refused} refused");
    wait_health(addr, std::time::Duration::from_secs(30), idle);
    server.shutdown().expect("clean shutdown");
}
