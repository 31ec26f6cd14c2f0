//! When to speculate and what came of it: the configuration, the per-request acceptance
//! back-off, the drafts' distributions between proposal and verification, and the counters.

use std::collections::HashMap;

use super::{Proposal, ProposalInput, Proposer, MAX_SPECULATIVE_TOKENS};
use crate::error::{EngineError, Result};
use crate::sampler::TokenDistribution;
use crate::sequence::SeqId;

/// How speculative decoding runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeConfig {
    /// Draft tokens proposed per sequence and step (`k`), 1..=[`MAX_SPECULATIVE_TOKENS`].
    pub num_tokens: usize,
    /// Speculate only while at most this many sequences are running: past it the extra rows
    /// cost more than the steps they save.
    pub max_batch_size: usize,
    /// A request whose smoothed acceptance rate (accepted / proposed, exponential moving
    /// average) falls below this pauses speculation for `pause_steps` engine steps.
    pub min_acceptance: f64,
    /// Steps a request pauses after low acceptance before it tries again.
    pub pause_steps: u64,
}

impl Default for SpeculativeConfig {
    fn default() -> SpeculativeConfig {
        SpeculativeConfig {
            num_tokens: 4,
            max_batch_size: 8,
            min_acceptance: 0.15,
            pause_steps: 16,
        }
    }
}

impl SpeculativeConfig {
    /// Checks every value is in range.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&self.num_tokens) {
            return Err(EngineError::InvalidConfig(format!(
                "num_speculative_tokens must be in 1..={MAX_SPECULATIVE_TOKENS}, got {}",
                self.num_tokens
            )));
        }
        if !(0.0..=1.0).contains(&self.min_acceptance) {
            return Err(EngineError::InvalidConfig(format!(
                "min_acceptance must be in [0, 1], got {}",
                self.min_acceptance
            )));
        }
        Ok(())
    }
}

/// Counters over the engine's life (vLLM's `spec_decode_*` metrics).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpecStats {
    /// Verifications of a sequence with at least one draft (`vllm:spec_decode_num_drafts`).
    pub num_drafts: u64,
    /// Draft tokens verified (`vllm:spec_decode_num_draft_tokens`).
    pub num_draft_tokens: u64,
    /// Draft tokens accepted (`vllm:spec_decode_num_accepted_tokens`).
    pub num_accepted_tokens: u64,
    /// `[num_tokens]` accepted drafts by position in the run
    /// (`vllm:spec_decode_num_accepted_tokens_per_pos`).
    pub accepted_per_position: Vec<u64>,
}

impl SpecStats {
    /// Accepted / verified draft tokens (0 before any).
    pub fn acceptance_rate(&self) -> f64 {
        if self.num_draft_tokens == 0 {
            0.0
        } else {
            self.num_accepted_tokens as f64 / self.num_draft_tokens as f64
        }
    }

    /// Mean tokens emitted per verification: 1 + accepted / drafts (0 before any).
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.num_drafts == 0 {
            0.0
        } else {
            1.0 + self.num_accepted_tokens as f64 / self.num_drafts as f64
        }
    }
}

/// Weight of the newest step in a request's smoothed acceptance rate.
const EMA_WEIGHT: f64 = 0.3;

/// One request's speculation state.
#[derive(Debug, Default)]
struct RequestSpec {
    /// Per-request `k` (0 turns speculation off for it).
    k_override: Option<usize>,
    /// Smoothed acceptance rate; `None` until its first verification.
    ema: Option<f64>,
    /// No proposals before this step.
    paused_until: u64,
    /// The distributions of the drafts in flight (`None`: certain drafts).
    dists: Option<Vec<TokenDistribution>>,
}

/// The engine's speculation: a proposer, its configuration, per-request state, counters.
#[derive(Debug)]
pub struct Speculation {
    config: SpeculativeConfig,
    proposer: Box<dyn Proposer>,
    stats: SpecStats,
    requests: HashMap<SeqId, RequestSpec>,
    step: u64,
}

impl Speculation {
    /// Speculation with `proposer` under `config` (validated).
    pub fn new(config: SpeculativeConfig, proposer: Box<dyn Proposer>) -> Result<Speculation> {
        config.validate()?;
        let stats = SpecStats {
            accepted_per_position: vec![0; config.num_tokens],
            ..SpecStats::default()
        };
        Ok(Speculation {
            config,
            proposer,
            stats,
            requests: HashMap::new(),
            step: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SpeculativeConfig {
        &self.config
    }

    /// The counters.
    pub fn stats(&self) -> &SpecStats {
        &self.stats
    }

    /// The proposer's name.
    pub fn proposer_name(&self) -> &'static str {
        self.proposer.name()
    }

    /// Starts an engine step; false when `num_running` sequences are too many to speculate.
    pub fn begin_step(&mut self, num_running: usize) -> bool {
        self.step += 1;
        num_running <= self.config.max_batch_size
    }

    /// Sets a request's own `k` (capped at [`MAX_SPECULATIVE_TOKENS`]; 0 = no speculation).
    pub fn set_num_tokens(&mut self, id: SeqId, k: usize) {
        self.requests.entry(id).or_default().k_override = Some(k.min(MAX_SPECULATIVE_TOKENS));
    }

    /// How many drafts to ask for `id` this step, with at most `room` useful (0 = none).
    pub fn wanted(&self, id: SeqId, room: usize) -> usize {
        let r = self.requests.get(&id);
        if r.is_some_and(|r| r.paused_until > self.step) {
            return 0;
        }
        let k = r
            .and_then(|r| r.k_override)
            .unwrap_or(self.config.num_tokens);
        k.min(room)
    }

    /// Asks the proposer.
    pub fn propose(&mut self, inputs: &[ProposalInput<'_>]) -> Result<Vec<Proposal>> {
        self.proposer.propose(inputs)
    }

    /// Keeps the distributions of `id`'s drafts until they are verified.
    pub fn hold(&mut self, id: SeqId, dists: Option<Vec<TokenDistribution>>) {
        self.requests.entry(id).or_default().dists = dists;
    }

    /// The distributions of `id`'s first `n` drafts held by [`Speculation::hold`].
    pub fn take_dists(&mut self, id: SeqId, n: usize) -> Option<Vec<TokenDistribution>> {
        let mut d = self.requests.get_mut(&id)?.dists.take()?;
        d.truncate(n);
        Some(d)
    }

    /// Records a verification of `proposed` drafts of which the first `accepted` were kept,
    /// and pauses the request when its smoothed acceptance stays low.
    pub fn record(&mut self, id: SeqId, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        self.stats.num_drafts += 1;
        self.stats.num_draft_tokens += proposed as u64;
        self.stats.num_accepted_tokens += accepted as u64;
        for slot in self.stats.accepted_per_position.iter_mut().take(accepted) {
            *slot += 1;
        }
        let rate = accepted as f64 / proposed as f64;
        let r = self.requests.entry(id).or_default();
        let ema = r
            .ema
            .map_or(rate, |e| (1.0 - EMA_WEIGHT) * e + EMA_WEIGHT * rate);
        if ema < self.config.min_acceptance {
            r.paused_until = self.step + self.config.pause_steps;
            r.ema = None;
        } else {
            r.ema = Some(ema);
        }
    }

    /// Forgets a finished request.
    pub fn forget(&mut self, id: SeqId) {
        self.requests.remove(&id);
        self.proposer.release(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::NgramProposer;

    #[test]
    fn low_acceptance_pauses_a_request_then_it_retries() {
        let config = SpeculativeConfig {
            pause_steps: 3,
            ..SpeculativeConfig::default()
        };
        let mut s = Speculation::new(config, Box::new(NgramProposer::default())).expect("ok");
        let id = SeqId(1);
        assert!(s.begin_step(1));
        assert_eq!(s.wanted(id, 10), 4);
        s.record(id, 4, 4);
        assert_eq!(s.wanted(id, 2), 2, "never more than the room");
        for _ in 0..5 {
            s.record(id, 4, 0); // EMA 0.7, 0.49, 0.34, 0.24, 0.17: still above 0.15
        }
        assert_eq!(s.wanted(id, 10), 4);
        s.record(id, 4, 0); // 0.12
        assert_eq!(s.wanted(id, 10), 0, "paused");
        for _ in 0..3 {
            s.begin_step(1);
        }
        assert_eq!(s.wanted(id, 10), 4, "tries again");
        assert_eq!(s.stats().num_drafts, 7);
        assert_eq!(s.stats().num_accepted_tokens, 4);
        assert_eq!(s.stats().accepted_per_position, vec![1, 1, 1, 1]);
        assert!(!s.begin_step(9), "too many running sequences");
        s.set_num_tokens(id, 0);
        assert_eq!(s.wanted(id, 10), 0);
    }
}
