//! The speculative half of [`Engine::step`] (see [`crate::speculative`]): before planning,
//! each decoding sequence may get drafts from the proposer (appended as uncommitted tokens,
//! which the scheduler grants and leases KV for like any other); after the forward pass, a
//! sequence with `1 + k` output rows is verified instead of sampled.

use std::collections::VecDeque;

use tandem_model::batch::TokenId;
use tandem_model::logits::Logits;

use super::sampling::StepSamples;
use super::Engine;
use crate::error::{EngineError, Result};
use crate::sampler::{SampledToken, SamplerError};
use crate::sequence::SeqId;
use crate::speculative::verify::{verify, DraftRows, Limits};
use crate::speculative::{ProposalInput, Proposer, SpecStats, Speculation, SpeculativeConfig};
use crate::step_plan::{ScheduledSeq, SeqOutput};

impl Engine {
    /// Turns speculative decoding on (or replaces it) with `proposer` under `config`.
    pub fn enable_speculation(
        &mut self,
        config: SpeculativeConfig,
        proposer: Box<dyn Proposer>,
    ) -> Result<()> {
        self.spec = Some(Speculation::new(config, proposer)?);
        Ok(())
    }

    /// The speculation state, when enabled.
    pub fn speculation(&self) -> Option<&Speculation> {
        self.spec.as_ref()
    }

    /// Speculative decoding counters (all zero when it is off).
    pub fn spec_stats(&self) -> SpecStats {
        self.spec
            .as_ref()
            .map(|s| s.stats().clone())
            .unwrap_or_default()
    }

    /// Sets a live request's own number of draft tokens per step (0 turns speculation off for
    /// it). Errors for an unknown request; does nothing while speculation is off.
    pub fn set_num_speculative_tokens(&mut self, id: SeqId, k: usize) -> Result<()> {
        if !self.requests.contains_key(&id) {
            return Err(EngineError::UnknownSeq(id));
        }
        if let Some(spec) = self.spec.as_mut() {
            spec.set_num_tokens(id, k);
        }
        Ok(())
    }

    /// Drops a finished request's speculation state.
    pub(super) fn forget_speculation(&mut self, id: SeqId) {
        if let Some(spec) = self.spec.as_mut() {
            spec.forget(id);
        }
    }

    /// Asks the proposer for drafts for every decoding sequence that wants them and appends
    /// them to the sequences. A proposer failure only skips speculation for this step.
    pub(super) fn propose_drafts(&mut self) -> Result<()> {
        let Some(spec) = self.spec.as_mut() else {
            return Ok(());
        };
        if !spec.begin_step(self.scheduler.num_running()) {
            return Ok(());
        }
        let mut inputs = Vec::new();
        for id in self.scheduler.draft_candidates() {
            let (Some(seq), Some(req)) = (self.scheduler.sequence(id), self.requests.get(&id))
            else {
                continue;
            };
            let num_output = seq.output().len();
            // The verification emits one token past the accepted drafts.
            let room = seq.params().max_tokens.saturating_sub(num_output + 1);
            let want = spec.wanted(id, room);
            if want > 0 {
                inputs.push(ProposalInput {
                    seq_id: id,
                    tokens: seq.tokens(),
                    num_output_tokens: num_output,
                    max_drafts: want,
                    sampling: &req.sampling,
                    seed: req.state.seed(),
                });
            }
        }
        if inputs.is_empty() {
            return Ok(());
        }
        let Ok(proposals) = spec.propose(&inputs) else {
            return Ok(());
        };
        let ids: Vec<SeqId> = inputs.iter().map(|i| i.seq_id).collect();
        for (id, p) in ids.into_iter().zip(proposals) {
            if !p.tokens.is_empty() {
                self.scheduler.add_drafts(id, &p.tokens)?;
                spec.hold(id, p.dists);
            }
        }
        Ok(())
    }

    /// Verifies the drafts of `s` against its `1 + k` rows starting at `first_row` and
    /// records the emitted tokens (or the failure) in `out`.
    pub(super) fn verify_drafts(
        &mut self,
        s: &ScheduledSeq,
        logits: &Logits,
        first_row: usize,
        num_output: usize,
        out: &mut StepSamples,
    ) {
        let id = s.seq_id;
        match self.judge(s, logits, first_row, num_output) {
            Ok(tokens) => {
                out.outputs.push(SeqOutput {
                    seq_id: id,
                    tokens: tokens.iter().map(|t| TokenId(t.token)).collect(),
                });
                out.sampled.insert(id, VecDeque::from(tokens));
            }
            Err(e) => out.failed.push((id, e.to_string())),
        }
    }

    /// Runs the rejection sampler for `s` and records the acceptance.
    fn judge(
        &mut self,
        s: &ScheduledSeq,
        logits: &Logits,
        first_row: usize,
        num_output: usize,
    ) -> std::result::Result<Vec<SampledToken>, SamplerError> {
        let id = s.seq_id;
        let rows: Vec<&[f32]> = (first_row..first_row + s.num_output_rows)
            .map(|r| logits.row(r))
            .collect();
        let drafts: Vec<u32> = s.tokens[s.len() + 1 - s.num_output_rows..]
            .iter()
            .map(|t| t.0)
            .collect();
        let spec = self.spec.as_mut().expect("only speculation appends drafts");
        let dists = spec.take_dists(id, drafts.len());
        let seq = self
            .scheduler
            .sequence(id)
            .expect("a scheduled sequence with output rows is live");
        let params = seq.params();
        let eos = &self.scheduler.config().eos_token_ids;
        let is_stop = |t: u32| {
            (!params.ignore_eos && eos.contains(&TokenId(t)))
                || params.stop_token_ids.contains(&TokenId(t))
        };
        let limits = Limits {
            max_new: params.max_tokens.saturating_sub(num_output).max(1),
            is_stop: &is_stop,
        };
        let req = self
            .requests
            .get_mut(&id)
            .expect("every scheduled sequence has a request");
        let d = DraftRows {
            rows: &rows,
            drafts: &drafts,
            dists: dists.as_deref(),
        };
        let tokens = verify(d, &req.sampling, &mut req.state, num_output, &limits)?;
        let accepted = tokens
            .iter()
            .zip(&drafts)
            .take_while(|(t, d)| t.token == **d)
            .count();
        spec.record(id, drafts.len(), accepted);
        Ok(tokens)
    }
}
