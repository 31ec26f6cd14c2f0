//! The host's share of an engine step: scheduling, row draws, applying the picks, stop
//! checks and events, measured over a runner that costs nothing (its picks are a hash of
//! the batch, no logits). On a GPU this is the time the device waits for the host between
//! synchronous steps, and what overlapped steps hide behind the device's work.
//!
//! ```text
//! cargo run --release -p tandem-engine --example host_step_cost [-- VOCAB]
//! ```
//!
//! Prints one JSON line per batch size: microseconds of host time per decode step, greedy
//! and seeded-sampled requests, with and without penalties.

use std::ops::Range;
use std::time::Instant;

use tandem_engine::engine::{Engine, GenerationRequest};
use tandem_engine::sampler::SamplingParams;
use tandem_engine::{RequestParams, SchedulerConfig};
use tandem_model::batch::{BlockId, ForwardBatch, TokenId};
use tandem_model::config::ModelConfig;
use tandem_model::fake_runner::FakeRunner;
use tandem_model::logits::Logits;
use tandem_model::row_sampling::RowDraw;
use tandem_model::runner::{KvDtype, KvGeometry, ModelRunner};
use tandem_model::token_pick::TokenPick;
use tandem_model::{ModelError, Result};

/// A runner whose every pick is a hash of the row's position: no weights, no logits.
#[derive(Debug)]
struct InstantRunner {
    config: ModelConfig,
    geometry: KvGeometry,
}

impl ModelRunner for InstantRunner {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn kv_geometry(&self) -> KvGeometry {
        self.geometry
    }
    fn forward(&mut self, _: &ForwardBatch) -> Result<Logits> {
        Err(ModelError::Batch(
            "the instant runner makes no logits".into(),
        ))
    }
    fn forward_greedy(&mut self, batch: &ForwardBatch) -> Result<Vec<Option<TokenPick>>> {
        Ok(self.picks(batch))
    }
    fn samples_rows(&self) -> bool {
        true
    }
    fn forward_sample(
        &mut self,
        batch: &ForwardBatch,
        _: &[RowDraw],
    ) -> Result<Vec<Option<TokenPick>>> {
        Ok(self.picks(batch))
    }
    fn copy_blocks(&mut self, _: &[(BlockId, BlockId)]) -> Result<()> {
        Ok(())
    }
    fn cached_logits(&mut self, _: &[BlockId], _: Range<usize>) -> Result<Logits> {
        Err(ModelError::Batch(
            "the instant runner keeps no hidden states".into(),
        ))
    }
    fn model_identity(&self) -> u64 {
        1
    }
    fn describe(&self) -> String {
        "instant runner (no model)".into()
    }
}

impl InstantRunner {
    fn picks(&self, batch: &ForwardBatch) -> Vec<Option<TokenPick>> {
        let positions = batch.positions();
        let vocab = self.config.vocab_size as u64;
        batch
            .output_rows()
            .into_iter()
            .map(|r| {
                let h = (positions[r] as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
                Some(TokenPick {
                    token: TokenId((h % (vocab - 1)) as u32 + 1), // never 0, the EOS here
                    logprob: -1.0,
                    top_logprobs: Vec::new(),
                })
            })
            .collect()
    }
}

/// A model's configuration with `vocab` tokens (the fake runner's shapes; nothing is
/// computed with them).
fn config(vocab: usize) -> ModelConfig {
    FakeRunner::new(vocab, 4096, 1, 1, 0).config().clone()
}

/// Microseconds of host time per decode step for `batch` requests of 512-token prompts
/// generating 128 tokens each, sampled as `sampling` says.
fn host_us_per_step(vocab: usize, batch: usize, sampling: &SamplingParams) -> f64 {
    let (block, prompt, gen) = (16, 512, 128);
    let blocks = batch * (prompt + gen) / block + batch;
    let mut c = SchedulerConfig::new(blocks, block, 4096);
    c.max_num_batched_tokens = 8192;
    c.max_num_seqs = batch.max(1);
    let geometry = KvGeometry {
        block_size: block,
        num_blocks: blocks,
        dtype: KvDtype::Bf16,
        bytes_per_token: 0,
    };
    let runner = InstantRunner {
        config: config(vocab),
        geometry,
    };
    let mut engine = Engine::new(Box::new(runner), c, 7).expect("engine");
    for i in 0..batch {
        let tokens = (0..prompt).map(|j| TokenId(((i * 131 + j * 7) % vocab) as u32));
        engine
            .add_request(GenerationRequest {
                prompt: tokens.collect(),
                sampling: SamplingParams {
                    seed: Some(i as u64),
                    ..sampling.clone()
                },
                limits: RequestParams {
                    max_tokens: gen,
                    ignore_eos: true,
                    ..RequestParams::default()
                },
                sample_index: 0,
                prompt_logprobs: None,
                prompt_logprobs_start: 1,
            })
            .expect("admissible");
    }
    // Prefill (and the first token) outside the timing.
    while engine.scheduler().stats().num_steps < 2 {
        engine.step().expect("a step");
    }
    let (started, steps0) = (Instant::now(), engine.scheduler().stats().num_steps);
    while engine.has_unfinished() {
        engine.step().expect("a step");
    }
    let steps = engine.scheduler().stats().num_steps - steps0;
    started.elapsed().as_secs_f64() * 1e6 / steps.max(1) as f64
}

fn main() {
    let vocab: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(49_152);
    let sampled = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        ..SamplingParams::default()
    };
    let penalised = SamplingParams {
        repetition_penalty: 1.1,
        presence_penalty: 0.5,
        ..sampled.clone()
    };
    for batch in [1, 8, 64, 256] {
        let greedy = host_us_per_step(vocab, batch, &SamplingParams::greedy());
        let sampled = host_us_per_step(vocab, batch, &sampled);
        let penalised = host_us_per_step(vocab, batch, &penalised);
        println!(
            "{{\"vocab\":{vocab},\"batch\":{batch},\"prompt_len\":512,\"host_us_per_step\":\
             {{\"greedy\":{greedy:.1},\"sampled\":{sampled:.1},\"penalised\":{penalised:.1}}}}}"
        );
    }
}
