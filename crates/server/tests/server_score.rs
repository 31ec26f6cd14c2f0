//! Prompt scores over HTTP against the independent reference, teacher-forced scoring
//! (`tandem_model::scoring::score_tokens`, what `tandem score` prints): `POST /v1/score`
//! (inputs, context + continuations), `/v1/completions` with `echo` + `logprobs` and
//! `max_tokens` 0 and 1 on token-id prompts, vLLM's `prompt_logprobs`, stream ≡ non-stream
//! with echo, scoring batched with generation, and the 400s.

mod server_common;

use std::net::SocketAddr;

use serde_json::{json, Value};
use server_common::*;
use tandem_model::batch::TokenId;
use tandem_model::scoring::{score_tokens, ScoreOptions, ScoreOutput};

/// Teacher-forced scores of `ids` with `top_k` alternatives (at least 1, for the ranks).
fn reference(lm: &LoadedModel, ids: &[u32], top_k: usize) -> ScoreOutput {
    let tokens: Vec<TokenId> = ids.iter().map(|&t| TokenId(t)).collect();
    let opts = ScoreOptions {
        top_k: top_k.max(1),
        ..ScoreOptions::default()
    };
    score_tokens(&lm.model, &tokens, &opts, &mut |_, _| {}).expect("score")
}

/// A JSON number that must be exactly the f32 `want`.
fn assert_f32(v: &Value, want: f32, what: &str) {
    let got = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v}")) as f32;
    assert_eq!(got.to_bits(), want.to_bits(), "{what}: {got} vs {want}");
}

/// A JSON number equal to the f64 `want` up to serde_json's decimal parsing (which may be
/// off by an ulp without its `float_roundtrip` feature).
fn assert_f64(v: &Value, want: f64, what: &str) {
    let got = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v}"));
    assert!(
        (got - want).abs() <= 2.0 * f64::EPSILON * want.abs(),
        "{what}: {got} vs {want}"
    );
}

/// Checks one `/v1/score` item against the reference from position `from` on.
fn assert_item(item: &Value, r: &ScoreOutput, from: usize, top_k: usize) {
    let ids: Vec<u32> = r.tokens[from..].iter().map(|t| t.0).collect();
    assert_eq!(item["tokens"], json!(ids));
    assert_eq!(item["num_tokens"], ids.len());
    let mut sum = 0.0f64;
    let mut n = 0;
    for (j, p) in r.positions[from..].iter().enumerate() {
        let what = format!("position {}", from + j);
        match p {
            None => {
                assert!(item["token_logprobs"][j].is_null(), "{what}");
                assert!(item["ranks"][j].is_null(), "{what}");
            }
            Some(p) => {
                assert_f32(&item["token_logprobs"][j], p.logprob, &what);
                assert_eq!(
                    item["ranks"][j].as_u64().map(|r| r as usize),
                    p.rank,
                    "{what}"
                );
                if top_k > 0 {
                    let top = item["top_logprobs"][j].as_array().expect("top list");
                    assert_eq!(top.len(), top_k, "{what}");
                    for (t, &(id, lp)) in top.iter().zip(&p.top) {
                        assert_eq!(t["id"], id.0, "{what}");
                        assert_f32(&t["logprob"], lp, &what);
                    }
                }
                sum += f64::from(p.logprob);
                n += 1;
            }
        }
    }
    assert_eq!(item["num_scored"], n);
    assert_f64(&item["sum_logprob"], sum, "sum in f64 as tandem score");
    if from == 0 {
        assert_f64(&item["sum_logprob"], r.sum_logprob(), "sum_logprob");
        match r.perplexity() {
            Some(p) => assert_f64(&item["perplexity"], p, "perplexity"),
            None => assert!(item["perplexity"].is_null() && item["mean_logprob"].is_null()),
        }
    }
}

fn score(addr: SocketAddr, body: Value) -> Value {
    let r = post(addr, "/v1/score", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[test]
fn score_endpoint_equals_teacher_forced_scoring_on_the_default_model() {
    let path = default_model_path();
    let server = start_server(&path, |_| {});
    let addr = server.addr();
    let lm = load(&path);
    let texts = ["The capital of France is Paris.", "Hello"];
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| lm.tokenizer.encode(t, true).expect("encodes"))
        .collect();
    let v = score(addr, json!({"input": texts, "top_logprobs": 3}));
    assert_eq!(v["object"], "score");
    for (i, ids) in ids.iter().enumerate() {
        assert_item(&v["data"][i], &reference(&lm, ids, 3), 0, 3);
    }
    let total: usize = ids.iter().map(Vec::len).sum();
    assert_eq!(v["usage"]["prompt_tokens"], total);
    // Token ids, one input as a bare list; no top list without top_logprobs.
    let v = score(addr, json!({"input": ids[0]}));
    assert_item(&v["data"][0], &reference(&lm, &ids[0], 0), 0, 0);
    assert!(v["data"][0].get("top_logprobs").is_none());
    // Context + continuations: tokenized apart, only the continuation reported.
    let ctx = lm
        .tokenizer
        .encode("The capital of France is", true)
        .expect("encodes");
    let conts = [" Paris.", " London"];
    let v = score(
        addr,
        json!({"context": "The capital of France is", "continuations": conts}),
    );
    for (i, c) in conts.iter().enumerate() {
        let mut all = ctx.clone();
        all.extend(lm.tokenizer.encode(c, false).expect("encodes"));
        let item = &v["data"][i];
        assert_eq!(item["context_tokens"], ctx.len());
        assert_item(item, &reference(&lm, &all, 0), ctx.len(), 0);
        let r = reference(&lm, &all, 1);
        let greedy = r.positions[ctx.len()..]
            .iter()
            .flatten()
            .all(|p| p.rank == Some(1));
        assert_eq!(item["greedy"], greedy);
    }
    assert!(idle(&get(addr, "/health").json()));
    server.shutdown().expect("clean shutdown");
}

/// The legacy logprobs of an echoed choice against the reference over the same ids.
fn assert_echo(choice: &Value, lm: &LoadedModel, all: &[u32], k: usize) {
    let r = reference(lm, all, k);
    let lp = &choice["logprobs"];
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    let tokens = lp["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), all.len());
    for (i, p) in r.positions.iter().enumerate().skip(1) {
        let p = p.as_ref().expect("scored");
        assert_f32(&lp["token_logprobs"][i], p.logprob, &format!("token {i}"));
        let top = lp["top_logprobs"][i].as_object().expect("dict");
        for &(id, l) in &p.top[..k] {
            let text = lm
                .tokenizer
                .token_bytes(id.0)
                .map(String::from_utf8_lossy)
                .expect("token");
            // Byte tokens that are not whole characters share the key U+FFFD.
            if !text.contains('\u{FFFD}') {
                assert_f32(&top[text.as_ref()], l, &format!("token {i} alternative"));
            }
        }
    }
    let offsets: Vec<usize> = serde_json::from_value(lp["text_offset"].clone()).expect("offsets");
    let mut at = 0;
    for (t, o) in tokens.iter().zip(&offsets) {
        assert_eq!(*o, at);
        at += t.as_str().expect("token text").chars().count();
    }
}

#[test]
fn echo_with_logprobs_equals_scoring_for_max_tokens_0_and_1() {
    let path = default_model_path();
    let server = start_server(&path, |_| {});
    let addr = server.addr();
    let lm = load(&path);
    let ids = lm
        .tokenizer
        .encode("One, two, three, four", true)
        .expect("encodes");
    let prompt_text = lm.tokenizer.decode(&ids, false).expect("decodes");
    for max_tokens in [0, 1] {
        let body = json!({"prompt": ids, "echo": true, "logprobs": 2, "max_tokens": max_tokens,
                          "temperature": 0, "prompt_logprobs": 2});
        let v = post(addr, "/v1/completions", &body).json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "length");
        let text = c["text"].as_str().expect("text");
        assert!(text.starts_with(&prompt_text), "{text:?}");
        let mut all = ids.clone();
        if max_tokens == 1 {
            let generated = &c["logprobs"]["tokens"][ids.len()];
            // The generated token is the argmax after the prompt (greedy): score it too.
            let greedy = {
                let mut next = ids.clone();
                next.push(0);
                let r = reference(&lm, &next, 1);
                r.positions[ids.len()].as_ref().expect("scored").top[0].0 .0
            };
            all.push(greedy);
            let piece = lm
                .tokenizer
                .token_bytes(greedy)
                .map(String::from_utf8_lossy)
                .expect("token");
            assert_eq!(generated.as_str(), Some(piece.as_ref()));
        } else {
            assert_eq!(text, prompt_text, "max_tokens 0 answers the prompt only");
        }
        assert_echo(c, &lm, &all, 2);
        assert_eq!(v["usage"]["completion_tokens"], max_tokens);
        // vLLM's prompt_logprobs: null, then {id: {logprob, rank, decoded_token}}.
        let pl = c["prompt_logprobs"].as_array().expect("prompt_logprobs");
        assert_eq!(pl.len(), ids.len());
        assert!(pl[0].is_null());
        let r = reference(&lm, &ids, 2);
        for (i, p) in r.positions.iter().enumerate().skip(1) {
            let p = p.as_ref().expect("scored");
            let actual = &pl[i][ids[i].to_string()];
            assert_f32(&actual["logprob"], p.logprob, "prompt_logprobs");
            assert_eq!(actual["rank"].as_u64().map(|x| x as usize), p.rank);
            assert!(pl[i][p.top[0].0 .0.to_string()]["rank"] == 1);
        }
        // Stream ≡ non-stream: the echoed prompt comes in the first chunk.
        let mut b = body.clone();
        b["stream"] = json!(true);
        let frames = post(addr, "/v1/completions", &b).sse_data();
        let first: Value = serde_json::from_str(&frames[0]).expect("chunk");
        assert!(first["choices"][0]["text"]
            .as_str()
            .expect("text")
            .starts_with(&prompt_text));
        assert_eq!(first["choices"][0]["prompt_logprobs"], c["prompt_logprobs"]);
        let (streamed, finish) = stream_text(&frames, 0);
        assert_eq!(streamed, text);
        assert_eq!(finish, vec!["length"]);
        let mut lps = Vec::new();
        for f in frames.iter().filter(|f| f.as_str() != "[DONE]") {
            let v: Value = serde_json::from_str(f).expect("chunk");
            lps.extend(
                v["choices"][0]["logprobs"]["token_logprobs"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        assert_eq!(Value::Array(lps), c["logprobs"]["token_logprobs"]);
    }
    // Echo without logprobs: the text only; a batch of prompts echoes each.
    let body = json!({"prompt": [ids, [ids[0]]], "echo": true, "max_tokens": 0});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], prompt_text.as_str());
    assert!(v["choices"][0]["logprobs"].is_null());
    assert_eq!(v["choices"][1]["logprobs"], Value::Null);
    assert!(idle(&get(addr, "/health").json()));
    server.shutdown().expect("clean shutdown");
}

#[test]
fn scoring_batches_with_generation_without_changing_answers() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let lm = load(&fixture_path());
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 320).collect();
    let gen = json!({"prompt": "once upon a time", "max_tokens": 200, "temperature": 0,
                     "ignore_eos": true});
    let alone = post(addr, "/v1/completions", &gen).json()["choices"][0]["text"].clone();
    let handle = std::thread::spawn(move || post(addr, "/v1/completions", &gen).json());
    let mut items = Vec::new();
    for _ in 0..4 {
        let v = score(addr, json!({"input": [ids, ids[..9]], "top_logprobs": 2}));
        items.push(v["data"].clone());
    }
    let batched = handle.join().expect("generation thread");
    assert_eq!(
        batched["choices"][0]["text"], alone,
        "generation unchanged by scoring"
    );
    for data in items {
        assert_item(&data[0], &reference(&lm, &ids, 2), 0, 2);
        assert_item(&data[1], &reference(&lm, &ids[..9], 2), 0, 2);
    }
    assert!(idle(&wait_health(
        addr,
        std::time::Duration::from_secs(5),
        idle
    )));
    server.shutdown().expect("clean shutdown");
}

fn assert_400(r: &Reply, param: &str, needles: &[&str]) {
    assert_eq!(r.status, 400, "{}", r.body);
    let e = &r.json()["error"];
    assert_eq!(e["param"], param, "{}", r.body);
    let m = e["message"].as_str().expect("message");
    for n in needles {
        assert!(m.contains(n), "{m:?} lacks {n:?}");
    }
}

#[test]
fn bad_score_and_echo_requests_get_400s() {
    let server = start_server(&fixture_path(), |c| c.limits.max_score_items = 2);
    let addr = server.addr();
    let s = |b: Value| post(addr, "/v1/score", &b);
    assert_400(
        &s(json!({"input": "", "add_special_tokens": false})),
        "input",
        &["no tokens"],
    );
    assert_400(&s(json!({"input": []})), "input", &["empty"]);
    assert_400(&s(json!({})), "input", &["context"]);
    assert_400(
        &s(json!({"input": "a", "context": "b", "continuations": ["c"]})),
        "input",
        &[],
    );
    assert_400(
        &s(json!({"input": [1, 320]})),
        "input",
        &["320", "vocabulary"],
    );
    assert_400(
        &s(json!({"input": ["a", "b", "c"]})),
        "input",
        &["at most 2", "3"],
    );
    assert_400(
        &s(json!({"input": "a", "top_logprobs": 21})),
        "top_logprobs",
        &["20", "21"],
    );
    assert_400(
        &s(json!({"input": vec![5u32; 300]})),
        "input",
        &["300", "256"],
    );
    assert_400(
        &s(json!({"context": "a", "continuations": []})),
        "continuations",
        &[],
    );
    assert_400(
        &s(json!({"context": "a", "continuations": [""]})),
        "continuations",
        &["no tokens"],
    );
    assert_400(&s(json!({"input": {"a": 1}})), "input", &[]);
    let c = |b: Value| post(addr, "/v1/completions", &b);
    assert_400(
        &c(json!({"prompt": "hi", "max_tokens": 0})),
        "max_tokens",
        &["echo"],
    );
    assert_400(
        &c(json!({"prompt": "hi", "prompt_logprobs": 21})),
        "prompt_logprobs",
        &["20"],
    );
    assert_400(
        &c(json!({"prompt": "hi", "echo": true, "max_tokens": 0, "n": 2})),
        "n",
        &[],
    );
    assert!(idle(&get(addr, "/health").json()));
    server.shutdown().expect("clean shutdown");
}

#[test]
fn every_choice_of_n_echoes_the_shared_prompt() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let lm = load(&fixture_path());
    let ids: Vec<u32> = vec![9, 30, 77, 150, 4];
    let body = json!({"prompt": ids, "echo": true, "logprobs": 1, "max_tokens": 3, "n": 2,
                      "seed": 5, "temperature": 1.0, "ignore_eos": true});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let prompt_text = lm.tokenizer.decode(&ids, false).expect("decodes");
    let reference = reference(&lm, &ids, 1);
    for c in v["choices"].as_array().expect("choices") {
        assert!(c["text"].as_str().expect("text").starts_with(&prompt_text));
        let lp = &c["logprobs"]["token_logprobs"];
        assert!(lp[0].is_null());
        for (i, p) in reference.positions.iter().enumerate().skip(1) {
            let p = p.as_ref().expect("scored");
            assert_f32(
                &lp[i],
                p.logprob,
                &format!("choice {} token {i}", c["index"]),
            );
        }
        assert_eq!(lp.as_array().expect("list").len(), ids.len() + 3);
    }
    server.shutdown().expect("clean shutdown");
}
