//! Plain greedy rows are picked from three numbers per row (`ModelRunner::forward_greedy`,
//! which a device runner computes where the logits are): the pick is the sampler's choice
//! and logprob bit for bit, and an engine run takes that path exactly when every row of a
//! step is plain greedy, with outputs identical to the sampler's path.

mod cpu_engine;
mod sampler_reference;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cpu_engine::{config, cpu_runner, fixture_model};
use sampler_reference::synthetic_logits;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::{sample, SamplerState, SamplingParams};
use tandem_engine::{RequestParams, SeqId};
use tandem_model::batch::{BlockId, ForwardBatch, TokenId};
use tandem_model::greedy::GreedyPick;
use tandem_model::logits::Logits;
use tandem_model::runner::{KvGeometry, ModelRunner};
use tandem_model::{ModelConfig, Result as ModelResult};

#[test]
fn greedy_pick_is_the_samplers_choice_bitwise() {
    let params = SamplingParams::greedy();
    let mut state = SamplerState::new(5, &[]);
    for step in 0..300u64 {
        let mut row = synthetic_logits(1000, 4.0, step);
        if step % 3 == 0 {
            let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row[(step as usize * 37) % 1000] = top; // a tie for the maximum
        }
        if step % 5 == 0 {
            row.iter_mut().for_each(|v| *v = -v.abs());
            row[600] = 0.0;
            row[400] = -0.0; // zeros of both signs are the largest values
        }
        let s = sample(&row, &params, &mut state, 0).expect("finite");
        let p = GreedyPick::of_row(&row).expect("finite");
        assert_eq!(p.token, TokenId(s.token), "step {step}: token");
        assert_eq!(
            p.logprob.to_bits(),
            s.logprob.to_bits(),
            "step {step}: logprob"
        );
    }
    let mut row = synthetic_logits(50, 1.0, 1);
    row[7] = f32::NAN;
    assert_eq!(GreedyPick::of_row(&row), None);
    assert!(sample(&row, &params, &mut state, 0).is_err());
    assert_eq!(GreedyPick::of_row(&[]), None);
}

#[test]
fn only_unprocessed_greedy_requests_are_plain() {
    let plain = SamplingParams::greedy();
    assert!(plain.is_plain_greedy(0));
    let with = |f: fn(&mut SamplingParams)| {
        let mut p = SamplingParams::greedy();
        f(&mut p);
        p
    };
    assert!(
        !SamplingParams::default().is_plain_greedy(0),
        "temperature 1"
    );
    assert!(!with(|p| p.logit_bias = vec![(1, 2.0)]).is_plain_greedy(0));
    assert!(!with(|p| p.repetition_penalty = 1.2).is_plain_greedy(0));
    assert!(!with(|p| p.presence_penalty = 0.5).is_plain_greedy(0));
    assert!(!with(|p| p.frequency_penalty = 0.5).is_plain_greedy(0));
    assert!(!with(|p| (p.logprobs, p.top_logprobs) = (true, 2)).is_plain_greedy(0));
    assert!(
        with(|p| p.logprobs = true).is_plain_greedy(0),
        "the chosen logprob only"
    );
    let short = with(|p| (p.min_tokens, p.eos_token_ids) = (3, vec![2]));
    assert!(
        !short.is_plain_greedy(2),
        "stop tokens suppressed while short"
    );
    assert!(short.is_plain_greedy(3));
    assert!(
        with(|p| p.min_tokens = 3).is_plain_greedy(0),
        "nothing to suppress"
    );
}

/// Counts which of the two paths each step took.
#[derive(Debug)]
struct PathCount {
    inner: Box<dyn ModelRunner>,
    /// (forward calls, forward_greedy calls)
    calls: Arc<Mutex<(usize, usize)>>,
}

impl ModelRunner for PathCount {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn kv_geometry(&self) -> KvGeometry {
        self.inner.kv_geometry()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> ModelResult<Logits> {
        self.calls.lock().expect("not poisoned").0 += 1;
        self.inner.forward(batch)
    }
    fn forward_greedy(&mut self, batch: &ForwardBatch) -> ModelResult<Vec<Option<GreedyPick>>> {
        self.calls.lock().expect("not poisoned").1 += 1;
        self.inner.forward_greedy(batch)
    }
    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> ModelResult<()> {
        self.inner.copy_blocks(copies)
    }
    fn cached_logits(&mut self, table: &[BlockId], positions: Range<usize>) -> ModelResult<Logits> {
        self.inner.cached_logits(table, positions)
    }
    fn model_identity(&self) -> u64 {
        self.inner.model_identity()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

type Output = (Vec<TokenId>, Vec<f32>);

/// Runs 12 greedy requests on the fixture model; request `i` asks for one top logprob
/// when `top(i)`. Returns the outputs and the (forward, forward_greedy) call counts.
fn run(top: impl Fn(usize) -> bool) -> (Vec<Output>, (usize, usize)) {
    let model = fixture_model();
    let cfg = config(&model.config, 64, 48, 4);
    let calls = Arc::new(Mutex::new((0, 0)));
    let runner = PathCount {
        inner: cpu_runner(model, &cfg, None),
        calls: calls.clone(),
    };
    let mut engine = Engine::new(Box::new(runner), cfg, 3).expect("engine");
    let vocab = engine_vocab(&engine);
    let mut ids: HashMap<SeqId, usize> = HashMap::new();
    for i in 0..12 {
        let prompt = (0..3 + i * 5)
            .map(|j| TokenId(((i * 131 + j * 17 + 5) % vocab) as u32))
            .collect();
        let mut sampling = SamplingParams::greedy();
        if top(i) {
            (sampling.logprobs, sampling.top_logprobs) = (true, 1);
        }
        let req = GenerationRequest {
            prompt,
            sampling,
            limits: RequestParams {
                max_tokens: 8,
                ignore_eos: true,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
        };
        ids.insert(engine.add_request(req).expect("admitted"), i);
    }
    let mut out: Vec<Output> = vec![(Vec::new(), Vec::new()); 12];
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            if let EngineEvent::Token {
                seq_id,
                token,
                logprob,
                ..
            } = e
            {
                out[ids[&seq_id]].0.push(token);
                out[ids[&seq_id]].1.push(logprob);
            }
        }
    }
    let counts = *calls.lock().expect("not poisoned");
    (out, counts)
}

fn engine_vocab(engine: &Engine) -> usize {
    engine.model_config().vocab_size
}

fn bits(out: &[Output]) -> Vec<(Vec<TokenId>, Vec<u32>)> {
    out.iter()
        .map(|(t, l)| (t.clone(), l.iter().map(|v| v.to_bits()).collect()))
        .collect()
}

#[test]
fn engine_steps_pick_greedy_rows_without_logits_and_agree_with_the_sampler() {
    let (plain, (fwd, greedy)) = run(|_| false);
    assert_eq!(
        fwd, 0,
        "every step of plain greedy requests takes the greedy path"
    );
    assert!(greedy > 0);
    let (sampled, (fwd, greedy)) = run(|_| true);
    assert_eq!(greedy, 0, "top_logprobs need the logits");
    assert!(fwd > 0);
    assert_eq!(
        bits(&plain),
        bits(&sampled),
        "greedy picks = the sampler's tokens"
    );
    let (mixed, (fwd, greedy)) = run(|i| i % 4 == 0);
    assert!(
        fwd > 0 && greedy > 0,
        "steps with and without such a request"
    );
    assert_eq!(bits(&plain), bits(&mixed));
    assert!(plain.iter().all(|(t, _)| t.len() == 8));
}
