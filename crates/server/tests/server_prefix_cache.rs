//! The prefix cache over HTTP (ARCHITECTURE.md § Invariants, 4): a repeated prompt reports its
//! cached tokens in `usage.prompt_tokens_details.cached_tokens` and answers exactly as when cold —
//! for generation, for `echo` + `logprobs` scoring and for `/v1/score` with a context and several
//! continuations; `cache_salt` isolates tenants, in generation and in `/v1/score`; `POST
//! /reset_prefix_cache` empties it.

mod server_common;

use std::net::SocketAddr;

use serde_json::{json, Value};
use server_common::*;
use tandem_engine::engine::Engine;
use tandem_engine::SchedulerConfig;
use tandem_server::{RunningServer, ServerConfig};

/// A server on the fixture model with the prefix cache off: the independent reference.
fn uncached_server() -> RunningServer {
    let lm = load(&fixture_path());
    let mut config = SchedulerConfig::new(256, 16, 2048);
    config.eos_token_ids = lm.eos_token_ids.clone();
    config.enable_prefix_caching = false;
    let runner = cpu_runner(lm.host, &config);
    let engine = Engine::new(runner, config, 0).expect("engine");
    let mut c = ServerConfig::new("test-model");
    c.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    tandem_server::start(
        engine,
        std::sync::Arc::new(lm.tokenizer),
        lm.chat_template,
        c,
    )
    .expect("server starts")
}

/// 40 token ids: two full blocks of 16 and a partial one.
fn prompt() -> Vec<u32> {
    (0..40).map(|i| (i * 7 + 3) % 300 + 5).collect()
}

fn cached(body: &Value) -> u64 {
    body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {body}"))
}

fn complete(addr: SocketAddr, extra: Value) -> Value {
    let mut body = json!({"prompt": prompt(), "max_tokens": 6, "temperature": 0,
                          "ignore_eos": true, "logprobs": 3});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// The parts of a completion that must not depend on the cache.
fn result(body: &Value) -> Value {
    json!([body["choices"][0]["text"], body["choices"][0]["logprobs"]])
}

#[test]
fn cached_prompts_report_their_tokens_and_answer_identically() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let reference = uncached_server();
    let off = complete(reference.addr(), json!({}));
    assert_eq!(cached(&off), 0);
    let cold = complete(addr, json!({}));
    assert_eq!(cached(&cold), 0);
    assert_eq!(result(&cold), result(&off));
    let warm = complete(addr, json!({}));
    assert_eq!(cached(&warm), 32, "two full blocks of the 40-token prompt");
    assert_eq!(result(&warm), result(&cold));
    // `/metrics`: 80 prompt tokens looked up, 32 found (vLLM's counters).
    let m = get(addr, "/metrics");
    assert_eq!(m.status, 200, "{}", m.body);
    let value = |name: &str| -> f64 {
        let line = m
            .body
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {}", m.body));
        line.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a number")
    };
    assert_eq!(value("vllm:prefix_cache_queries_total"), 80.0);
    assert_eq!(value("vllm:prefix_cache_hits_total"), 32.0);

    // Tenants: another salt sees nothing; its own second request hits.
    let a = complete(addr, json!({"cache_salt": "tenant-a"}));
    assert_eq!(
        cached(&a),
        0,
        "a salted request never shares the unsalted blocks"
    );
    assert_eq!(result(&a), result(&cold));
    assert_eq!(
        cached(&complete(addr, json!({"cache_salt": "tenant-b"}))),
        0
    );
    assert_eq!(
        cached(&complete(addr, json!({"cache_salt": "tenant-a"}))),
        32
    );

    // Scoring through echo + logprobs with max_tokens 0 (lm-evaluation-harness).
    let echo = json!({"echo": true, "max_tokens": 0, "logprobs": 2});
    let first = complete(addr, echo.clone());
    let second = complete(addr, echo.clone());
    assert_eq!(cached(&second), 32);
    assert_eq!(result(&second), result(&first));
    assert_eq!(result(&second), result(&complete(reference.addr(), echo)));
    let lp = &second["choices"][0]["logprobs"]["token_logprobs"];
    assert_eq!(
        lp.as_array().map(Vec::len),
        Some(40),
        "every prompt token echoed"
    );

    // Reset: the next request is cold again, with the same answer.
    let r = post(addr, "/reset_prefix_cache", &json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["reset_blocks"].as_u64().is_some_and(|n| n > 0));
    let again = complete(addr, json!({}));
    assert_eq!(cached(&again), 0);
    assert_eq!(result(&again), result(&cold));

    // Streaming reports it in the usage chunk too.
    let body = json!({"prompt": prompt(), "max_tokens": 3, "temperature": 0, "stream": true,
                      "stream_options": {"include_usage": true}});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let frames = r.sse_data();
    let usage: Value = frames
        .iter()
        .filter(|f| f.as_str() != "[DONE]")
        .map(|f| serde_json::from_str::<Value>(f).expect("JSON frame"))
        .find(|v| !v["usage"].is_null())
        .expect("a usage chunk");
    assert_eq!(cached(&usage), 32);
    wait_health(addr, std::time::Duration::from_secs(10), idle);
}

#[test]
fn score_continuations_of_a_cached_context_equal_the_cold_scores() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let context: Vec<u32> = (0..50).map(|i| (i * 11 + 1) % 300 + 5).collect();
    let conts = json!([[7, 8, 9], [10, 11], [12, 13, 14, 15]]);
    let body = json!({"context": context, "continuations": conts, "top_logprobs": 2});
    let cold = post(addr, "/v1/score", &body);
    assert_eq!(cold.status, 200, "{}", cold.body);
    let warm = post(addr, "/v1/score", &body);
    assert_eq!(warm.status, 200, "{}", warm.body);
    assert_eq!(cold.json()["data"], warm.json()["data"]);
    let reference = uncached_server();
    let off = post(reference.addr(), "/v1/score", &body);
    assert_eq!(off.status, 200, "{}", off.body);
    assert_eq!(
        off.json()["data"],
        warm.json()["data"],
        "cache off = cache on"
    );
    // The same sequences scored whole (as `input`), with the context's scores dropped.
    for (i, c) in conts.as_array().expect("list").iter().enumerate() {
        let mut whole = context.clone();
        whole.extend(
            c.as_array()
                .expect("ids")
                .iter()
                .map(|v| v.as_u64().expect("id") as u32),
        );
        let r = post(
            addr,
            "/v1/score",
            &json!({"input": [whole], "top_logprobs": 2}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let full = &r.json()["data"][0];
        let part = &warm.json()["data"][i];
        let tail = |v: &Value, key: &str| -> Vec<Value> {
            let a = v[key].as_array().expect("array");
            a[a.len() - c.as_array().map_or(0, Vec::len)..].to_vec()
        };
        for key in ["token_logprobs", "ranks", "top_logprobs"] {
            assert_eq!(tail(full, key), tail(part, key), "continuation {i}: {key}");
        }
    }
}

/// `/v1/score` takes `cache_salt` as generation does: a salted score fills and reads only
/// its tenant's cached prefixes.
#[test]
fn a_salted_score_shares_cached_prefixes_only_with_its_salt() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let score = |salt: Value| {
        let r = post(
            addr,
            "/v1/score",
            &json!({"input": [prompt()], "cache_salt": salt}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["data"].clone()
    };
    let salted = score(json!("tenant-a"));
    assert_eq!(
        cached(&complete(addr, json!({}))),
        0,
        "an unsalted request never sees a salted score's blocks"
    );
    assert_eq!(
        cached(&complete(addr, json!({"cache_salt": "tenant-b"}))),
        0
    );
    assert_eq!(
        cached(&complete(addr, json!({"cache_salt": "tenant-a"}))),
        32,
        "the salted score filled its tenant's cache"
    );
    assert_eq!(score(json!("tenant-a")), salted, "warm = cold");
    wait_health(addr, std::time::Duration::from_secs(10), idle);
}

#[test]
fn bad_cache_salt_is_a_400_naming_the_field() {
    let server = start_server(&fixture_path(), |_| {});
    let long = "x".repeat(300);
    for salt in [json!(""), json!(long)] {
        for (path, body) in [
            (
                "/v1/completions",
                json!({"prompt": "hi", "max_tokens": 1, "cache_salt": salt}),
            ),
            ("/v1/score", json!({"input": "hi", "cache_salt": salt})),
        ] {
            let r = post(server.addr(), path, &body);
            assert_eq!(r.status, 400, "{path}: {}", r.body);
            assert_eq!(r.json()["error"]["param"], "cache_salt", "{path}");
        }
    }
}
