//! When to speculate and what came of it: the configuration, the number of drafts per
//! request (chosen from its observed acceptance and the draft cost; a pause when none pays),
//! the drafts' distributions between proposal and verification, and the counters.

use super::{Proposal, ProposalInput, Proposer, MAX_SPECULATIVE_TOKENS};
use crate::error::{EngineError, Result};
use crate::sampler::TokenDistribution;
use crate::sequence::{SeqId, SeqMap};

/// How speculative decoding runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeConfig {
    /// Most draft tokens proposed per sequence and step (`k`),
    /// 1..=[`MAX_SPECULATIVE_TOKENS`].
    pub num_tokens: usize,
    /// Speculate only while at most this many sequences are running: past it the extra rows
    /// cost more than the steps they save.
    pub max_batch_size: usize,
    /// What a step with drafts costs beyond a plain decode step, as fractions of a plain
    /// decode step: `verify_cost` once (the multi-token path) plus `draft_cost` per draft
    /// token (proposing it and verifying its row). Each request drafts the number of tokens
    /// that maximises its expected tokens per unit of cost under its observed acceptance,
    /// and none (for `pause_steps` steps) when no number pays. Both 0: always draft
    /// `num_tokens`.
    pub verify_cost: f64,
    /// See `verify_cost`.
    pub draft_cost: f64,
    /// Steps a request stops drafting when drafting does not pay, before it tries again.
    pub pause_steps: u64,
}

impl Default for SpeculativeConfig {
    /// k = 4, up to 8 running sequences, the costs of n-gram drafts as measured on the
    /// default model (0.2 + 0.2 per draft, in decode steps; BENCHMARKS.md § Figures behind
    /// choices in the code), pauses of 32 steps.
    fn default() -> SpeculativeConfig {
        SpeculativeConfig {
            num_tokens: 4,
            max_batch_size: 8,
            verify_cost: 0.2,
            draft_cost: 0.2,
            pause_steps: 32,
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
        for (name, c) in [("draft", self.draft_cost), ("verify", self.verify_cost)] {
            if !(c.is_finite() && c >= 0.0) {
                return Err(EngineError::InvalidConfig(format!(
                    "the {name} cost must be finite and >= 0, got {c}"
                )));
            }
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

/// Each verification scales the earlier evidence of a request's acceptance by this.
const DECAY: f64 = 0.8;
/// Prior evidence of a fresh request: 1.4 accepted of 2 judged drafts (rate 0.7).
const PRIOR: (f64, f64) = (1.4, 2.0);

/// One request's speculation state.
#[derive(Debug)]
struct RequestSpec {
    /// Per-request `k` (0 turns speculation off for it).
    k_override: Option<usize>,
    /// Decayed counts (accepted drafts, judged drafts): a draft is judged when it, or every
    /// draft before it, was accepted; the per-draft acceptance estimate is their ratio.
    evidence: (f64, f64),
    /// No proposals before this step.
    paused_until: u64,
    /// The distributions of the drafts in flight (`None`: certain drafts).
    dists: Option<Vec<TokenDistribution>>,
}

impl Default for RequestSpec {
    fn default() -> RequestSpec {
        RequestSpec {
            k_override: None,
            evidence: PRIOR,
            paused_until: 0,
            dists: None,
        }
    }
}

/// The number of drafts in `0..=k_max` that maximises expected emitted tokens per cost,
/// `(1 + a + ... + a^k) / (1 + fixed + per_draft * k)` (and 1 for `k = 0`), for per-draft
/// acceptance `a`.
pub fn best_num_drafts(a: f64, fixed: f64, per_draft: f64, k_max: usize) -> usize {
    let (mut best, mut best_rate) = (0, 1.0);
    let (mut tokens, mut power) = (1.0, 1.0);
    for k in 1..=k_max {
        power *= a;
        tokens += power;
        let rate = tokens / (1.0 + fixed + per_draft * k as f64);
        if rate > best_rate {
            (best, best_rate) = (k, rate);
        }
    }
    best
}

/// The engine's speculation: a proposer, its configuration, per-request state, counters.
#[derive(Debug)]
pub struct Speculation {
    config: SpeculativeConfig,
    proposer: Box<dyn Proposer>,
    stats: SpecStats,
    requests: SeqMap<RequestSpec>,
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
            requests: SeqMap::default(),
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
    /// When drafting does not pay at its observed acceptance, the request pauses.
    pub fn wanted(&mut self, id: SeqId, room: usize) -> usize {
        let step = self.step;
        let (fixed, cost) = (self.config.verify_cost, self.config.draft_cost);
        let pause = self.config.pause_steps;
        let r = self.requests.entry(id).or_default();
        if r.paused_until > step {
            return 0;
        }
        let k_max = r.k_override.unwrap_or(self.config.num_tokens);
        let k = if (fixed == 0.0 && cost == 0.0) || k_max == 0 {
            k_max
        } else {
            best_num_drafts(r.evidence.0 / r.evidence.1, fixed, cost, k_max)
        };
        if k == 0 && k_max > 0 {
            r.paused_until = step + pause;
            r.evidence = PRIOR;
        }
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

    /// Records a verification of `proposed` drafts of which the first `accepted` were kept.
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
        let judged = accepted + usize::from(accepted < proposed);
        let r = self.requests.entry(id).or_default();
        r.evidence = (
            DECAY * r.evidence.0 + accepted as f64,
            DECAY * r.evidence.1 + judged as f64,
        );
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
    fn the_number_of_drafts_follows_acceptance_and_cost() {
        assert_eq!(best_num_drafts(0.9, 0.2, 0.2, 8), 7);
        assert_eq!(best_num_drafts(0.7, 0.2, 0.2, 8), 3);
        assert_eq!(best_num_drafts(0.5, 0.2, 0.2, 8), 2);
        assert_eq!(best_num_drafts(0.3, 0.2, 0.2, 8), 0, "1.3 / 1.4 < 1");
        assert_eq!(best_num_drafts(1.0, 0.0, 0.0, 5), 5);
        assert_eq!(best_num_drafts(0.99, 0.2, 0.2, 3), 3, "capped");
    }

    #[test]
    fn low_acceptance_pauses_a_request_then_it_retries() {
        let config = SpeculativeConfig {
            pause_steps: 3,
            ..SpeculativeConfig::default()
        };
        let mut s = Speculation::new(config, Box::new(NgramProposer::default())).expect("ok");
        let id = SeqId(1);
        assert!(s.begin_step(1));
        assert_eq!(s.wanted(id, 10), 3, "the prior (0.7) asks for 3");
        for _ in 0..4 {
            s.record(id, 4, 4);
        }
        assert_eq!(s.wanted(id, 10), 4, "all accepted: the full k");
        assert_eq!(s.wanted(id, 2), 2, "never more than the room");
        for _ in 0..12 {
            s.record(id, 2, 0);
        }
        assert_eq!(s.wanted(id, 10), 0, "paused");
        s.begin_step(1);
        s.begin_step(1);
        assert_eq!(s.wanted(id, 10), 0, "still paused");
        s.begin_step(1);
        assert_eq!(s.wanted(id, 10), 3, "tries again from the prior");
        assert_eq!(s.stats().num_drafts, 16);
        assert_eq!(s.stats().num_accepted_tokens, 16);
        assert_eq!(s.stats().accepted_per_position, vec![4, 4, 4, 4]);
        assert!(!s.begin_step(9), "too many running sequences");
        s.set_num_tokens(id, 0);
        assert_eq!(s.wanted(id, 10), 0);
    }
}
