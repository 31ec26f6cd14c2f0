//! Rows whose requests need only their choice get it from the runner: greedy picks
//! (`ModelRunner::forward_greedy`) are the sampler's choice and logprob bit for bit; draws
//! (`ModelRunner::forward_sample`, the algorithm of `tandem_model::row_sampling`) follow
//! the sampler's distribution exactly. An engine run takes these paths exactly when every
//! row of a step allows it, with outputs identical to the sampler's path for greedy rows
//! and seeded draws that do not depend on the batch.

mod cpu_engine;
mod sampler_reference;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cpu_engine::{config, cpu_runner, fixture_model};
use sampler_reference::synthetic_logits;
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::{processed_distribution, sample, SamplerState, SamplingParams};
use tandem_engine::{RequestParams, SeqId};
use tandem_model::batch::{BlockId, ForwardBatch, TokenId};
use tandem_model::logits::Logits;
use tandem_model::row_sampling::{survivors, RowDraw};
use tandem_model::runner::{KvGeometry, ModelRunner};
use tandem_model::token_pick::TokenPick;
use tandem_model::{ModelConfig, Result as ModelResult};

#[test]
fn greedy_pick_is_the_samplers_choice_bitwise() {
    let params = SamplingParams {
        logprobs: true,
        ..SamplingParams::greedy()
    };
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
        let p = TokenPick::greedy(&row).expect("finite");
        assert_eq!(p.token, TokenId(s.token), "step {step}: token");
        assert_eq!(
            Some(p.logprob.to_bits()),
            s.logprob.map(f32::to_bits),
            "step {step}: logprob"
        );
    }
    let mut row = synthetic_logits(50, 1.0, 1);
    row[7] = f32::NAN;
    assert_eq!(TokenPick::greedy(&row), None);
    assert!(sample(&row, &params, &mut state, 0).is_err());
    assert_eq!(TokenPick::greedy(&[]), None);
}

/// Greedy without processors or top logprobs: what the greedy path takes.
fn is_plain_greedy(p: &SamplingParams, num_output: usize) -> bool {
    p.is_greedy() && p.is_unprocessed(num_output)
}

#[test]
fn only_unprocessed_greedy_requests_are_plain() {
    let plain = SamplingParams::greedy();
    assert!(is_plain_greedy(&plain, 0));
    let with = |f: fn(&mut SamplingParams)| {
        let mut p = SamplingParams::greedy();
        f(&mut p);
        p
    };
    assert!(
        !is_plain_greedy(&SamplingParams::default(), 0),
        "temperature 1"
    );
    assert!(!is_plain_greedy(
        &with(|p| p.logit_bias = vec![(1, 2.0)]),
        0
    ));
    assert!(!is_plain_greedy(&with(|p| p.repetition_penalty = 1.2), 0));
    assert!(!is_plain_greedy(&with(|p| p.presence_penalty = 0.5), 0));
    assert!(!is_plain_greedy(&with(|p| p.frequency_penalty = 0.5), 0));
    assert!(!is_plain_greedy(
        &with(|p| (p.logprobs, p.top_logprobs) = (true, 2)),
        0
    ));
    assert!(
        is_plain_greedy(&with(|p| p.logprobs = true), 0),
        "the chosen logprob only"
    );
    let short = with(|p| (p.min_tokens, p.eos_token_ids) = (3, vec![2]));
    assert!(
        !is_plain_greedy(&short, 2),
        "stop tokens suppressed while short"
    );
    assert!(is_plain_greedy(&short, 3));
    assert!(
        is_plain_greedy(&with(|p| p.min_tokens = 3), 0),
        "nothing to suppress"
    );
}

#[test]
fn the_reference_draw_has_the_samplers_distribution() {
    let cases = [
        (0.7, -1, 1.0, 0.0),
        (1.0, 5, 1.0, 0.0),
        (1.0, 1, 1.0, 0.0),
        (0.8, -1, 0.9, 0.0),
        (1.3, 50, 0.3, 0.0),
        (1.0, -1, 1.0, 0.1),
        (0.6, 40, 0.8, 0.05),
        (2.0, 7, 0.5, 0.0),
    ];
    for step in 0..40u64 {
        let mut row = synthetic_logits(500, 3.0, 1000 + step);
        if step % 2 == 0 {
            // A coarse grid: ties at every truncation boundary.
            row.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0);
        }
        for &(temperature, top_k, top_p, min_p) in &cases {
            let params = SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                ..SamplingParams::default()
            };
            let mut state = SamplerState::new(1, &[]);
            let want = processed_distribution(&row, &params, &mut state, 0).expect("finite");
            let kept = survivors(&row, &params.row_sampling(0.5)).expect("finite");
            let total: f64 = kept.iter().map(|&(_, w)| w).sum();
            let mut got = vec![0.0; row.len()];
            kept.iter()
                .for_each(|&(id, w)| got[id as usize] = w / total);
            for (id, (g, w)) in got.iter().zip(want.probs()).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-12 && (*g == 0.0) == (*w == 0.0),
                    "step {step} {params:?}: token {id}: {g} vs {w}"
                );
            }
        }
    }
}

/// Calls of (forward, forward_greedy or forward_greedy_tokens, forward_sample,
/// forward_greedy_tokens).
type Calls = (usize, usize, usize, usize);

/// Counts which path each step took.
#[derive(Debug)]
struct PathCount {
    inner: Box<dyn ModelRunner>,
    /// (forward, forward_greedy or forward_greedy_tokens, forward_sample,
    /// forward_greedy_tokens) calls.
    calls: Arc<Mutex<Calls>>,
    /// Whether to claim to draw where the logits are.
    draws: bool,
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
    fn forward_greedy(&mut self, batch: &ForwardBatch) -> ModelResult<Vec<Option<TokenPick>>> {
        self.calls.lock().expect("not poisoned").1 += 1;
        self.inner.forward_greedy(batch)
    }
    fn forward_greedy_tokens(&mut self, batch: &ForwardBatch) -> ModelResult<Vec<Option<TokenId>>> {
        let mut calls = self.calls.lock().expect("not poisoned");
        calls.1 += 1;
        calls.3 += 1;
        drop(calls);
        self.inner.forward_greedy_tokens(batch)
    }
    fn samples_rows(&self) -> bool {
        self.draws
    }
    fn forward_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
    ) -> ModelResult<Vec<Option<TokenPick>>> {
        self.calls.lock().expect("not poisoned").2 += 1;
        self.inner.forward_sample(batch, rows)
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

/// Tokens, their logprobs (when asked for) and top logprobs.
type Output = (Vec<TokenId>, Vec<Option<f32>>, Vec<Vec<(TokenId, f32)>>);

/// Runs requests `which` of 12 on the fixture model, all submitted at once, each as
/// `sampling(i)` makes it; the runner draws where its logits are when `draws`. Returns
/// every request's output and the (forward, forward_greedy, forward_sample) call counts.
fn run(
    which: &[usize],
    sampling: impl Fn(usize) -> SamplingParams,
    draws: bool,
) -> (HashMap<usize, Output>, Calls) {
    run_with(which, sampling, draws, None)
}

/// [`run`], request `scored` (if any) asking for its prompt's logprobs, which its prefill
/// steps can only get from the logits.
fn run_with(
    which: &[usize],
    sampling: impl Fn(usize) -> SamplingParams,
    draws: bool,
    scored: Option<usize>,
) -> (HashMap<usize, Output>, Calls) {
    let model = fixture_model();
    let cfg = config(&model.config, 64, 48, 4);
    let calls = Arc::new(Mutex::new((0, 0, 0, 0)));
    let runner = PathCount {
        inner: cpu_runner(model, &cfg, None),
        calls: calls.clone(),
        draws,
    };
    let mut engine = Engine::new(Box::new(runner), cfg, 3).expect("engine");
    let vocab = engine.model_config().vocab_size;
    let mut ids: HashMap<SeqId, usize> = HashMap::new();
    for &i in which {
        let prompt = (0..3 + i * 5)
            .map(|j| TokenId(((i * 131 + j * 17 + 5) % vocab) as u32))
            .collect();
        let req = GenerationRequest {
            prompt,
            sampling: sampling(i),
            limits: RequestParams {
                max_tokens: 8,
                ignore_eos: true,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs: (scored == Some(i)).then_some(2),
            prompt_logprobs_start: 1,
        };
        ids.insert(engine.add_request(req).expect("admitted"), i);
    }
    let mut out: HashMap<usize, Output> = HashMap::new();
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            if let EngineEvent::Token {
                seq_id,
                token,
                logprob,
                top_logprobs,
            } = e
            {
                let o = out.entry(ids[&seq_id]).or_default();
                o.0.push(token);
                o.1.push(logprob);
                o.2.push(top_logprobs);
            }
        }
    }
    let counts = *calls.lock().expect("not poisoned");
    (out, counts)
}

/// Per request (in order): its tokens, and the bits of its logprobs and top logprobs.
type Bits = (
    usize,
    Vec<TokenId>,
    Vec<Option<u32>>,
    Vec<Vec<(TokenId, u32)>>,
);

fn bits(out: &HashMap<usize, Output>) -> Vec<Bits> {
    let mut v: Vec<_> = out
        .iter()
        .map(|(i, (t, l, top))| {
            let top = top
                .iter()
                .map(|alts| alts.iter().map(|&(t, l)| (t, l.to_bits())).collect())
                .collect();
            let l = l.iter().map(|v| v.map(f32::to_bits)).collect();
            (*i, t.clone(), l, top)
        })
        .collect();
    v.sort();
    v
}

/// [`bits`] without the top logprobs.
fn chosen(out: &HashMap<usize, Output>) -> Vec<(usize, Vec<TokenId>, Vec<Option<u32>>)> {
    bits(out)
        .into_iter()
        .map(|(i, t, l, _)| (i, t, l))
        .collect()
}

/// [`bits`]' tokens only.
fn tokens(out: &HashMap<usize, Output>) -> Vec<(usize, Vec<TokenId>)> {
    bits(out).into_iter().map(|(i, t, _, _)| (i, t)).collect()
}

const ALL: [usize; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];

fn greedy(top: bool) -> SamplingParams {
    let mut p = SamplingParams::greedy();
    if top {
        (p.logprobs, p.top_logprobs) = (true, 1);
    }
    p
}

fn seeded(i: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.01,
        seed: Some(500 + i as u64),
        ..SamplingParams::default()
    }
}

#[test]
fn engine_steps_pick_greedy_rows_without_logits_and_agree_with_the_sampler() {
    let (plain, (fwd, greedy_calls, _, tokens_only)) = run(&ALL, |_| greedy(false), false);
    assert_eq!(
        fwd, 0,
        "every step of plain greedy requests takes the greedy path"
    );
    assert!(greedy_calls > 0);
    assert_eq!(tokens_only, greedy_calls, "nobody asked for logprobs");
    let none = |o: &Output| o.1.iter().all(Option::is_none) && o.2.iter().all(Vec::is_empty);
    assert!(plain.values().all(none), "no logprobs unless asked");
    let logprob_only = |_| SamplingParams {
        logprobs: true,
        ..SamplingParams::greedy()
    };
    let (reported, (fwd, greedy_calls, _, tokens_only)) = run(&ALL, logprob_only, false);
    assert_eq!((fwd, tokens_only), (0, 0), "picks with their logprobs");
    assert!(greedy_calls > 0);
    let (sampled, (fwd, greedy_calls, _, _)) = run(&ALL, |_| greedy(true), false);
    assert_eq!(greedy_calls, 0, "top_logprobs need the logits");
    assert!(fwd > 0);
    assert_eq!(
        tokens(&plain),
        tokens(&sampled),
        "greedy picks = the sampler's tokens"
    );
    assert_eq!(
        chosen(&reported),
        chosen(&sampled),
        "greedy picks' logprobs = the sampler's"
    );
    let (mixed, (fwd, greedy_calls, _, _)) = run(&ALL, |i| greedy(i.is_multiple_of(4)), false);
    assert!(
        fwd > 0 && greedy_calls > 0,
        "steps with and without such a request"
    );
    assert_eq!(tokens(&plain), tokens(&mixed));
    assert!(plain.values().all(|(t, _, _)| t.len() == 8));
}

#[test]
fn draws_where_the_logits_are_are_seeded_and_batch_invariant() {
    // A runner that draws: sampled and greedy rows go to it, never as logits.
    let mix = |i: usize| {
        if i.is_multiple_of(3) {
            greedy(false)
        } else {
            seeded(i)
        }
    };
    let (together, (fwd, _, draws, _)) = run(&ALL, mix, true);
    assert_eq!(fwd, 0, "no step needs the logits");
    assert!(draws > 0);
    // The same requests alone, or in another company: the same tokens, bit for bit.
    let (alone, _) = run(&[4], mix, true);
    assert_eq!(bits(&alone)[0], bits(&together)[4]);
    let (some, _) = run(&[1, 4, 9], mix, true);
    assert_eq!(bits(&some), {
        let t = bits(&together);
        vec![t[1].clone(), t[4].clone(), t[9].clone()]
    });
    // Greedy requests in that company are unchanged by it.
    let (plain, _) = run(&ALL, |_| greedy(false), false);
    for i in [0, 3, 6, 9] {
        assert_eq!(bits(&together)[i], bits(&plain)[i], "greedy request {i}");
    }
    // Draws do spread: different seeds give different outputs.
    let distinct: std::collections::HashSet<Vec<TokenId>> = together
        .iter()
        .filter(|(i, _)| !i.is_multiple_of(3))
        .map(|(_, (t, _, _))| t.clone())
        .collect();
    assert!(distinct.len() > 4);
    // A runner that does not draw: the same requests are sampled on the host, which walks
    // the survivors in the same id order: the same tokens.
    let (host, (fwd, _, draws, _)) = run(&ALL, mix, false);
    assert!(fwd > 0 && draws == 0);
    assert_eq!(bits(&host), bits(&together), "host draws = device draws");
    // A neighbour asking for its prompt's logprobs sends the steps of its prefill to the
    // host sampler: the seeded requests beside it keep their tokens.
    let (company, (fwd, _, draws, _)) = run_with(&ALL, mix, true, Some(2));
    assert!(fwd > 0 && draws > 0, "steps on both paths");
    let (t, c) = (bits(&together), bits(&company));
    for i in ALL.iter().filter(|&&i| i != 2) {
        assert_eq!(c[*i], t[*i], "request {i} beside a scored one");
    }
}

/// Requests with processors of every kind, greedy and seeded, some reporting top logprobs.
fn processed(i: usize) -> SamplingParams {
    let mut p = if i.is_multiple_of(2) {
        SamplingParams::greedy()
    } else {
        seeded(i)
    };
    match i % 4 {
        0 => p.repetition_penalty = 1.3,
        1 => (p.presence_penalty, p.frequency_penalty) = (0.7, 0.4),
        2 => p.logit_bias = vec![(5, 3.0), (9, -2.0), (5, 1.5), (40, 6.0)],
        _ => (p.min_tokens, p.stop_token_ids) = (5, vec![7, 40, 41]),
    }
    if i.is_multiple_of(3) {
        (p.logprobs, p.top_logprobs) = (true, 1 + i);
    }
    p
}

#[test]
fn processors_and_top_logprobs_run_where_the_logits_are_with_the_samplers_results() {
    let (device, (fwd, greedy_calls, draws, _)) = run(&ALL, processed, true);
    assert_eq!(
        (fwd, greedy_calls),
        (0, 0),
        "every step draws on the runner"
    );
    assert!(draws > 0);
    // The host sampler gives the same tokens, logprobs and top logprobs, bit for bit.
    let (host, (fwd, _, draws, _)) = run(&ALL, processed, false);
    assert!(fwd > 0 && draws == 0);
    assert_eq!(bits(&device), bits(&host), "device draws = host sampler");
    // Alone, or in other company: unchanged.
    let (some, _) = run(&[2, 3, 5], processed, true);
    let d = bits(&device);
    assert_eq!(bits(&some), vec![d[2].clone(), d[3].clone(), d[5].clone()]);
    // The processors did act: outputs differ from the same requests without them.
    let plain = |i: usize| SamplingParams {
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        logit_bias: Vec::new(),
        min_tokens: 0,
        ..processed(i)
    };
    let (unprocessed, _) = run(&ALL, plain, true);
    let u = bits(&unprocessed);
    let changed = ALL.iter().filter(|&&i| u[i].1 != d[i].1).count();
    assert!(
        changed >= 4,
        "{changed} requests changed by their processors"
    );
    // Top logprobs as asked, most likely first.
    for (i, (_, _, top)) in &device {
        let want = if i.is_multiple_of(3) { 1 + i } else { 0 };
        for alts in top {
            assert_eq!(alts.len(), want, "request {i}");
            assert!(alts.windows(2).all(|w| w[0].1 >= w[1].1));
        }
    }
}
