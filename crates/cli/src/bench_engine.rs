//! `tandem bench --engine` (implied by `--speculative`): decode throughput through the whole
//! engine (scheduler, sampler, speculation), one JSON line per (B, P) with the speculative
//! decoding counters of that configuration.
//!
//! B greedy requests (EOS ignored, G tokens each) are submitted together. The prefill ends
//! when every request has its first token; decode tok/s counts the remaining `B * (G - 1)`
//! tokens over the time after that.

use std::time::Instant;

use anyhow::{ensure, Result};
use serde_json::{json, Value};
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::speculative::SpecStats;
use tandem_engine::RequestParams;
use tandem_model::batch::TokenId;

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

/// Runs `prompts` (each for `gen_len` greedy tokens) through `engine` to completion.
pub fn run(engine: &mut Engine, prompts: Vec<Vec<TokenId>>, gen_len: usize) -> Result<EngineRun> {
    ensure!(gen_len >= 2, "--gen-len must be at least 2 with --engine");
    let before = engine.spec_stats();
    let b = prompts.len();
    let started = Instant::now();
    for p in prompts {
        engine.add_request(GenerationRequest {
            prompt: p,
            sampling: SamplingParams::greedy(),
            limits: RequestParams {
                max_tokens: gen_len,
                ignore_eos: true,
                ..RequestParams::default()
            },
            sample_index: 0,
            prompt_logprobs: None,
            prompt_logprobs_start: 1,
        })?;
    }
    let mut firsts = std::collections::HashSet::new();
    let mut tokens = 0usize;
    let mut decode_started = None;
    while engine.has_unfinished() {
        for e in engine.step()? {
            if let EngineEvent::Token { seq_id, .. } = e {
                tokens += 1;
                firsts.insert(seq_id);
            }
        }
        if decode_started.is_none() && firsts.len() == b {
            decode_started = Some((Instant::now(), tokens));
        }
    }
    let (t0, tokens_at_t0) = decode_started.unwrap_or((Instant::now(), tokens));
    Ok(EngineRun {
        prefill_s: (t0 - started).as_secs_f64(),
        decode_s: t0.elapsed().as_secs_f64(),
        decode_tokens: tokens - tokens_at_t0,
        spec: delta(&engine.spec_stats(), &before),
    })
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
        "spec_num_drafts": r.spec.num_drafts,
        "spec_num_draft_tokens": r.spec.num_draft_tokens,
        "spec_num_accepted_tokens": r.spec.num_accepted_tokens,
        "spec_accepted_per_position": r.spec.accepted_per_position,
        "spec_acceptance_rate": r.spec.acceptance_rate(),
        "spec_mean_acceptance_length": r.spec.mean_acceptance_length(),
    })
}
