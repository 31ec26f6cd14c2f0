//! The configurable bounds on requests (`ServerConfig::limits`, the `tandem serve --max-*`
//! flags) over real HTTP: each bound refuses one past it with a 400 naming the field, admits
//! the request at it, and leaves the engine idle.

mod server_common;

use serde_json::{json, Value};
use server_common::*;
use tandem_server::limits::RequestLimits;

fn tight() -> RequestLimits {
    RequestLimits {
        max_n: 2,
        max_output_tokens: Some(6),
        max_prompt_tokens: Some(40),
        max_prompts: 2,
        max_stop_strings: 2,
        max_stop_length: 4,
        max_logit_bias: 2,
        max_top_logprobs: 3,
        max_score_items: 2,
        ..RequestLimits::default()
    }
}

fn with(base: Value, extra: Value) -> Value {
    let mut b = base;
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

#[test]
fn each_bound_refuses_one_past_it_naming_the_field_and_admits_it_at_the_bound() {
    let server = start_server(&fixture_path(), |c| c.limits = tight());
    let addr = server.addr();
    let base = json!({"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0});
    let completion = |extra: Value| post(addr, "/v1/completions", &with(base.clone(), extra));
    // (past the bound, at the bound, field)
    let cases = [
        (json!({"n": 3}), json!({"n": 2}), "n"),
        (
            json!({"max_tokens": 7}),
            json!({"max_tokens": 6}),
            "max_tokens",
        ),
        (
            json!({"prompt": vec![5u32; 41]}),
            json!({"prompt": vec![5u32; 40]}),
            "prompt",
        ),
        (
            json!({"prompt": [[5], [6], [7]]}),
            json!({"prompt": [[5], [6]]}),
            "prompt",
        ),
        (
            json!({"stop": ["a", "b", "c"]}),
            json!({"stop": ["a", "b"]}),
            "stop",
        ),
        (json!({"stop": "abcde"}), json!({"stop": "abcd"}), "stop"),
        (
            json!({"logit_bias": {"1": 1, "2": 1, "3": 1}}),
            json!({"logit_bias": {"1": 1, "2": 1}}),
            "logit_bias",
        ),
        (json!({"logprobs": 4}), json!({"logprobs": 3}), "logprobs"),
        (
            json!({"prompt_logprobs": 4}),
            json!({"prompt_logprobs": 3}),
            "prompt_logprobs",
        ),
    ];
    for (past, at, field) in cases {
        assert_error(&completion(past.clone()), 400, Some(field));
        let r = completion(at.clone());
        assert_eq!(r.status, 200, "{at}: {}", r.body);
    }
    // Ids outside the 320-token vocabulary are refused whatever the bounds.
    assert_error(
        &completion(json!({"logit_bias": {"320": 1}})),
        400,
        Some("logit_bias"),
    );
    // stream_options only with stream.
    assert_error(
        &completion(json!({"stream_options": {"include_usage": true}})),
        400,
        Some("stream_options"),
    );

    let msgs = json!([{"role": "user", "content": "hi"}]);
    let chat = |extra: Value| {
        let b = with(json!({"messages": msgs, "temperature": 0}), extra);
        post(addr, "/v1/chat/completions", &b)
    };
    assert_error(
        &chat(json!({"max_completion_tokens": 7})),
        400,
        Some("max_completion_tokens"),
    );
    assert_error(
        &chat(json!({"logprobs": true, "top_logprobs": 4})),
        400,
        Some("top_logprobs"),
    );
    let long = json!([{"role": "user", "content": "a b c d e f g h i j ".repeat(6)}]);
    assert_error(&chat(json!({"messages": long})), 400, Some("messages"));
    // Chat without max_tokens gets the rest of the context, capped by the bound.
    let r = chat(json!({"ignore_eos": true}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 6, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let score = |input: Value| post(addr, "/v1/score", &json!({"input": input}));
    assert_error(&score(json!([[5, 6], [7, 8], [9, 10]])), 400, Some("input"));
    assert_error(&score(json!([vec![5u32; 41]])), 400, Some("input"));
    assert_eq!(score(json!([[5, 6], [7, 8]])).status, 200);

    assert!(idle(&get(addr, "/health").json()));
    server.shutdown().expect("clean shutdown");
}

#[test]
fn prompts_beyond_the_context_are_refused_even_without_a_bound() {
    // The fixture's context is 256 tokens.
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": vec![5u32; 256], "max_tokens": 1}),
    );
    assert_error(&r, 400, Some("prompt"));
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": vec![5u32; 250], "max_tokens": 7}),
    );
    assert_error(&r, 400, Some("max_tokens"));
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": vec![5u32; 255], "max_tokens": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    server.shutdown().expect("clean shutdown");
}

/// A body that names a key twice is refused (serde would keep the last value silently), on
/// every JSON route and at any depth; the same keys in different objects are fine.
#[test]
fn repeated_keys_in_a_body_are_a_400() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let json = [("Content-Type", "application/json")];
    let cases = [
        (
            "/v1/completions",
            r#"{"prompt": "hi", "max_tokens": 1, "max_tokens": 64}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "role": "system", "content": "hi"}], "max_tokens": 1}"#,
        ),
        ("/v1/score", r#"{"input": "hi", "input": "there"}"#),
    ];
    for (path, body) in cases {
        let r = request(addr, "POST", path, &json, body);
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(msg.contains("appears twice"), "{path}: {msg}");
    }
    let ok = r#"{"prompt": "hi", "max_tokens": 1, "logit_bias": {"5": 1}, "stream_options": null}"#;
    assert_eq!(
        request(addr, "POST", "/v1/completions", &json, ok).status,
        200
    );
    assert!(idle(&get(addr, "/health").json()));
    server.shutdown().expect("clean shutdown");
}

/// A chat template from the model file (untrusted input) that never ends fails each chat
/// request with a 500 (the model's fault, not the request's) within its budget, instead of
/// holding a request thread for hours; completions and later chats are served.
#[test]
fn a_chat_template_that_never_ends_fails_its_requests_and_nothing_else() {
    let hostile =
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let server = start_server_with_template(&fixture_path(), hostile);
    let addr = server.addr();
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for path in ["/v1/chat/completions", "/tokenize"] {
        let r = post(addr, path, &chat);
        assert_error(&r, 500, None);
        assert!(r.body.contains("fuel"), "{}", r.body);
    }
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(idle(&get(addr, "/health").json()));
    server.shutdown().expect("clean shutdown");
}

/// `chat_template_kwargs` reach the template as variables (as in vLLM: Qwen3's
/// `enable_thinking`), and may not replace its own inputs or functions (400 naming the
/// field).
#[test]
fn chat_template_kwargs_are_template_variables_but_not_its_own() {
    let template = "{% if enable_thinking %}<think>{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}";
    let server = start_server_with_template(&fixture_path(), template);
    let addr = server.addr();
    let body = |kwargs: serde_json::Value| {
        json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1,
               "chat_template_kwargs": kwargs})
    };
    let prompt_tokens = |kwargs: serde_json::Value| {
        let r = post(addr, "/v1/chat/completions", &body(kwargs));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens"]
            .as_u64()
            .expect("a count")
    };
    let plain = prompt_tokens(json!({}));
    assert_eq!(prompt_tokens(json!({"enable_thinking": false})), plain);
    let thinking = prompt_tokens(json!({"enable_thinking": true}));
    assert!(thinking > plain);
    // `/tokenize` counts the same prompt.
    let r = post(addr, "/tokenize", &body(json!({"enable_thinking": true})));
    assert_eq!(r.json()["count"].as_u64(), Some(thinking), "{}", r.body);
    for kwargs in [
        json!({"messages": []}),
        json!({"add_generation_prompt": false}),
        json!({"bos_token": "<|im_start|>"}),
        json!({"raise_exception": 1}),
        json!({"range": "x"}),
        json!(["enable_thinking"]),
    ] {
        let r = post(addr, "/v1/chat/completions", &body(kwargs));
        assert_error(&r, 400, Some("chat_template_kwargs"));
    }
    assert!(idle(&get(addr, "/health").json()));
    server.shutdown().expect("clean shutdown");
}
