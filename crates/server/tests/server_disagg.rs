//! Disaggregated prefill over HTTP (ARCHITECTURE.md § KV transfer): a decode server with
//! `prefill_peer` has each prompt computed by a server with `kv_producer`, adopts the blocks
//! it answers, and answers every request bitwise as one server alone does (seeded sampling,
//! logprobs, `n > 1`, streaming, chat); a peer that is down or refuses leaves the prompt to
//! the decode server, with the same answer; `POST /v1/kv/prefill` refuses bad input with 4xx
//! and exists only with `kv_producer`; a server of either role without a prefix cache does not start.

mod server_common;

use std::io::{BufReader, Read};
use std::net::SocketAddr;

use serde_json::{json, Value};
use server_common::*;
use tandem_engine::kv_transfer::KvPayload;
use tandem_server::RunningServer;

/// 40 token ids: two full blocks of 16 and a partial one.
fn prompt() -> Vec<u32> {
    (0..40).map(|i| (i * 7 + 3) % 300 + 5).collect()
}

fn producer() -> RunningServer {
    start_server(&fixture_path(), |c| c.kv_producer = true)
}

fn decoder(peer: SocketAddr) -> RunningServer {
    start_server(&fixture_path(), |c| {
        c.prefill_peers = vec![peer.to_string()]
    })
}

fn completion(addr: SocketAddr, extra: Value) -> Value {
    let mut body = json!({"prompt": prompt(), "max_tokens": 6, "temperature": 0.9, "seed": 11,
                          "ignore_eos": true, "logprobs": 2, "n": 2});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn cached(body: &Value) -> u64 {
    body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {body}"))
}

/// The parts of an answer that must not depend on where the prompt was computed.
fn choices(body: &Value) -> Value {
    let mut c = body["choices"].clone();
    for choice in c.as_array_mut().expect("choices") {
        choice.as_object_mut().map(|o| o.remove("index"));
    }
    c
}

/// A counter of `/metrics`.
fn metric(addr: SocketAddr, name: &str) -> f64 {
    let m = get(addr, "/metrics");
    assert_eq!(m.status, 200, "{}", m.body);
    let line = m
        .body
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .unwrap_or_else(|| panic!("no {name} in\n{}", m.body));
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("value")
}

/// `tandem:kv_transfer_{name}` of `/metrics`.
fn kv(addr: SocketAddr, name: &str) -> f64 {
    metric(addr, &format!("tandem:kv_transfer_{name}"))
}

#[test]
fn a_decode_server_answers_as_one_server_from_its_peers_blocks() {
    let (peer, alone) = (producer(), start_server(&fixture_path(), |_| {}));
    let decode = decoder(peer.addr());
    let want = completion(alone.addr(), json!({}));
    let got = completion(decode.addr(), json!({}));
    assert_eq!(choices(&got), choices(&want));
    assert_eq!(cached(&got), 32, "the peer's two full blocks are adopted");
    assert_eq!(kv(decode.addr(), "blocks_imported_total"), 2.0);
    assert_eq!(kv(peer.addr(), "prefills_total"), 1.0);
    assert_eq!(kv(peer.addr(), "blocks_sent_total"), 2.0);

    let chat = json!({"messages": [{"role": "user", "content": "tell me about the weather in \
                      the mountains in spring, and what to pack for a long walk"}],
                      "max_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let want = post(alone.addr(), "/v1/chat/completions", &chat).json();
    let got = post(decode.addr(), "/v1/chat/completions", &chat).json();
    assert_eq!(choices(&got), choices(&want), "chat");
    assert!(cached(&got) >= 16, "{got}");

    let stream = json!({"stream": true, "n": 1, "prompt": [prompt(), prompt()[..33].to_vec()]});
    let frames = |addr| post(addr, "/v1/completions", &completion_body(&stream)).body;
    let (want, got) = (frames(alone.addr()), frames(decode.addr()));
    let text = |s: &str, i| stream_text(&data_frames(s), i);
    for i in 0..2 {
        assert_eq!(text(&got, i), text(&want, i), "streamed prompt {i}");
    }
    assert_eq!(kv(decode.addr(), "failures_total"), 0.0);
}

fn completion_body(extra: &Value) -> Value {
    let mut body = json!({"prompt": prompt(), "max_tokens": 6, "temperature": 0.9, "seed": 11,
                          "ignore_eos": true, "logprobs": 2});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

fn data_frames(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn without_a_working_peer_the_decode_server_computes_the_prompt_itself() {
    let alone = start_server(&fixture_path(), |_| {});
    let want = completion(alone.addr(), json!({}));
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone = closed.local_addr().expect("addr");
    drop(closed);
    let not_a_producer = start_server(&fixture_path(), |_| {});
    for peer in [gone, not_a_producer.addr()] {
        let decode = decoder(peer);
        for hit in [0, 32] {
            let got = completion(decode.addr(), json!({}));
            assert_eq!(choices(&got), choices(&want), "peer {peer}");
            assert_eq!(cached(&got), hit, "computed here, then cached here");
        }
        let got = completion(decode.addr(), json!({"prompt": prompt()[3..].to_vec()}));
        assert_eq!(cached(&got), 0, "peer {peer}");
        let failures = kv(decode.addr(), "failures_total");
        assert_eq!(failures, 2.0, "peer {peer}");
        let fetches = kv(decode.addr(), "fetches_total");
        assert_eq!(
            fetches, 1.0,
            "after a failure the peer is left alone for a while"
        );
    }
}

/// `POST /v1/kv/prefill`'s raw answer: status and body bytes.
fn prefill(addr: SocketAddr, body: &Value) -> (u16, Vec<u8>) {
    let s = send(addr, "POST", "/v1/kv/prefill", &[], &body.to_string());
    let mut r = BufReader::new(s);
    let (status, _) = read_head(&mut r);
    let mut bytes = Vec::new();
    r.read_to_end(&mut bytes).expect("body");
    (status, bytes)
}

#[test]
fn the_prefill_route_answers_whole_blocks_and_refuses_bad_input() {
    let peer = producer();
    let (status, bytes) = prefill(peer.addr(), &json!({"prompt_token_ids": prompt()}));
    assert_eq!(status, 200);
    let payload = KvPayload::decode(bytes).expect("the wire form");
    assert_eq!(payload.num_blocks(), 2);
    assert_eq!(payload.format().block_size, 16);
    let refused = |body: Value, status: u16, param: Option<&str>| {
        let r = post(peer.addr(), "/v1/kv/prefill", &body);
        assert_error(&r, status, param);
    };
    refused(
        json!({"prompt_token_ids": []}),
        400,
        Some("prompt_token_ids"),
    );
    refused(
        json!({"prompt_token_ids": [1, 99999]}),
        400,
        Some("prompt_token_ids"),
    );
    refused(
        json!({"prompt_token_ids": "abc"}),
        400,
        Some("prompt_token_ids"),
    );
    refused(json!({}), 400, Some("prompt_token_ids"));
    refused(
        json!({"model": "other", "prompt_token_ids": [1, 2]}),
        404,
        Some("model"),
    );
    let idle = |h: &Value| idle(h);
    wait_health(peer.addr(), std::time::Duration::from_secs(10), idle);

    let plain = start_server(&fixture_path(), |_| {});
    let r = post(
        plain.addr(),
        "/v1/kv/prefill",
        &json!({"prompt_token_ids": [1, 2]}),
    );
    assert_error(&r, 404, None);
}

#[test]
fn both_roles_need_the_prefix_cache_and_a_peer_needs_an_address() {
    let (engine, tokenizer, template) = engine_with(load(&fixture_path()), 64, |c| {
        c.enable_prefix_caching = false
    });
    let mut config = tandem_server::ServerConfig::new("test-model");
    config.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    config.prefill_peers = vec!["127.0.0.1:9".into()];
    let Err(err) = tandem_server::start(engine, tokenizer, template, config) else {
        panic!("a decode server without a prefix cache started");
    };
    assert!(err.to_string().contains("prefix cache"), "{err}");
    let (engine, tokenizer, template) = engine_with(load(&fixture_path()), 64, |c| {
        c.enable_prefix_caching = false
    });
    let mut config = tandem_server::ServerConfig::new("test-model");
    config.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    config.kv_producer = true;
    let Err(err) = tandem_server::start(engine, tokenizer, template, config) else {
        panic!("a prefill server without a prefix cache started");
    };
    assert!(err.to_string().contains("prefix cache"), "{err}");
    for bad in ["localhost", "http://127.0.0.1:9", "127.0.0.1:9/x", ""] {
        let e = tandem_server::prefill_peer::peer_uri(bad).expect_err(bad);
        assert!(e.contains("host:port"), "{e}");
    }
}

#[test]
fn blocks_cached_on_the_decode_server_are_neither_fetched_nor_sent() {
    let (peer, alone) = (producer(), start_server(&fixture_path(), |_| {}));
    let decode = decoder(peer.addr());
    let received = || kv(decode.addr(), "blocks_received_total");
    completion(decode.addr(), json!({}));
    assert_eq!(received(), 2.0);
    let again = completion(decode.addr(), json!({}));
    assert_eq!(cached(&again), 32);
    assert_eq!(kv(decode.addr(), "cached_here_total"), 1.0);
    assert_eq!(kv(decode.addr(), "fetches_total"), 1.0);
    // A longer prompt (a conversation's next turn): only its new blocks travel.
    let longer: Vec<u32> = prompt()
        .into_iter()
        .chain((0..40).map(|i| i * 3 + 7))
        .collect();
    let extra = json!({"prompt": longer});
    let got = completion(decode.addr(), extra.clone());
    assert_eq!(
        received(),
        4.0,
        "blocks 2 and 3 only (4 would not be adopted)"
    );
    let failures = kv(decode.addr(), "failures_total");
    assert_eq!(failures, 0.0);
    assert_eq!(cached(&got), 64);
    assert_eq!(choices(&got), choices(&completion(alone.addr(), extra)));
}

#[test]
fn prompts_spread_over_several_peers_and_go_around_a_failed_one() {
    let (first, second, alone) = (
        producer(),
        producer(),
        start_server(&fixture_path(), |_| {}),
    );
    let peers = vec![first.addr().to_string(), second.addr().to_string()];
    let decode = start_server(&fixture_path(), |c| c.prefill_peers = peers);
    for shift in [0, 5] {
        let extra = json!({"prompt": prompt()[shift..].to_vec()});
        let got = completion(decode.addr(), extra.clone());
        assert_eq!(cached(&got), 32);
        assert_eq!(choices(&got), choices(&completion(alone.addr(), extra)));
    }
    for peer in [&first, &second] {
        let sent = kv(peer.addr(), "prefills_total");
        assert_eq!(sent, 1.0, "one prompt each");
    }

    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let peers = vec![gone, first.addr().to_string()];
    let decode = start_server(&fixture_path(), |c| c.prefill_peers = peers);
    for shift in [1, 2, 3] {
        let got = completion(decode.addr(), json!({"prompt": prompt()[shift..].to_vec()}));
        assert_eq!(cached(&got), 32, "the working peer answers");
    }
    assert_eq!(kv(decode.addr(), "failures_total"), 0.0);
    let errors = kv(decode.addr(), "peer_errors_total");
    assert_eq!(errors, 1.0, "tried once, then rested");
    assert_eq!(kv(decode.addr(), "fetches_total"), 4.0);
}

#[test]
fn a_prompt_the_engine_refuses_costs_the_peer_nothing() {
    let peer = producer();
    let decode = decoder(peer.addr());
    let max_len = tandem_model::loader::load_model(&fixture_path())
        .expect("fixture")
        .host
        .config
        .context_len
        .min(2048);
    let long: Vec<u32> = (0..max_len as u32).map(|i| i % 300 + 5).collect();
    let r = post(
        decode.addr(),
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 4}),
    );
    assert_error(&r, 400, Some("prompt"));
    assert_eq!(kv(decode.addr(), "fetches_total"), 0.0);
    assert_eq!(kv(peer.addr(), "prefills_total"), 0.0);
}
