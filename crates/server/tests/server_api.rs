//! The HTTP API over real sockets with the small fixture model: completions and chat,
//! stream ≡ non-stream, agreement with the engine driven directly, seeds, stop strings,
//! logprobs, tokenizer routes, error bodies, the API key.

mod server_common;

use serde_json::{json, Value};
use server_common::*;
use tandem_engine::engine::{EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::RequestParams;
use tandem_model::batch::TokenId;

/// Greedy ids for `prompt` from an engine driven directly (the reference).
fn reference_greedy(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let (mut engine, _, _) = engine(load(&fixture_path()), 64);
    let id = engine
        .add_request(GenerationRequest {
            prompt: prompt.iter().map(|&t| TokenId(t)).collect(),
            sampling: SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy()
            },
            limits: RequestParams {
                max_tokens,
                ignore_eos: true,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
        })
        .expect("accepted");
    let mut out = Vec::new();
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            if let EngineEvent::Token { seq_id, token, .. } = e {
                assert_eq!(seq_id, id);
                out.push(token.0);
            }
        }
    }
    out
}

fn tokenize(addr: std::net::SocketAddr, text: &str) -> Vec<u32> {
    let r = post(addr, "/tokenize", &json!({"prompt": text}));
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_value(r.json()["tokens"].clone()).expect("ids")
}

#[test]
fn greedy_completion_matches_engine_and_stream_matches_non_stream() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let lm = load(&fixture_path());
    let prompt = "hello world";
    let ids = tokenize(addr, prompt);
    assert_eq!(ids, lm.tokenizer.encode(prompt, true).expect("encodes"));
    let expected_ids = reference_greedy(&ids, 20);
    let expected = lm.tokenizer.decode(&expected_ids, true).expect("decodes");

    let body = json!({"model": "test-model", "prompt": prompt, "max_tokens": 20,
                      "temperature": 0, "ignore_eos": true});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], expected.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": ids.len(), "completion_tokens": 20,
               "total_tokens": ids.len() + 20,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );

    // The same prompt as token ids, and as a one-element list of lists.
    for p in [json!(ids), json!([ids])] {
        let mut b = body.clone();
        b["prompt"] = p;
        assert_eq!(
            post(addr, "/v1/completions", &b).json()["choices"][0]["text"],
            expected.as_str()
        );
    }

    let mut b = body.clone();
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let r = post(addr, "/v1/completions", &b);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let frames = r.sse_data();
    let (text, finish) = stream_text(&frames, 0);
    assert_eq!(text, expected);
    assert_eq!(finish, vec!["length"]);
    let usage: Value = serde_json::from_str(&frames[frames.len() - 2]).expect("usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 20);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn several_prompts_and_n_choices_are_ordered_prompt_by_prompt() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let one = |p: &str| {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": p, "max_tokens": 6,
            "temperature": 0, "ignore_eos": true}),
        );
        r.json()["choices"][0]["text"]
            .as_str()
            .expect("text")
            .to_string()
    };
    let (a, b) = (one("abc"), one("xyz"));
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ["abc", "xyz"], "n": 2,
        "max_tokens": 6, "temperature": 0, "ignore_eos": true}),
    );
    let v = r.json();
    let texts: Vec<&str> = v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["text"].as_str().expect("text"))
        .collect();
    assert_eq!(texts, vec![a.as_str(), a.as_str(), b.as_str(), b.as_str()]);
    let idx: Vec<u64> = v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["index"].as_u64().expect("index"))
        .collect();
    assert_eq!(idx, vec![0, 1, 2, 3]);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn seeded_sampling_is_reproducible() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let body = json!({"prompt": "once upon", "max_tokens": 16, "temperature": 1.0,
                      "seed": 1234, "n": 3, "ignore_eos": true});
    let texts = |v: Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .expect("choices")
            .iter()
            .map(|c| c["text"].as_str().expect("text").to_string())
            .collect()
    };
    let first = texts(post(addr, "/v1/completions", &body).json());
    let second = texts(post(addr, "/v1/completions", &body).json());
    assert_eq!(first, second);
    assert!(
        first[0] != first[1] || first[1] != first[2],
        "siblings draw distinct streams"
    );
    let mut b = body.clone();
    b["stream"] = json!(true);
    let frames = post(addr, "/v1/completions", &b).sse_data();
    for (i, t) in first.iter().enumerate() {
        assert_eq!(&stream_text(&frames, i as u64).0, t, "choice {i}");
    }
    server.shutdown().expect("clean shutdown");
}

#[test]
fn stop_strings_cut_the_text_and_are_never_streamed() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let body = json!({"prompt": "the cat", "max_tokens": 40, "temperature": 0, "ignore_eos": true});
    let full = post(addr, "/v1/completions", &body).json()["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 12, "need some text to cut: {full:?}");
    // A stop string from the middle of the greedy text; the answer is everything before
    // its first occurrence.
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let cut = &full[..full.find(&stop).expect("occurs")];
    let mut b = body.clone();
    b["stop"] = json!([stop]);
    let v = post(addr, "/v1/completions", &b).json();
    assert_eq!(v["choices"][0]["text"], cut);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    b["stream"] = json!(true);
    let frames = post(addr, "/v1/completions", &b).sse_data();
    let (text, finish) = stream_text(&frames, 0);
    assert_eq!(text, cut);
    assert_eq!(finish, vec!["stop"]);
    for f in &frames {
        let v: Value = serde_json::from_str(f).unwrap_or(Value::Null);
        let piece = v["choices"][0]["text"].as_str().unwrap_or("");
        assert!(!piece.contains(&stop), "stop string streamed in {f}");
    }
    b["include_stop_str_in_output"] = json!(true);
    b["stream"] = json!(false);
    let with = post(addr, "/v1/completions", &b).json();
    assert_eq!(with["choices"][0]["text"], format!("{cut}{stop}"));
    // The engine is idle afterwards: the stopped request was aborted and freed.
    wait_health(addr, std::time::Duration::from_secs(5), idle);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn completion_logprobs_legacy_format() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let body = json!({"prompt": "hello", "max_tokens": 8, "temperature": 0,
                      "ignore_eos": true, "logprobs": 3});
    let v = post(addr, "/v1/completions", &body).json();
    let c = &v["choices"][0];
    let lp = &c["logprobs"];
    let tokens = lp["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 8);
    let joined: String = tokens.iter().map(|t| t.as_str().expect("str")).collect();
    // The text is the tokens' strings, except that a reply cut by max_tokens inside a
    // character drops that character (its byte tokens still show as U+FFFD).
    let text = c["text"].as_str().expect("text");
    let rest = joined
        .strip_prefix(text)
        .expect("the text starts the joined tokens");
    assert!(
        rest.is_empty()
            || (c["finish_reason"] == "length" && rest.chars().all(|ch| ch == '\u{FFFD}')),
        "{joined:?} vs {text:?}"
    );
    let offsets: Vec<u64> = serde_json::from_value(lp["text_offset"].clone()).expect("offsets");
    let mut expect = 0;
    for (t, o) in tokens.iter().zip(&offsets) {
        assert_eq!(*o, expect);
        expect += t.as_str().expect("str").chars().count() as u64;
    }
    for (i, t) in tokens.iter().enumerate() {
        let chosen = lp["token_logprobs"][i].as_f64().expect("logprob");
        assert!(chosen <= 0.0 && chosen.is_finite());
        let top = lp["top_logprobs"][i].as_object().expect("dict");
        // Three alternatives plus the chosen token, keyed by text: byte tokens that are not
        // whole characters share the key "\u{FFFD}", so there may be fewer keys.
        assert!((1..=4).contains(&top.len()), "{top:?}");
        assert!(top.contains_key(t.as_str().expect("str")), "{top:?}");
        // Greedy: the chosen token is the most likely one.
        let best = top
            .values()
            .map(|x| x.as_f64().expect("f"))
            .fold(f64::MIN, f64::max);
        assert!(
            (best - chosen).abs() < 1e-6,
            "token {t}: {best} vs {chosen}"
        );
        let sum: f64 = top.values().map(|x| x.as_f64().expect("f").exp()).sum();
        assert!(sum <= 1.0 + 1e-5);
    }
    let mut b = body.clone();
    b["stream"] = json!(true);
    let frames = post(addr, "/v1/completions", &b).sse_data();
    let mut streamed = Vec::new();
    for f in frames.iter().filter(|f| f.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(f).expect("chunk");
        streamed.extend(
            v["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
    }
    assert_eq!(Value::Array(streamed), lp["token_logprobs"]);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn chat_completion_through_the_template() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let messages = json!([{"role": "system", "content": "be brief"},
                          {"role": "user", "content": [{"type": "text", "text": "hi"}]}]);
    let tok = post(addr, "/tokenize", &json!({"messages": messages})).json();
    let ids: Vec<u32> = serde_json::from_value(tok["tokens"].clone()).expect("ids");
    let lm = load(&fixture_path());
    let rendered = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(ids, lm.tokenizer.encode(rendered, false).expect("encodes"));
    let expected = lm
        .tokenizer
        .decode(&reference_greedy(&ids, 12), true)
        .expect("decodes");

    let body = json!({"messages": messages, "max_completion_tokens": 12, "temperature": 0,
                      "ignore_eos": true, "logprobs": true, "top_logprobs": 2});
    let v = post(addr, "/v1/chat/completions", &body).json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], expected.as_str());
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("content");
    assert_eq!(content.len(), 12);
    for entry in content {
        assert_eq!(entry["top_logprobs"].as_array().expect("top").len(), 2);
        assert_eq!(entry["top_logprobs"][0]["token"], entry["token"]);
        let bytes: Vec<u8> = serde_json::from_value(entry["bytes"].clone()).expect("bytes");
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            entry["token"].as_str().expect("token")
        );
    }
    let mut b = body.clone();
    b["stream"] = json!(true);
    let frames = post(addr, "/v1/chat/completions", &b).sse_data();
    let first: Value = serde_json::from_str(&frames[0]).expect("chunk");
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let (text, finish) = stream_text(&frames, 0);
    assert_eq!(text, expected);
    assert_eq!(finish, vec!["length"]);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn tokenizer_routes_models_and_health() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let lm = load(&fixture_path());
    let ids = tokenize(addr, "Hello there");
    let r = post(addr, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(
        r.json()["prompt"],
        lm.tokenizer.decode(&ids, false).expect("decodes").as_str()
    );
    let m = get(addr, "/v1/models").json();
    assert_eq!(m["data"][0]["id"], "test-model");
    assert_eq!(get(addr, "/v1/models/test-model").status, 200);
    assert_eq!(get(addr, "/v1/models/other").status, 404);
    let h = get(addr, "/health");
    assert_eq!(h.status, 200);
    assert!(idle(&h.json()), "{}", h.body);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn client_mistakes_get_openai_error_bodies() {
    let server = start_server(&fixture_path(), |c| c.limits.max_body_bytes = 64 * 1024);
    let addr = server.addr();
    let c = |extra: Value| {
        let mut b = json!({"prompt": "hi", "max_tokens": 4});
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        post(addr, "/v1/completions", &b)
    };
    assert_error(&c(json!({"temperature": -0.5})), 400, Some("temperature"));
    assert_error(&c(json!({"n": 0})), 400, Some("n"));
    assert_error(&c(json!({"temperature": "hot"})), 400, Some("temperature"));
    assert_error(&c(json!({"max_tokens": "many"})), 400, Some("max_tokens"));
    assert_error(&c(json!({"stop": [1, 2]})), 400, Some("stop"));
    assert_error(&c(json!({"top_p": 1.5})), 400, Some("top_p"));
    assert_error(&c(json!({"logprobs": 50})), 400, Some("logprobs"));
    assert_error(&c(json!({"prompt": {"a": 1}})), 400, Some("prompt"));
    assert_error(&c(json!({"prompt": [7, 100000]})), 400, Some("prompt"));
    assert_error(&c(json!({"prompt": vec![5u32; 300]})), 400, Some("prompt"));
    assert_error(&c(json!({"max_tokens": 100000})), 400, Some("max_tokens"));
    assert_error(&c(json!({"model": "gpt-4"})), 404, Some("model"));
    assert_error(&c(json!({"max_tokens": 0})), 400, Some("max_tokens"));
    // So large that the prompt plus it overflows: refused, not wrapped around.
    assert_error(&c(json!({"max_tokens": u64::MAX})), 400, Some("max_tokens"));
    let endless = json!({"messages": [{"role": "user", "content": "x"}],
                         "max_completion_tokens": u64::MAX});
    assert_error(
        &post(addr, "/v1/chat/completions", &endless),
        400,
        Some("max_completion_tokens"),
    );
    let none = json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0});
    assert_error(
        &post(addr, "/v1/chat/completions", &none),
        400,
        Some("max_completion_tokens"),
    );
    let chat = |b: Value| post(addr, "/v1/chat/completions", &b);
    assert_error(&chat(json!({"messages": []})), 400, Some("messages"));
    assert_error(&chat(json!({})), 400, Some("messages"));
    assert_error(
        &chat(json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})),
        400,
        Some("top_logprobs"),
    );
    assert_error(
        &request(addr, "POST", "/v1/completions", &[], "{not json"),
        400,
        None,
    );
    assert_error(
        &request(addr, "POST", "/v1/completions", &[], "[1]"),
        400,
        None,
    );
    let big = json!({"prompt": "a".repeat(100 * 1024)});
    assert_error(&post(addr, "/v1/completions", &big), 413, None);
    assert_error(&get(addr, "/v1/nothing"), 404, None);
    assert_error(&get(addr, "/v1/completions"), 405, None);
    // Nothing was left running, and a good request still works.
    assert!(idle(&get(addr, "/health").json()));
    assert_eq!(c(json!({})).status, 200);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn api_key_guards_everything_but_health() {
    let server = start_server(&fixture_path(), |c| c.api_key = Some("s3cret".into()));
    let addr = server.addr();
    assert_eq!(get(addr, "/health").status, 200);
    assert_error(&get(addr, "/v1/models"), 401, None);
    let wrong = request(
        addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer s3creT")],
        "",
    );
    assert_error(&wrong, 401, None);
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    assert_error(
        &request(addr, "POST", "/v1/completions", &[], &body),
        401,
        None,
    );
    let ok = request(
        addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer s3cret")],
        "",
    );
    assert_eq!(ok.status, 200);
    let ok = request(
        addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer s3cret")],
        &body,
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    // Every route but /health (and /metrics, open by default as in vLLM), and spellings of
    // paths that a router might normalize, need the key; with it, none answers 401.
    let key = [("Authorization", "Bearer s3cret")];
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    let routes = [
        ("POST", "/v1/chat/completions", chat.to_string()),
        (
            "POST",
            "/v1/score",
            json!({"input": "hi there"}).to_string(),
        ),
        ("POST", "/tokenize", json!({"prompt": "hi"}).to_string()),
        ("POST", "/detokenize", json!({"tokens": [5, 6]}).to_string()),
        ("POST", "/reset_prefix_cache", "{}".to_string()),
        ("GET", "/tokenizer_info", String::new()),
        ("GET", "/v1/models/test-model", String::new()),
        ("GET", "/health/", String::new()),
        ("GET", "//v1/models", String::new()),
        ("GET", "/V1/models", String::new()),
        ("GET", "/v1/models/../../health", String::new()),
        ("POST", "/v1/completions/", body.clone()),
    ];
    for (method, path, body) in &routes {
        let r = request(addr, method, path, &[], body);
        assert_error(&r, 401, None);
        let r = request(addr, method, path, &key, body);
        assert_ne!(r.status, 401, "{method} {path}: {}", r.body);
    }
    server.shutdown().expect("clean shutdown");
}

#[test]
fn concurrent_requests_batch_without_changing_their_answers() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let prompts = ["alpha", "beta gamma", "delta", "epsilon zeta eta", "theta"];
    let body = |p: &str, stream: bool| {
        json!({"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": true,
               "stream": stream})
    };
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            let v = post(addr, "/v1/completions", &body(p, false)).json();
            v["choices"][0]["text"].as_str().expect("text").to_string()
        })
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let b = body(p, i % 2 == 0);
            std::thread::spawn(move || {
                let r = post(addr, "/v1/completions", &b);
                if b["stream"] == true {
                    stream_text(&r.sse_data(), 0).0
                } else {
                    r.json()["choices"][0]["text"]
                        .as_str()
                        .expect("text")
                        .to_string()
                }
            })
        })
        .collect();
    for (h, expected) in handles.into_iter().zip(&alone) {
        assert_eq!(&h.join().expect("no panic"), expected);
    }
    wait_health(addr, std::time::Duration::from_secs(5), idle);
    server.shutdown().expect("clean shutdown");
}

/// Tokenizing runs off the HTTP workers: with a single worker, `/health` answers while a
/// 3 MiB prompt is still being tokenized (before, it waited for the tokenizer). The prompt
/// is then refused as longer than the context: its answer is short, so its time is the
/// tokenizer's.
#[test]
fn a_long_tokenization_does_not_hold_the_http_workers() {
    let server = start_server(&fixture_path(), |c| c.http_threads = 1);
    let addr = server.addr();
    let big = json!({"prompt": "1".repeat(3 << 20), "max_tokens": 1});
    let started = std::time::Instant::now();
    let long = std::thread::spawn(move || {
        let r = post(addr, "/v1/completions", &big);
        assert_error(&r, 400, Some("prompt"));
        started.elapsed()
    });
    std::thread::sleep(std::time::Duration::from_millis(150));
    assert_eq!(get(addr, "/health").status, 200);
    let health = started.elapsed();
    let tokenize = long.join().expect("tokenize thread");
    eprintln!("health after {health:?}, tokenize after {tokenize:?}");
    assert!(
        health < tokenize,
        "health {health:?} waited for tokenize {tokenize:?}"
    );
    server.shutdown().expect("clean shutdown");
}
