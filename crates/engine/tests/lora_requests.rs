//! Requests that name LoRA adapters, through the engine over the real CPU model (the Llama HF
//! fixture with two adapters): a request generates bitwise what it generates alone, whatever
//! adapters its neighbours run with, with prefix caching and chunked prefill on; the prefix
//! cache shares blocks only between requests of the same adapter; an adapter the runner does
//! not have is refused before anything runs.

use std::collections::HashMap;
use std::path::Path;

use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::error::EngineError;
use tandem_engine::sampler::SamplingParams;
use tandem_engine::SeqId;
use tandem_model::batch::{AdapterId, TokenId};
use tandem_model::lora::load_peft_adapter;

mod cpu_engine;
use cpu_engine::{config, cpu_engine, hf_fixture, request_under};

/// An engine over the Llama fixture with adapter 0 (the PEFT fixture) and adapter 1 (the
/// same, scaled by -0.5), prefix caching on or off, prefills chunked at 24 tokens.
fn engine(caching: bool) -> Engine {
    let mut model = hf_fixture("llama_tied");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/lora/llama_tied");
    let first = load_peft_adapter(&dir, &model.config).expect("adapter");
    let mut second = first.clone();
    second.scale_all(-0.5);
    model.add_adapter(first).expect("adapter 0");
    model.add_adapter(second).expect("adapter 1");
    let mut c = config(&model.config, 64, 24, 16);
    c.enable_prefix_caching = caching;
    cpu_engine(model, c, 7)
}

fn request(prompt: &[TokenId], adapter: Option<AdapterId>) -> GenerationRequest {
    let sampling = SamplingParams {
        logprobs: true,
        ..SamplingParams::greedy()
    };
    request_under(prompt, sampling, 6, adapter)
}

/// What a request produced: its tokens, the bits of their logprobs, its cached prompt tokens.
type Out = (Vec<TokenId>, Vec<u32>, usize);

/// Runs `reqs` together to the end; their outputs in order.
fn run(engine: &mut Engine, reqs: &[GenerationRequest]) -> Vec<Out> {
    let ids: Vec<SeqId> = reqs
        .iter()
        .map(|r| engine.add_request(r.clone()).expect("valid"))
        .collect();
    let mut out: HashMap<SeqId, Out> = HashMap::new();
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            match e {
                EngineEvent::Token {
                    seq_id,
                    token,
                    logprob,
                    ..
                } => {
                    let o = out.entry(seq_id).or_default();
                    o.0.push(token);
                    o.1.push(logprob.expect("asked").to_bits());
                }
                EngineEvent::Admitted {
                    seq_id,
                    cached_tokens,
                } => out.entry(seq_id).or_default().2 = cached_tokens,
                EngineEvent::Finished { reason, .. } => assert!(!reason.is_failure(), "{reason:?}"),
                EngineEvent::PromptLogprobs { .. } => {}
            }
        }
    }
    assert!(engine.scheduler().allocator().is_idle(), "every block back");
    ids.iter()
        .map(|id| out.remove(id).unwrap_or_default())
        .collect()
}

fn prompt(len: u32, mul: u32) -> Vec<TokenId> {
    (0..len)
        .map(|j| TokenId((j * mul + 11) % 300 + 10))
        .collect()
}

#[test]
fn a_request_generates_what_it_generates_alone_whatever_its_neighbours_adapters() {
    let (p, q) = (prompt(40, 37), prompt(29, 13));
    let adapters = [None, Some(AdapterId(0)), Some(AdapterId(1))];
    let reqs: Vec<GenerationRequest> = adapters
        .iter()
        .flat_map(|&a| [request(&p, a), request(&q, a)])
        .collect();
    let alone: Vec<Out> = reqs
        .iter()
        .map(|r| run(&mut engine(false), std::slice::from_ref(r)).remove(0))
        .collect();
    assert_ne!(
        alone[0].0, alone[2].0,
        "adapter 0 changes what the base model generates"
    );
    assert_ne!(
        alone[2].0, alone[4].0,
        "the two adapters generate differently"
    );
    for caching in [false, true] {
        let together = run(&mut engine(caching), &reqs);
        for (i, (got, want)) in together.iter().zip(&alone).enumerate() {
            assert_eq!(
                (&got.0, &got.1),
                (&want.0, &want.1),
                "request {i}, caching {caching}"
            );
        }
    }
}

#[test]
fn cached_blocks_are_shared_only_under_the_same_adapter() {
    let p = prompt(70, 37);
    let mut e = engine(true);
    let cached = |e: &mut Engine, a| run(e, &[request(&p, a)]).remove(0).2;
    assert_eq!(cached(&mut e, Some(AdapterId(0))), 0, "a cold cache");
    assert_eq!(
        cached(&mut e, None),
        0,
        "the base model does not reuse adapter 0's blocks"
    );
    assert_eq!(cached(&mut e, Some(AdapterId(1))), 0, "nor does adapter 1");
    assert_eq!(
        cached(&mut e, Some(AdapterId(0))),
        64,
        "adapter 0 reuses its own 4 full blocks"
    );
    assert_eq!(cached(&mut e, None), 64, "and the base model its own");
}

#[test]
fn an_adapter_the_runner_lacks_is_refused_before_anything_runs() {
    let mut e = engine(true);
    let err = e
        .add_request(request(&prompt(10, 3), Some(AdapterId(2))))
        .expect_err("2 adapters");
    assert!(
        matches!(&err, EngineError::InvalidParams(m) if m.contains("adapter 2")),
        "{err}"
    );
    assert!(!e.has_unfinished());
    assert!(e.scheduler().allocator().is_idle());
}
