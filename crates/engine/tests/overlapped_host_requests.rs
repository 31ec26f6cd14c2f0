//! Requests that need their tokens on the host (beam search) arriving while overlapped
//! steps run (`engine/overlap.rs`): the engine answers the launched step, runs them
//! synchronously and resumes overlap after. Everything equals the synchronous engine's.

mod cpu_engine;

use std::collections::HashMap;

use cpu_engine::{config, cpu_runner, fixture_model};
use tandem_engine::beam_search::{BeamHypothesis, BeamParams};
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{RequestParams, SeqId};
use tandem_model::batch::TokenId;
use tandem_model::queued_runner::QueuedRunner;

fn request(salt: usize, len: usize, max_tokens: usize, seed: u64) -> GenerationRequest {
    GenerationRequest {
        prompt: (0..len)
            .map(|j| TokenId(((salt * 97 + j * 31 + 3) % 320) as u32))
            .collect(),
        sampling: SamplingParams {
            temperature: 0.9,
            seed: Some(seed),
            presence_penalty: 0.4,
            ..SamplingParams::default()
        },
        limits: RequestParams {
            max_tokens,
            ignore_eos: true,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    }
}

type Outcome = (
    HashMap<SeqId, Vec<TokenId>>,
    HashMap<SeqId, Vec<BeamHypothesis>>,
    u64,
);

/// Sampled requests first; after 3 steps a beam request and another sampled one arrive.
fn run(overlap: bool, blocks: usize, budget: usize) -> Outcome {
    let model = fixture_model();
    let c = config(&model.config, blocks, budget, 4);
    let runner = cpu_runner(model, &c, None);
    let runner: Box<dyn tandem_model::runner::ModelRunner> = if overlap {
        Box::new(QueuedRunner::new(runner))
    } else {
        runner
    };
    let mut engine = Engine::new(runner, c, 3).expect("engine");
    for i in 0..3 {
        engine
            .add_request(request(i, 6 + i, 12, 10 + i as u64))
            .expect("admissible");
    }
    let (mut tokens, mut beams) = (HashMap::<SeqId, Vec<TokenId>>::new(), HashMap::new());
    let mut beam_id = None;
    let mut steps = 0;
    while engine.has_unfinished() || steps < 3 {
        if steps == 3 {
            let p = BeamParams {
                width: 2,
                length_penalty: 1.0,
            };
            beam_id = Some(
                engine
                    .add_beam_request(request(7, 5, 4, 1), p)
                    .expect("beam"),
            );
            engine
                .add_request(request(8, 9, 6, 20))
                .expect("admissible");
        }
        steps += 1;
        assert!(steps < 2000, "no end");
        for e in engine.step().expect("a step") {
            match e {
                EngineEvent::Token { seq_id, token, .. } => {
                    tokens.entry(seq_id).or_default().push(token)
                }
                EngineEvent::Finished { seq_id, reason } => {
                    assert!(!reason.is_failure(), "{reason:?}");
                    if Some(seq_id) == beam_id {
                        let h = engine.take_beam_result(seq_id).expect("beam result");
                        beams.insert(seq_id, h);
                    }
                }
                _ => {}
            }
        }
    }
    assert!(engine.scheduler().allocator().is_idle(), "blocks leaked");
    (tokens, beams, engine.scheduler().stats().num_planned_ahead)
}

#[test]
fn a_beam_request_arriving_mid_overlap_changes_nothing() {
    for (blocks, budget) in [(64, 4096), (64, 5), (12, 64)] {
        let (want_tokens, want_beams, none) = run(false, blocks, budget);
        assert_eq!(none, 0);
        let (tokens, beams, ahead) = run(true, blocks, budget);
        assert!(ahead > 0, "never planned ahead");
        assert_eq!(
            tokens, want_tokens,
            "pool {blocks}, budget {budget}: tokens"
        );
        assert_eq!(beams, want_beams, "pool {blocks}, budget {budget}: beams");
        assert_eq!(beams.len(), 1);
    }
}
