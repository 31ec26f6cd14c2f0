//! Structured output in the engine, on the weightless [`FakeRunner`] (pseudo-random logits,
//! so every allowed token is likely somewhere) with the small fixture tokenizer:
//!
//! - constrained outputs always match (regex, choice, a bounded JSON schema) at temperature 1
//!   over 64 seeds each, and end with EOS (the grammar accepted); (`json_object` allows
//!   unbounded strings, which random logits never close: the server test covers it with a
//!   real model);
//! - a constrained request emits the same tokens alone, batched with unconstrained and other
//!   constrained requests, under preemption (tiny pool), and as sample `i` of `n > 1`;
//! - with n-gram speculation, constrained requests are drafted and verified against the
//!   masked rows: greedy outputs are unchanged token for token, sampled outputs still match,
//!   and drafts are accepted;
//! - a dead end (the grammar is complete but `min_tokens` forbids EOS) ends that request with
//!   an error and nothing else; bad grammars are typed errors naming the field;
//! - constrained beam search: every hypothesis is a complete match at widths 1, 2 and 4, and
//!   width 1 is constrained greedy decoding;
//! - grammars as deep as the size limit allows (chains of Lark rules, of `$ref`s) compile
//!   and constrain generation on a thread with a small stack.

use std::collections::HashMap;
use std::path::PathBuf;

use tandem_engine::beam_search::BeamParams;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::{
    Constraint, ConstraintCompiler, ConstraintError, GrammarSpec, SamplingParams,
};
use tandem_engine::speculative::{NgramProposer, SpeculativeConfig};
use tandem_engine::{FinishReason, RequestParams, SchedulerConfig, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::fake_runner::FakeRunner;
use tandem_model::tokenizer::Tokenizer;

const CONTEXT: usize = 256;
const BLOCK: usize = 4;
const SALT: u64 = 0x5eed;
const MAX_BYTES: usize = 64 << 10;

fn tokenizer() -> Tokenizer {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf/llama_untied");
    Tokenizer::from_hf_dir(&dir).expect("fixture tokenizer")
}

fn engine(tok: &Tokenizer, blocks: usize) -> Engine {
    let mut c = SchedulerConfig::new(blocks, BLOCK, CONTEXT);
    c.eos_token_ids = tok.eos_ids().into_iter().map(TokenId).collect();
    let runner = FakeRunner::new(tok.vocab_size(), CONTEXT, blocks, BLOCK, SALT);
    Engine::new(Box::new(runner), c, 11).expect("engine")
}

fn compile(compiler: &ConstraintCompiler, spec: &GrammarSpec) -> Constraint {
    compiler
        .compile(spec, "test", MAX_BYTES)
        .unwrap_or_else(|e| panic!("{spec:?}: {e}"))
}

fn request(tok: &Tokenizer, constraint: Option<Constraint>, seed: u64) -> GenerationRequest {
    let prompt = tok.encode("Answer:", true).expect("encode");
    GenerationRequest {
        prompt: prompt.into_iter().map(TokenId).collect(),
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            eos_token_ids: tok.eos_ids(),
            constraint,
            ..SamplingParams::default()
        },
        limits: RequestParams {
            max_tokens: 160,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    }
}

/// What one sample produced: its tokens and how it ended.
type Out = (Vec<u32>, FinishReason);

/// Submits every `(request, n)` at once and steps to the end; outputs in submission order.
fn run(engine: &mut Engine, subs: &[(GenerationRequest, usize)]) -> Vec<Out> {
    let mut order: Vec<SeqId> = Vec::new();
    for (req, n) in subs {
        order.extend(engine.add_request_n(req.clone(), *n).expect("accepted"));
    }
    let mut tokens: HashMap<SeqId, Vec<u32>> = HashMap::new();
    let mut ends: HashMap<SeqId, FinishReason> = HashMap::new();
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            match e {
                EngineEvent::Token { seq_id, token, .. } => {
                    tokens.entry(seq_id).or_default().push(token.0)
                }
                EngineEvent::Finished { seq_id, reason } => {
                    ends.insert(seq_id, reason);
                }
                _ => {}
            }
        }
    }
    order
        .iter()
        .map(|id| {
            let end = ends.remove(id).expect("every request finishes");
            (tokens.remove(id).unwrap_or_default(), end)
        })
        .collect()
}

/// The text of an output without its final stop token.
fn text(tok: &Tokenizer, out: &Out) -> String {
    tok.decode(&out.0, true).expect("decode")
}

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "tags", "ok"],
        "additionalProperties": false
    })
}

/// A regex, a choice and [`schema`]: the grammars whose outputs the tests check.
fn match_specs() -> [GrammarSpec; 3] {
    let choices = ["yes", "no", "maybe so"].map(String::from).to_vec();
    [
        GrammarSpec::Regex("[a-z]{1,6}@[a-z]{2,5}\\.(com|org)".into()),
        GrammarSpec::Choice(choices),
        GrammarSpec::JsonSchema(schema()),
    ]
}

/// Whether `text` is a complete match of `spec` (one of [`match_specs`]).
fn matches(spec: &GrammarSpec, text: &str) -> bool {
    match spec {
        GrammarSpec::Regex(r) => regex::Regex::new(&format!("^(?:{r})$"))
            .expect("regex")
            .is_match(text),
        GrammarSpec::Choice(c) => c.iter().any(|x| x == text),
        GrammarSpec::JsonSchema(_) => serde_json::from_str(text).is_ok_and(|v| matches_schema(&v)),
        _ => false,
    }
}

/// The structural check of [`schema`].
fn matches_schema(v: &serde_json::Value) -> bool {
    let Some(o) = v.as_object() else {
        return false;
    };
    let name = o.get("name").and_then(|n| n.as_str());
    let age = o.get("age").and_then(|a| a.as_i64());
    let tags = o.get("tags").and_then(|t| t.as_array());
    o.len() == 4
        && name.is_some_and(|n| n.chars().count() <= 6)
        && age.is_some_and(|a| (0..=120).contains(&a))
        && tags.is_some_and(|t| {
            t.len() <= 3
                && t.iter()
                    .all(|x| matches!(x.as_str(), Some("a" | "b" | "c")))
        })
        && o.get("ok").is_some_and(|b| b.is_boolean())
}

#[test]
fn constrained_outputs_always_match_at_temperature_one() {
    let tok = tokenizer();
    let compiler = ConstraintCompiler::new(&tok).expect("vocabulary");
    let eos = tok.eos_ids();
    for (k, spec) in match_specs().iter().enumerate() {
        let c = compile(&compiler, spec);
        let subs: Vec<_> = (0..64)
            .map(|seed| (request(&tok, Some(c.clone()), seed), 1))
            .collect();
        for (seed, out) in run(&mut engine(&tok, 512), &subs).iter().enumerate() {
            let t = text(&tok, out);
            assert_eq!(out.1, FinishReason::Stop, "spec {k} seed {seed}: {t:?}");
            assert!(
                out.0.last().is_some_and(|l| eos.contains(l)),
                "ends with EOS"
            );
            assert!(
                matches(spec, &t),
                "spec {k} seed {seed}: {t:?} does not match"
            );
        }
    }
}

#[test]
fn constrained_request_is_the_same_alone_batched_preempted_and_as_a_sibling() {
    let tok = tokenizer();
    let compiler = ConstraintCompiler::new(&tok).expect("vocabulary");
    let c = compile(&compiler, &GrammarSpec::JsonSchema(schema()));
    let choice = compile(
        &compiler,
        &GrammarSpec::Choice(vec!["alpha".into(), "beta".into()]),
    );
    let alone: Vec<Out> = (0..4)
        .map(|seed| {
            run(
                &mut engine(&tok, 512),
                &[(request(&tok, Some(c.clone()), seed), 1)],
            )
        })
        .map(|mut v| v.remove(0))
        .collect();
    // Batched with unconstrained and other constrained requests, in a roomy pool and in a
    // pool so small that sequences are preempted and recomputed.
    let mut subs: Vec<_> = (0..4)
        .map(|seed| (request(&tok, Some(c.clone()), seed), 1))
        .collect();
    subs.extend((0..4).map(|s| (request(&tok, None, 100 + s), 1)));
    subs.extend((0..4).map(|s| (request(&tok, Some(choice.clone()), 200 + s), 1)));
    assert_eq!(run(&mut engine(&tok, 512), &subs)[..4], alone[..]);
    let mut tiny = engine(&tok, 60);
    assert_eq!(run(&mut tiny, &subs)[..4], alone[..]);
    assert!(
        tiny.scheduler().stats().num_preemptions > 0,
        "the tiny pool preempts"
    );
    // n = 4 siblings with seeds 0..4 are the four requests alone.
    let n4 = run(
        &mut engine(&tok, 512),
        &[(request(&tok, Some(c.clone()), 0), 4)],
    );
    assert_eq!(n4, alone);
}

/// An engine with n-gram speculation (3 drafts a step, always on).
fn speculative_engine(tok: &Tokenizer) -> Engine {
    let mut e = engine(tok, 512);
    let mut config = SpeculativeConfig::default();
    (config.num_tokens, config.max_batch_size) = (3, 64);
    (config.draft_cost, config.verify_cost) = (0.0, 0.0);
    let ngram = NgramProposer::new(1, 3).expect("n-gram sizes");
    e.enable_speculation(config, Box::new(ngram))
        .expect("speculation");
    e
}

#[test]
fn constrained_requests_are_drafted_and_verified_against_the_grammar() {
    let tok = tokenizer();
    let compiler = ConstraintCompiler::new(&tok).expect("vocabulary");
    // A repetitive grammar gives the n-gram proposer something to draft from.
    let mut specs = match_specs().to_vec();
    specs.push(GrammarSpec::Regex("(abc ){8}".into()));
    let re = regex::Regex::new("^(?:(abc ){8})$").expect("regex");
    let constraints: Vec<Constraint> = specs.iter().map(|s| compile(&compiler, s)).collect();
    // Greedy: speculation changes nothing, token for token.
    let greedy: Vec<_> = constraints
        .iter()
        .map(|c| {
            let mut r = request(&tok, Some(c.clone()), 0);
            r.sampling.temperature = 0.0;
            (r, 1)
        })
        .collect();
    let plain = run(&mut engine(&tok, 512), &greedy);
    let mut spec = speculative_engine(&tok);
    assert_eq!(run(&mut spec, &greedy), plain);
    let stats = spec.spec_stats();
    assert!(
        stats.num_draft_tokens > 0,
        "constrained requests were drafted"
    );
    // Sampled (rejection sampling against the masked rows): still complete matches.
    let sampled: Vec<_> = (0..8)
        .flat_map(|seed| constraints.iter().map(move |c| (c.clone(), seed)))
        .map(|(c, seed)| (request(&tok, Some(c), seed), 1))
        .collect();
    let mut spec = speculative_engine(&tok);
    for (i, out) in run(&mut spec, &sampled).iter().enumerate() {
        let k = i % specs.len();
        let t = text(&tok, out);
        assert_eq!(out.1, FinishReason::Stop, "spec {k}: {t:?}");
        let ok = match &specs[k] {
            GrammarSpec::Regex(r) if r.starts_with('(') => re.is_match(&t),
            spec => matches(spec, &t),
        };
        assert!(ok, "spec {k}: {t:?} does not match");
    }
    let stats = spec.spec_stats();
    assert!(
        stats.num_accepted_tokens > 0,
        "some drafts were accepted: {stats:?}"
    );
}

#[test]
fn a_dead_end_ends_only_its_request() {
    let tok = tokenizer();
    let compiler = ConstraintCompiler::new(&tok).expect("vocabulary");
    let c = compile(&compiler, &GrammarSpec::Choice(vec!["x".into()]));
    let mut stuck = request(&tok, Some(c), 1);
    stuck.sampling.min_tokens = 20; // the grammar is complete after "x"; EOS is suppressed
    let free = request(&tok, None, 2);
    let outs = run(&mut engine(&tok, 512), &[(stuck, 1), (free, 1)]);
    match &outs[0].1 {
        FinishReason::Refused(m) => assert!(m.contains("grammar"), "{m}"),
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(text(&tok, &outs[0]), "x");
    assert!(!outs[1].1.is_failure());
}

/// Runs one beam search request to its end: how it ended and its hypotheses.
fn beam(engine: &mut Engine, req: GenerationRequest, width: usize) -> (FinishReason, Vec<Out>) {
    let params = BeamParams {
        width,
        length_penalty: 1.0,
    };
    let id = engine.add_beam_request(req, params).expect("accepted");
    let mut end = None;
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            if let EngineEvent::Finished { seq_id, reason } = e {
                assert_eq!(seq_id, id);
                end = Some(reason);
            }
        }
    }
    let end = end.expect("the search finishes");
    let hyps = engine.take_beam_result(id).unwrap_or_default();
    let outs = hyps
        .into_iter()
        .map(|h| (h.tokens.iter().map(|t| t.0).collect(), end.clone()))
        .collect();
    (end, outs)
}

#[test]
fn constrained_beams_end_in_matches_and_width_one_is_constrained_greedy() {
    let tok = tokenizer();
    let compiler = ConstraintCompiler::new(&tok).expect("vocabulary");
    let eos = tok.eos_ids();
    for (k, spec) in match_specs().iter().enumerate() {
        let c = compile(&compiler, spec);
        for (width, seed) in [(1, 0), (2, 1), (4, 2)] {
            let req = request(&tok, Some(c.clone()), seed);
            let (end, hyps) = beam(&mut engine(&tok, 1024), req.clone(), width);
            assert!(!end.is_failure(), "spec {k}: {end:?}");
            assert!(!hyps.is_empty() && hyps.len() <= width);
            for h in &hyps {
                // With 160 tokens of room every hypothesis completes its grammar.
                assert!(h.0.last().is_some_and(|l| eos.contains(l)), "ends with EOS");
                let t = text(&tok, h);
                assert!(
                    matches(spec, &t),
                    "spec {k} width {width}: {t:?} does not match"
                );
            }
            if width == 1 {
                let mut greedy = req;
                greedy.sampling.temperature = 0.0;
                let out = run(&mut engine(&tok, 1024), &[(greedy, 1)]);
                assert_eq!(hyps[0].0, out[0].0, "spec {k}: width 1 is greedy decoding");
            }
        }
    }
}

#[test]
fn bad_grammars_name_the_field() {
    let tok = tokenizer();
    let compiler = ConstraintCompiler::new(&tok).expect("vocabulary");
    for spec in [
        GrammarSpec::Regex("(".into()),
        GrammarSpec::JsonSchema(serde_json::json!({"type": "nope"})),
        GrammarSpec::JsonSchema(serde_json::json!(3)),
        GrammarSpec::Lark("start: undefined_rule".into()),
        GrammarSpec::Choice(vec![]),
    ] {
        match compiler.compile(&spec, "guided_x", MAX_BYTES) {
            Err(ConstraintError::Invalid { field, .. }) => assert_eq!(field, "guided_x"),
            other => panic!("{spec:?}: {other:?}"),
        }
    }
    let big = GrammarSpec::Regex("a".repeat(100));
    assert!(matches!(
        compiler.compile(&big, "guided_regex", 50),
        Err(ConstraintError::TooLarge { .. })
    ));
}

/// A Lark grammar of `r0: r1`, `r1: r2`, … as long as `max` bytes allow.
fn chained_lark(max: usize) -> String {
    let mut g = String::from("start: r0\n");
    let mut i = 0;
    while g.len() + 64 < max {
        g.push_str(&format!("r{i}: r{}\n", i + 1));
        i += 1;
    }
    g.push_str(&format!("r{i}: \"a\"\n"));
    g
}

/// A JSON schema whose `$ref`s chain through as many definitions as `max` bytes allow.
fn chained_refs(max: usize) -> serde_json::Value {
    let mut defs = serde_json::Map::new();
    let mut size = 64;
    let mut i = 0;
    while size + 64 < max {
        let next = serde_json::json!({ "$ref": format!("#/$defs/d{}", i + 1) });
        size += format!("\"d{i}\":{next},").len();
        defs.insert(format!("d{i}"), next);
        i += 1;
    }
    defs.insert(format!("d{i}"), serde_json::json!({"type": "integer"}));
    serde_json::json!({ "$ref": "#/$defs/d0", "$defs": defs })
}

/// Runs `f` on a thread with a 2 MiB stack (a tokio blocking thread's, where the server
/// compiles; the engine thread's too).
fn on_small_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn_scoped(s, f)
            .expect("a thread")
            .join()
            .expect("no panic")
    })
}

/// Grammars as deep as the size limit lets them be (a chain of thousands of Lark rules, of
/// `$ref`s) compile from a thread with a small stack, and constrain generation there: the
/// only output either allows ("a", a number) comes out. (llguidance recurses through the
/// chain: on the caller's stack this overflowed, which aborts the whole process.)
#[test]
fn grammars_as_deep_as_the_size_limit_allows_compile_on_a_small_stack() {
    let tok = tokenizer();
    let compiler = ConstraintCompiler::new(&tok).expect("vocabulary");
    type Allowed = fn(&str) -> bool;
    let cases: [(GrammarSpec, Allowed); 2] = [
        (GrammarSpec::Lark(chained_lark(MAX_BYTES)), |t| t == "a"),
        (GrammarSpec::JsonSchema(chained_refs(MAX_BYTES)), |t| {
            t.parse::<i64>().is_ok()
        }),
    ];
    for (spec, allowed) in cases {
        assert!(spec.size() <= MAX_BYTES, "{}", spec.size());
        assert!(spec.size() > MAX_BYTES - 100, "{}", spec.size());
        let out = on_small_stack(|| {
            let c = compile(&compiler, &spec);
            run(&mut engine(&tok, 512), &[(request(&tok, Some(c), 5), 1)])
        });
        let (text, reason) = (text(&tok, &out[0]), &out[0].1);
        assert_eq!(*reason, FinishReason::Stop, "{text:?}");
        assert!(allowed(&text), "{text:?}");
    }
}
