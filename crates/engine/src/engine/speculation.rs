//! The speculative half of [`Engine::step`] (see [`crate::speculative`]): before planning,
//! each decoding sequence may get drafts from the proposer (appended as uncommitted tokens,
//! which the scheduler grants and leases KV for like any other); after the forward pass, a
//! sequence with `1 + k` output rows is verified instead of sampled.

use std::ops::Range;

use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_model::batch::TokenId;
use tandem_model::logits::Logits;

use super::{ActiveRequest, Engine};
use crate::error::{EngineError, Result};
use crate::sampler::{SampledToken, SamplerError, TokenDistribution};
use crate::sequence::{SeqId, SeqMap};
use crate::speculative::verify::{verify, DraftRows, Limits};
use crate::speculative::{ProposalInput, Proposer, SpecStats, Speculation, SpeculativeConfig};
use crate::step_plan::{ScheduledSeq, StepPlan};

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

    /// Judges the drafts of every sequence of `plan` with more than one output row (not a
    /// beam) against its rows of `logits`, side by side on the runner's host pool where it
    /// lends one (each judgment depends only on the sequence's rows and its own request, so
    /// the tokens are those of a loop over the sequences), records the acceptances, and
    /// returns each sequence's emitted tokens or failure.
    pub(super) fn verify_plan(&mut self, plan: &StepPlan, logits: &Logits) -> SeqMap<Judged> {
        let mut judged = SeqMap::default();
        let mut jobs = Vec::new();
        let mut row = 0;
        for s in plan.seqs.iter().filter(|s| s.num_output_rows > 0) {
            row += s.num_output_rows;
            if s.num_output_rows == 1 || self.beams.contains(s.seq_id) {
                continue;
            }
            match self.verify_job(s, row - s.num_output_rows) {
                Some(job) => jobs.push(job),
                // Not reachable: every scheduled sequence has a request. Should it happen,
                // that sequence fails, not the engine.
                None => {
                    let no_state = SamplerError::invalid("sequence", "no sampler state");
                    judged.insert(s.seq_id, Err(no_state));
                }
            }
        }
        match self.runner.host_pool() {
            Some(pool) if jobs.len() > 1 => {
                for_each_chunk_mut(pool, &mut jobs, 1, |_, job| job[0].run(logits))
            }
            _ => jobs.iter_mut().for_each(|job| job.run(logits)),
        }
        for job in jobs {
            let tokens = job.judged.unwrap_or_else(|| Ok(Vec::new()));
            if let (Ok(tokens), Some(spec)) = (&tokens, self.spec.as_mut()) {
                let kept = tokens.iter().zip(&job.drafts);
                let accepted = kept.take_while(|(t, d)| t.token == **d).count();
                spec.record(job.id, job.drafts.len(), accepted);
            }
            self.requests.insert(job.id, job.req);
            judged.insert(job.id, tokens);
        }
        judged
    }

    /// The verification of `s`, whose `1 + k` rows start at `first_row`, with its request
    /// taken out of the engine; `None` when it has none.
    fn verify_job(&mut self, s: &ScheduledSeq, first_row: usize) -> Option<VerifyJob> {
        let id = s.seq_id;
        let seq = self.scheduler.sequence(id)?;
        let num_output = seq.output().len();
        let params = seq.params();
        let mut stops = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stops.extend_from_slice(&self.scheduler.config().eos_token_ids);
        }
        let max_new = params.max_tokens.saturating_sub(num_output).max(1);
        let drafts: Vec<u32> = s.tokens[s.len() + 1 - s.num_output_rows..]
            .iter()
            .map(|t| t.0)
            .collect();
        let req = self.requests.remove(&id)?;
        let spec = self.spec.as_mut().expect("only speculation appends drafts");
        let dists = spec.take_dists(id, drafts.len());
        Some(VerifyJob {
            id,
            rows: first_row..first_row + s.num_output_rows,
            drafts,
            dists,
            num_output,
            max_new,
            stops,
            req,
            judged: None,
        })
    }
}

/// What judging a sequence's drafts gave: the tokens to emit, or why it failed.
pub(super) type Judged = std::result::Result<Vec<SampledToken>, SamplerError>;

/// One sequence's verification, taken out of the engine to run beside the others'.
struct VerifyJob {
    id: SeqId,
    /// Its rows of the step's logits: `1 + k`.
    rows: Range<usize>,
    /// The `k` drafts.
    drafts: Vec<u32>,
    /// The distributions the drafts were drawn from; `None`: each was certain.
    dists: Option<Vec<TokenDistribution>>,
    /// Its output length before this step's tokens.
    num_output: usize,
    /// Most tokens it may still emit (at least 1).
    max_new: usize,
    /// Tokens that end it: its stop ids and, unless it ignores them, the model's EOS ids.
    stops: Vec<TokenId>,
    req: ActiveRequest,
    judged: Option<Judged>,
}

impl VerifyJob {
    /// Runs the rejection sampler over the job's rows of `logits`.
    fn run(&mut self, logits: &Logits) {
        let rows: Vec<&[f32]> = self.rows.clone().map(|r| logits.row(r)).collect();
        let stops = &self.stops;
        let is_stop = |t: u32| stops.contains(&TokenId(t));
        let limits = Limits {
            max_new: self.max_new,
            is_stop: &is_stop,
        };
        let d = DraftRows {
            rows: &rows,
            drafts: &self.drafts,
            dists: self.dists.as_deref(),
        };
        let req = &mut self.req;
        let judged = verify(d, &req.sampling, &mut req.state, self.num_output, &limits);
        self.judged = Some(judged);
    }
}
