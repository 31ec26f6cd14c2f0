//! Beam search on a fixture model against an independent reference: a plain beam search
//! written here over `Model::forward` of every full sequence (no KV cache sharing, the whole
//! vocabulary ranked), with the rules of `tandem_engine::beam_search` written out again.
//! Also: width 1 is greedy decoding, requests batched together (chunked, with a tiny pool)
//! give what they give alone, beams share prefix blocks and every block returns.

use std::collections::HashMap;

use tandem_engine::beam_search::{BeamHypothesis, BeamParams};
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{RequestParams, SchedulerConfig, SeqId};
use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, TokenId};
use tandem_model::kv_store::KvStore;
use tandem_model::transformer::Model;

mod cpu_engine;
use cpu_engine::{cpu_engine, fixture_model};

fn config(num_blocks: usize, budget: usize, block_size: usize) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(num_blocks, block_size, 256);
    c.max_num_batched_tokens = budget;
    c.long_prefill_token_threshold = budget;
    c
}

fn prompt(len: usize, salt: usize) -> Vec<TokenId> {
    (0..len)
        .map(|j| TokenId(((salt * 97 + j * 31 + 3) % 320) as u32))
        .collect()
}

fn request(prompt: Vec<TokenId>, max_tokens: usize, stop: Vec<TokenId>) -> GenerationRequest {
    GenerationRequest {
        prompt,
        // Beam search ignores sampling; a hot, seeded setting proves it.
        sampling: SamplingParams {
            temperature: 1.5,
            seed: Some(4),
            ..SamplingParams::default()
        },
        limits: RequestParams {
            max_tokens,
            ignore_eos: true,
            stop_token_ids: stop,
            ..RequestParams::default()
        },
        sample_index: 0,
        prompt_logprobs: None,
        prompt_logprobs_start: 1,
    }
}

/// `log_softmax` of the logits after `tokens`, by a fresh full forward pass.
fn logprobs_after(model: &mut Model, tokens: &[TokenId]) -> Vec<f32> {
    let blocks = tokens.len().div_ceil(16);
    let mut kv = KvStore::new(&model.config, 16, blocks).expect("store");
    let table = (0..blocks as u32).map(BlockId).collect();
    let batch = ForwardBatch::single(tokens.to_vec(), 0, table, OutputSelection::Last);
    let logits = model.forward(&batch, &mut kv).expect("forward");
    logits.log_probs(0).expect("finite logits")
}

fn score(cum: f32, len: usize, lp: f32) -> f32 {
    cum / (len as f32).powf(lp)
}

/// An independent beam search: `(tokens, cum_logprob, score)`, best first.
fn reference(
    model: &mut Model,
    req: &GenerationRequest,
    width: usize,
    lp: f32,
) -> Vec<(Vec<TokenId>, f32, f32)> {
    let stop = &req.limits.stop_token_ids;
    let mut live: Vec<(Vec<TokenId>, f32)> = vec![(Vec::new(), 0.0)];
    let mut hyps: Vec<(Vec<TokenId>, f32, f32)> = Vec::new();
    let best_w = |hyps: &mut Vec<(Vec<TokenId>, f32, f32)>| {
        hyps.sort_by(|a, b| b.2.total_cmp(&a.2)); // stable: ties keep discovery order
        hyps.truncate(width);
    };
    loop {
        let mut cands: Vec<(f32, usize, u32)> = Vec::new();
        for (b, (out, cum)) in live.iter().enumerate() {
            let full: Vec<TokenId> = req.prompt.iter().chain(out).copied().collect();
            let lps = logprobs_after(model, &full);
            cands.extend(lps.iter().enumerate().map(|(t, &l)| (cum + l, b, t as u32)));
        }
        cands.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        let mut next: Vec<(Vec<TokenId>, f32)> = Vec::new();
        for (rank, &(cum, b, t)) in cands.iter().take(2 * width).enumerate() {
            let mut toks = live[b].0.clone();
            toks.push(TokenId(t));
            if stop.contains(&TokenId(t)) {
                if rank < width {
                    let s = score(cum, toks.len(), lp);
                    hyps.push((toks, cum, s));
                    best_w(&mut hyps);
                }
            } else if next.len() < width {
                next.push((toks, cum));
            }
        }
        let len = live[0].0.len() + 1;
        if len >= req.limits.max_tokens {
            for (toks, cum) in next {
                let s = score(cum, len, lp);
                hyps.push((toks, cum, s));
                best_w(&mut hyps);
            }
            break;
        }
        let Some(best) = next.first() else { break };
        if hyps.len() == width && score(best.1, len, lp) <= hyps[width - 1].2 {
            break;
        }
        live = next;
    }
    hyps
}

/// Runs the engine until idle; returns beam results and sampled tokens by id.
fn drain(
    engine: &mut Engine,
    beam_ids: &[SeqId],
) -> (
    HashMap<SeqId, Vec<BeamHypothesis>>,
    HashMap<SeqId, Vec<TokenId>>,
) {
    let (mut beams, mut tokens) = (HashMap::new(), HashMap::<SeqId, Vec<TokenId>>::new());
    let mut steps = 0;
    while engine.has_unfinished() {
        steps += 1;
        assert!(steps < 10_000, "the engine makes no progress");
        for e in engine.step().expect("step") {
            match e {
                EngineEvent::Token { seq_id, token, .. } => {
                    assert!(!beam_ids.contains(&seq_id), "beam requests emit no tokens");
                    tokens.entry(seq_id).or_default().push(token);
                }
                EngineEvent::Finished { seq_id, reason } if beam_ids.contains(&seq_id) => {
                    assert!(!reason.is_failure(), "{reason:?}");
                    let h = engine
                        .take_beam_result(seq_id)
                        .expect("result after Finished");
                    beams.insert(seq_id, h);
                }
                EngineEvent::Finished { .. } | EngineEvent::Admitted { .. } => {}
                EngineEvent::PromptLogprobs { .. } => panic!("no request asked for them"),
            }
        }
    }
    (beams, tokens)
}

fn beam_alone(req: &GenerationRequest, p: BeamParams) -> Vec<BeamHypothesis> {
    let mut engine = cpu_engine(fixture_model(), config(64, 4096, 4), 0);
    let id = engine.add_beam_request(req.clone(), p).expect("admitted");
    let (mut beams, _) = drain(&mut engine, &[id]);
    assert!(engine.scheduler().allocator().is_idle(), "blocks leaked");
    beams.remove(&id).expect("finished")
}

fn assert_matches(got: &[BeamHypothesis], want: &[(Vec<TokenId>, f32, f32)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: number of hypotheses");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.tokens, w.0, "{what}: hypothesis {i} tokens");
        assert!(
            g.cum_logprob == w.1 && g.score == w.2,
            "{what}: hypothesis {i}: ({}, {}) vs reference ({}, {})",
            g.cum_logprob,
            g.score,
            w.1,
            w.2
        );
    }
}

#[test]
fn width_one_is_greedy_decoding() {
    let req = request(prompt(7, 1), 6, vec![]);
    let p = BeamParams {
        width: 1,
        length_penalty: 1.0,
    };
    let got = beam_alone(&req, p);
    let mut engine = cpu_engine(fixture_model(), config(64, 4096, 4), 0);
    let mut greedy = req.clone();
    greedy.sampling = SamplingParams {
        logprobs: true,
        ..SamplingParams::greedy()
    };
    let id = engine.add_request(greedy).expect("admitted");
    let (mut logprobs, mut tokens) = (Vec::new(), Vec::new());
    while engine.has_unfinished() {
        for e in engine.step().expect("step") {
            if let EngineEvent::Token { token, logprob, .. } = e {
                tokens.push(token);
                logprobs.push(logprob.expect("asked for"));
            }
        }
    }
    assert_eq!(engine.scheduler().sequence(id).map(|_| ()), None);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].tokens, tokens);
    let cum: f32 = logprobs.iter().sum();
    assert!(
        (got[0].cum_logprob - cum).abs() <= 1e-5,
        "{} vs {cum}",
        got[0].cum_logprob
    );
}

#[test]
fn widths_two_and_three_match_an_independent_beam_search() {
    let mut model = fixture_model();
    for (width, salt, max_tokens, lp) in [
        (2, 2, 3, 1.0),
        (2, 3, 4, 0.0),
        (3, 4, 4, 2.0),
        (3, 5, 3, 0.5),
    ] {
        let req = request(prompt(6 + salt, salt), max_tokens, vec![]);
        let p = BeamParams {
            width,
            length_penalty: lp,
        };
        let want = reference(&mut model, &req, width, lp);
        assert_matches(&beam_alone(&req, p), &want, &format!("W={width} lp={lp}"));
    }
}

#[test]
fn stop_tokens_finish_hypotheses_like_the_reference() {
    let mut model = fixture_model();
    let base = request(prompt(9, 6), 4, vec![]);
    // Make likely tokens stop tokens: the 2nd best first token, and the best second token.
    let first = logprobs_after(&mut model, &base.prompt);
    let mut order: Vec<usize> = (0..first.len()).collect();
    order.sort_by(|&a, &b| first[b].total_cmp(&first[a]));
    let mut after_best = base.prompt.clone();
    after_best.push(TokenId(order[0] as u32));
    let second = logprobs_after(&mut model, &after_best);
    let best_second = (0..second.len())
        .max_by(|&a, &b| second[a].total_cmp(&second[b]).then(b.cmp(&a)))
        .expect("vocab");
    let stop = vec![TokenId(order[1] as u32), TokenId(best_second as u32)];
    for (width, lp) in [(2, 1.0), (3, 0.0)] {
        let req = request(base.prompt.clone(), 4, stop.clone());
        let want = reference(&mut model, &req, width, lp);
        let without = request(base.prompt.clone(), 4, vec![]);
        assert!(
            want != reference(&mut model, &without, width, lp),
            "the stop tokens must change the search"
        );
        let p = BeamParams {
            width,
            length_penalty: lp,
        };
        assert_matches(&beam_alone(&req, p), &want, &format!("stop W={width}"));
    }
}

#[test]
fn beams_share_prefix_blocks_and_release_them() {
    let width = 3;
    // 6 prompt tokens in blocks of 4: one full block, one partial one.
    let req = request(prompt(6, 7), 4, vec![]);
    let mut engine = cpu_engine(fixture_model(), config(64, 4096, 4), 0);
    let p = BeamParams {
        width,
        length_penalty: 1.0,
    };
    let root = engine.add_beam_request(req, p).expect("admitted");
    assert!(engine.step().expect("prefill").is_empty());
    let s = engine.scheduler();
    assert!(s.sequence(root).is_none(), "the root forked into its beams");
    assert_eq!(s.num_running(), width);
    let alloc = s.allocator();
    assert_eq!(
        alloc.num_total() - alloc.num_free(),
        2,
        "the prompt is stored once"
    );
    for b in 0..2u32 {
        assert_eq!(
            alloc.refcount(BlockId(b)),
            Some(width as u32),
            "block {b} shared"
        );
    }
    assert!(engine.step().expect("decode").is_empty());
    let alloc = engine.scheduler().allocator();
    assert_eq!(alloc.refcount(BlockId(0)), Some(width as u32));
    while engine.has_unfinished() {
        engine.step().expect("step");
    }
    assert!(engine.take_beam_result(root).is_some());
    assert!(engine.take_beam_result(root).is_none(), "taken once");
    assert!(engine.scheduler().allocator().is_idle(), "blocks leaked");
}

#[test]
fn batched_chunked_and_preempted_beams_equal_beams_alone() {
    let reqs: Vec<(GenerationRequest, BeamParams)> = [(2, 8, 1.0), (3, 11, 0.0), (2, 5, 2.0)]
        .iter()
        .enumerate()
        .map(|(i, &(width, len, lp))| {
            let p = BeamParams {
                width,
                length_penalty: lp,
            };
            (request(prompt(len, 10 + i), 4, vec![]), p)
        })
        .collect();
    let alone: Vec<Vec<BeamHypothesis>> = reqs.iter().map(|(r, p)| beam_alone(r, *p)).collect();
    let sampled = request(prompt(10, 20), 7, vec![]);
    let sampled_alone = {
        let mut e = cpu_engine(fixture_model(), config(64, 4096, 4), 0);
        let id = e.add_request(sampled.clone()).expect("admitted");
        drain(&mut e, &[]).1.remove(&id).expect("tokens")
    };
    for (blocks, budget) in [(64, 4096), (64, 5), (9, 64)] {
        let mut engine = cpu_engine(fixture_model(), config(blocks, budget, 4), 0);
        let ids: Vec<SeqId> = reqs
            .iter()
            .map(|(r, p)| engine.add_beam_request(r.clone(), *p).expect("admitted"))
            .collect();
        let sid = engine.add_request(sampled.clone()).expect("admitted");
        let (beams, tokens) = drain(&mut engine, &ids);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                beams[id], alone[i],
                "pool {blocks}, budget {budget}: request {i}"
            );
        }
        assert_eq!(
            tokens[&sid], sampled_alone,
            "the sampled request beside the beams"
        );
        assert!(engine.scheduler().allocator().is_idle(), "blocks leaked");
        if blocks == 9 {
            assert!(
                engine.scheduler().stats().num_preemptions > 0,
                "tiny pool preempts"
            );
        }
    }
}

#[test]
fn abort_and_bad_params() {
    let mut engine = cpu_engine(fixture_model(), config(64, 4096, 4), 0);
    let req = request(prompt(6, 30), 4, vec![]);
    let p = BeamParams {
        width: 2,
        length_penalty: 1.0,
    };
    assert!(engine
        .add_beam_request(req.clone(), BeamParams { width: 0, ..p })
        .is_err());
    let id = engine.add_beam_request(req, p).expect("admitted");
    engine.step().expect("prefill");
    engine.step().expect("decode");
    engine.abort(id).expect("abort a beam request");
    assert!(!engine.has_unfinished());
    assert!(engine.take_beam_result(id).is_none());
    assert!(engine.scheduler().allocator().is_idle(), "blocks leaked");
}
