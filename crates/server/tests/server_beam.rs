//! Beam search over HTTP (`use_beam_search: true`, `n` = width) with the fixture model:
//! width 1 is greedy decoding, wider searches return the hypotheses of the engine driven
//! directly, in its order; with a structured-output constraint every hypothesis is a complete
//! match; what cannot combine with beam search is refused naming the field.

mod server_common;

use serde_json::{json, Value};
use server_common::*;
use tandem_engine::beam_search::BeamParams;
use tandem_engine::engine::GenerationRequest;
use tandem_engine::sampler::SamplingParams;
use tandem_engine::RequestParams;
use tandem_model::batch::TokenId;

const PROMPT: [u32; 5] = [11, 42, 7, 99, 3];

/// The hypotheses' texts of a beam search run on an engine driven directly.
fn reference_beams(width: usize, max_tokens: usize) -> Vec<String> {
    let (mut engine, tokenizer, _) = engine(load(&fixture_path()), 64);
    let req = GenerationRequest {
        prompt: PROMPT.iter().map(|&t| TokenId(t)).collect(),
        sampling: SamplingParams::greedy(),
        limits: RequestParams {
            max_tokens,
            ignore_eos: true,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    };
    let params = BeamParams {
        width,
        length_penalty: 1.0,
    };
    let id = engine.add_beam_request(req, params).expect("accepted");
    while engine.has_unfinished() {
        engine.step().expect("step");
    }
    let hyps = engine.take_beam_result(id).expect("hypotheses");
    hyps.iter()
        .map(|h| {
            let ids: Vec<u32> = h.tokens.iter().map(|t| t.0).collect();
            tokenizer.decode(&ids, true).expect("decodes")
        })
        .collect()
}

fn beam(n: u64, max_tokens: u64) -> Value {
    json!({"prompt": PROMPT, "max_tokens": max_tokens, "n": n, "use_beam_search": true,
           "ignore_eos": true})
}

fn texts(v: &Value) -> Vec<String> {
    v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| c["text"].as_str().expect("text").to_string())
        .collect()
}

#[test]
fn beam_search_returns_the_engines_hypotheses_and_width_one_is_greedy() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let greedy = json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let greedy = post(addr, "/v1/completions", &greedy).json();
    let one = post(addr, "/v1/completions", &beam(1, 8));
    assert_eq!(one.status, 200, "{}", one.body);
    assert_eq!(texts(&one.json()), texts(&greedy));

    let three = post(addr, "/v1/completions", &beam(3, 8));
    assert_eq!(three.status, 200, "{}", three.body);
    let v = three.json();
    assert_eq!(texts(&v), reference_beams(3, 8));
    for (i, c) in v["choices"].as_array().expect("choices").iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(v["usage"]["completion_tokens"], 24);
    assert_eq!(v["usage"]["prompt_tokens"], PROMPT.len());

    // Chat runs the search over the templated conversation.
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                      "n": 2, "use_beam_search": true, "ignore_eos": true});
    let r = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"].as_array().expect("choices").len(), 2);
    assert!(idle(&get(addr, "/health").json()));
    server.shutdown().expect("clean shutdown");
}

#[test]
fn what_beam_search_cannot_do_is_refused_naming_the_field() {
    let server = start_server_with(&fixture_path(), |s| s.max_num_seqs = 4, |_| {});
    let addr = server.addr();
    let with = |extra: Value| {
        let mut b = beam(2, 4);
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        post(addr, "/v1/completions", &b)
    };
    assert_error(&with(json!({"stream": true})), 400, Some("stream"));
    assert_error(&with(json!({"logprobs": 2})), 400, Some("logprobs"));
    assert_error(&with(json!({"echo": true})), 400, Some("echo"));
    assert_error(
        &with(json!({"prompt": [[5, 6], [7, 8]]})),
        400,
        Some("prompt"),
    );
    assert_error(&with(json!({"n": 5})), 400, Some("n"));
    assert_error(
        &with(json!({"length_penalty": "x"})),
        400,
        Some("length_penalty"),
    );
    let plain = json!({"prompt": PROMPT, "max_tokens": 2, "length_penalty": 0.5});
    assert_error(
        &post(addr, "/v1/completions", &plain),
        400,
        Some("length_penalty"),
    );
    assert!(idle(&get(addr, "/health").json()));
    assert_eq!(with(json!({})).status, 200);
    server.shutdown().expect("clean shutdown");
}

#[test]
fn constrained_beams_return_only_complete_matches() {
    let server = start_server(&fixture_path(), |_| {});
    let addr = server.addr();
    let choices = ["yes", "no", "maybe so"];
    let regex = "[a-c]{2,4}-[0-9]{1,2}";
    let re = regex::Regex::new(&format!("^(?:{regex})$")).expect("regex");
    for constraint in [
        json!({"structured_outputs": {"choice": choices}}),
        json!({"guided_regex": regex}),
    ] {
        let mut body = json!({"prompt": PROMPT, "max_tokens": 24, "n": 3,
                              "use_beam_search": true});
        for (k, v) in constraint.as_object().expect("object") {
            body[k] = v.clone();
        }
        let r = post(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let got = texts(&v);
        assert!(!got.is_empty() && got.len() <= 3);
        for (t, c) in got.iter().zip(v["choices"].as_array().expect("choices")) {
            assert_eq!(c["finish_reason"], "stop", "{constraint}: {t:?}");
            let ok = if constraint.get("guided_regex").is_some() {
                re.is_match(t)
            } else {
                choices.contains(&t.as_str())
            };
            assert!(ok, "{constraint}: {t:?} does not match");
        }
    }
    // Tools and beam search do not combine (tool calls are parsed from sampled output).
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "properties": {}}}}]);
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                      "n": 2, "use_beam_search": true, "tools": tools});
    assert_error(
        &post(addr, "/v1/chat/completions", &chat),
        400,
        Some("tools"),
    );
    assert!(idle(&get(addr, "/health").json()));
    server.shutdown().expect("clean shutdown");
}
