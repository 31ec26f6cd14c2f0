//! `tandem bench --engine` (implied by `--speculative`): decode throughput through the whole
//! engine (scheduler, sampler, speculation), one JSON line per (B, P) with the speculative
//! decoding counters of that configuration.
//!
//! B requests (EOS ignored, G tokens each; greedy unless `--temperature` is given) are
//! submitted together. The prefill ends
//! when every request has its first token; decode tok/s counts the remaining `B * (G - 1)`
//! tokens over the time after that.

use std::time::Instant;

use anyhow::{ensure, Result};
use serde_json::{json, Value};
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::{Constraint, SamplingParams};
use tandem_engine::speculative::SpecStats;
use tandem_engine::RequestParams;
use tandem_model::batch::{AdapterId, TokenId};

/// What the prompts look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PromptKind {
    /// Random tokens: nothing to copy.
    Random,
    /// A random segment of P/2 tokens written twice: the continuation copies it.
    Copy,
}

impl PromptKind {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            PromptKind::Random => "random",
            PromptKind::Copy => "copy",
        }
    }
}

/// One configuration's numbers.
pub struct EngineRun {
    pub prefill_s: f64,
    pub decode_s: f64,
    pub decode_tokens: usize,
    pub spec: SpecStats,
    /// With a constraint: the mean mask time per step, in ms.
    pub mask_ms: Option<f64>,
    /// Engine steps, and of them those planned ahead of the previous step's result
    /// (overlapped steps).
    pub steps: u64,
    pub planned_ahead: u64,
}

/// The prompt of sequence `seq` of `kind`, `len` tokens.
pub fn prompt(kind: PromptKind, seq: usize, len: usize, vocab: usize) -> Vec<TokenId> {
    match kind {
        PromptKind::Random => super::bench_cmd::prompt_tokens(seq, len, vocab),
        PromptKind::Copy => {
            let half = super::bench_cmd::prompt_tokens(seq, len.div_ceil(2), vocab);
            half.iter().cycle().take(len).copied().collect()
        }
    }
}

/// Runs `prompts` (each for `gen_len` tokens chosen as `sampling` says, request `s` seeded
/// with `s`, all with LoRA `adapter`) through `engine` to completion. With a constraint
/// (structured output), requests may end early when the grammar completes.
pub fn run(
    engine: &mut Engine,
    prompts: Vec<Vec<TokenId>>,
    gen_len: usize,
    (sampling, adapter): (&SamplingParams, Option<AdapterId>),
) -> Result<EngineRun> {
    let constraint = sampling.constraint.as_ref();
    ensure!(gen_len >= 2, "--gen-len must be at least 2 with --engine");
    let before = engine.spec_stats();
    let stats_before = engine.scheduler().stats();
    let b = prompts.len();
    let started = Instant::now();
    for (s, p) in prompts.into_iter().enumerate() {
        engine.add_request(GenerationRequest {
            prompt: p,
            sampling: SamplingParams {
                seed: Some(s as u64),
                ..sampling.clone()
            },
            limits: RequestParams {
                max_tokens: gen_len,
                ignore_eos: constraint.is_none(),
                adapter,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
        })?;
    }
    let mut firsts = std::collections::HashSet::new();
    let mut tokens = 0usize;
    // The first request's tokens, for the mask timing.
    let (mut first_id, mut first_output) = (None, Vec::new());
    let mut decode_started = None;
    while engine.has_unfinished() {
        for e in engine.step()? {
            if let EngineEvent::Token { seq_id, token, .. } = e {
                if *first_id.get_or_insert(seq_id) == seq_id {
                    first_output.push(token.0);
                }
                tokens += 1;
                firsts.insert(seq_id);
            }
        }
        if decode_started.is_none() && firsts.len() == b {
            decode_started = Some((Instant::now(), tokens));
        }
    }
    let (t0, tokens_at_t0) = decode_started.unwrap_or((Instant::now(), tokens));
    let stats = engine.scheduler().stats();
    Ok(EngineRun {
        steps: stats.num_steps - stats_before.num_steps,
        planned_ahead: stats.num_planned_ahead - stats_before.num_planned_ahead,
        prefill_s: (t0 - started).as_secs_f64(),
        decode_s: t0.elapsed().as_secs_f64(),
        decode_tokens: tokens - tokens_at_t0,
        spec: delta(&engine.spec_stats(), &before),
        mask_ms: constraint.map(|c| mask_ms(c, &first_output, engine.model_config().vocab_size)),
    })
}

/// Mean time to compute and apply one step's grammar mask, in ms: the first request's
/// output replayed through a fresh state of `constraint`.
fn mask_ms(constraint: &Constraint, output: &[u32], vocab: usize) -> f64 {
    let mut state = constraint.start();
    let mut row = vec![0.0f64; vocab];
    let started = Instant::now();
    let mut steps = 0usize;
    for &t in output {
        row.fill(0.0);
        if state.apply(&mut row, &[]).is_err() {
            break;
        }
        state.commit(t);
        steps += 1;
    }
    started.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64
}

/// Counters accumulated between `before` and `after`.
fn delta(after: &SpecStats, before: &SpecStats) -> SpecStats {
    SpecStats {
        num_drafts: after.num_drafts - before.num_drafts,
        num_draft_tokens: after.num_draft_tokens - before.num_draft_tokens,
        num_accepted_tokens: after.num_accepted_tokens - before.num_accepted_tokens,
        accepted_per_position: after
            .accepted_per_position
            .iter()
            .zip(
                before
                    .accepted_per_position
                    .iter()
                    .chain(std::iter::repeat(&0)),
            )
            .map(|(a, b)| a - b)
            .collect(),
    }
}

/// The JSON fields of one run.
pub fn report(r: &EngineRun) -> Value {
    json!({
        "prefill_s": r.prefill_s,
        "decode_s": r.decode_s,
        "decode_tok_per_s": r.decode_tokens as f64 / r.decode_s,
        "decode_tokens": r.decode_tokens,
        "mask_ms_per_step": r.mask_ms,
        "steps": r.steps,
        "steps_planned_ahead": r.planned_ahead,
        "spec_num_drafts": r.spec.num_drafts,
        "spec_num_draft_tokens": r.spec.num_draft_tokens,
        "spec_num_accepted_tokens": r.spec.num_accepted_tokens,
        "spec_accepted_per_position": r.spec.accepted_per_position,
        "spec_acceptance_rate": r.spec.acceptance_rate(),
        "spec_mean_acceptance_length": r.spec.mean_acceptance_length(),
    })
}
