//! The sampling half of [`Engine::step`]: one token per logits row (per group member for a
//! group forking this step), and the translation of scheduler events into client events.

use std::collections::VecDeque;

use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_model::batch::{ForwardBatch, TokenId};
use tandem_model::logits::Logits;
use tandem_model::row_sampling::RowDraw;
use tandem_model::token_pick::TokenPick;
use tandem_model::ModelError;

use super::prompt_logprobs::PromptRows;
use super::{ActiveRequest, Engine, EngineEvent};
use crate::sampler::{sample, SampledToken, SamplerError};
use crate::sequence::{FinishReason, SeqId, SeqMap};
use crate::step_plan::{SeqEvent, SeqOutput, StepPlan};
use crate::trace::{Part, StepClock};

/// Processor lists kept for reuse between steps, at most.
const SPARE_LISTS: usize = 4096;

/// How a step's rows get their tokens (see [`Engine::row_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RowPath {
    /// The runner's greedy picks (`ModelRunner::forward_greedy`, or
    /// `forward_greedy_tokens` when no request of the step asked for logprobs).
    Greedy,
    /// The runner's draws, processors and reported logprobs included
    /// (`ModelRunner::forward_sample`).
    Device,
    /// The logits, sampled on the host.
    Host,
}

/// What sampling a step's logits produced.
#[derive(Debug, Default)]
pub(super) struct StepSamples {
    /// The tokens for the scheduler.
    pub(super) outputs: Vec<SeqOutput>,
    /// The chosen tokens with their logprobs, for the events, in order per sequence (more
    /// than one when speculative drafts were accepted).
    pub(super) sampled: SeqMap<VecDeque<SampledToken>>,
    /// Sequences whose row could not be sampled, with how they end.
    pub(super) failed: Vec<(SeqId, FinishReason)>,
}

/// One request's plain draw from a row of a step's logits (see
/// [`Engine::sample_plain_rows`]).
struct RowJob {
    id: SeqId,
    row: usize,
    num_output: usize,
    req: ActiveRequest,
    sampled: Option<Result<SampledToken, SamplerError>>,
}

impl RowJob {
    fn sample(&mut self, logits: &Logits) {
        let req = &mut self.req;
        let row = logits.row(self.row);
        self.sampled = Some(sample(row, &req.sampling, &mut req.state, self.num_output));
    }
}

/// A runner's picks as the sampler reports them: with their logprobs.
pub(super) fn reported(picks: Vec<Option<TokenPick>>) -> Vec<Option<SampledToken>> {
    let sampled = |p: TokenPick| SampledToken {
        token: p.token.0,
        logprob: Some(p.logprob),
        top_logprobs: p.top_logprobs.iter().map(|&(t, l)| (t.0, l)).collect(),
    };
    picks.into_iter().map(|p| p.map(sampled)).collect()
}

/// A token chosen without its logprob.
fn unreported(token: TokenId) -> SampledToken {
    SampledToken {
        token: token.0,
        logprob: None,
        top_logprobs: Vec::new(),
    }
}

impl Engine {
    /// The forward pass of a step whose rows need only their token: the runner picks them
    /// where the logits are (`path`: greedy, or drawn as `rows` say), one per row.
    pub(super) fn forward_picks(
        &mut self,
        plan: &StepPlan,
        batch: &ForwardBatch,
        path: RowPath,
        rows: Vec<RowDraw>,
        clock: &mut StepClock,
    ) -> Result<StepSamples, ModelError> {
        let picks = match path {
            RowPath::Greedy if !self.reports_logprobs(plan) => {
                let tokens = self.runner.forward_greedy_tokens(batch);
                tokens.map(|t| t.into_iter().map(|t| t.map(unreported)).collect())
            }
            RowPath::Greedy => self.runner.forward_greedy(batch).map(reported),
            _ => self.runner.forward_sample(batch, &rows).map(reported),
        };
        let samples = picks
            .and_then(|picks| {
                if picks.len() == rows.len() {
                    Ok(picks)
                } else {
                    Err(ModelError::Batch(format!(
                        "the runner chose {} tokens for {} rows",
                        picks.len(),
                        rows.len()
                    )))
                }
            })
            .map(|picks| {
                clock.mark(Part::Forward);
                self.picked_samples(plan, &rows, picks)
            });
        self.recycle_rows(rows);
        samples
    }

    /// The forward pass of a step sampled on the host: the logits of the plan's rows
    /// (`plan_rows`, the batch's own selection) and of `prompt_rows`, whose prompt logprobs
    /// become the events returned (a sequence whose rows are not finite fails, before those
    /// that fail to sample); then a token for every row of the plan.
    pub(super) fn forward_logits(
        &mut self,
        plan: &StepPlan,
        batch: &ForwardBatch,
        prompt_rows: &[PromptRows],
        plan_rows: &[usize],
        clock: &mut StepClock,
    ) -> Result<(StepSamples, Vec<EngineEvent>), ModelError> {
        let mut logits = self.runner.forward(batch)?;
        clock.mark(Part::Forward);
        let mut events = Vec::new();
        let mut failed = Vec::new();
        if !prompt_rows.is_empty() {
            let x = self.prompt_logprobs.extract(
                logits,
                prompt_rows,
                plan_rows,
                &self.scheduler,
                self.runner.host_pool(),
            );
            logits = x.sampling;
            events = x.events;
            failed = x.failed;
        }
        let mut samples = self.sample_plan(plan, &logits);
        self.runner.recycle_logits(logits);
        failed.append(&mut samples.failed);
        samples.failed = failed;
        Ok((samples, events))
    }

    /// Samples one token for every sequence of the plan that asked for logits, and for every
    /// pending sibling of a group whose prompt completed (from the same row, own stream).
    pub(super) fn sample_plan(&mut self, plan: &StepPlan, logits: &Logits) -> StepSamples {
        let mut out = StepSamples::default();
        let mut drawn = self.sample_plain_rows(plan, logits);
        let mut judged = self.verify_plan(plan, logits);
        let mut row = 0;
        for s in plan.seqs.iter().filter(|s| s.num_output_rows > 0) {
            row += s.num_output_rows;
            let last = row - 1;
            if self.record_beam(s.seq_id, logits, last) {
                continue;
            }
            if s.num_output_rows > 1 {
                match judged.remove(&s.seq_id) {
                    Some(Ok(tokens)) => {
                        out.outputs.push(SeqOutput {
                            seq_id: s.seq_id,
                            tokens: tokens.iter().map(|t| TokenId(t.token)).collect(),
                        });
                        out.sampled.insert(s.seq_id, VecDeque::from(tokens));
                    }
                    Some(Err(e)) => out.failed.push((s.seq_id, e.finish_reason())),
                    None => {}
                }
                continue;
            }
            let mut members = vec![s.seq_id];
            members.extend_from_slice(self.scheduler.pending_siblings(s.seq_id));
            for id in members {
                let Some(sampled) = drawn.remove(&id) else {
                    // Not reachable: every scheduled sequence and pending sibling has a
                    // request. Should it happen, that sequence fails, not the engine.
                    let reason = FinishReason::Error("the sequence has no sampler state".into());
                    out.failed.push((id, reason));
                    continue;
                };
                match sampled {
                    Ok(t) => {
                        out.outputs.push(SeqOutput {
                            seq_id: id,
                            tokens: vec![TokenId(t.token)],
                        });
                        out.sampled.insert(id, VecDeque::from([t]));
                    }
                    Err(e) => out.failed.push((id, e.finish_reason())),
                }
            }
        }
        out
    }

    /// The token of every sequence of `plan` with one output row that is not a beam, and of
    /// its pending siblings (from the same row, own streams): the rows [`Self::sample_plan`]
    /// samples plainly. They run side by side on the runner's host pool where it lends one
    /// (each request's draw depends only on its row and its own state, so the tokens are
    /// those of a loop over the rows).
    fn sample_plain_rows(
        &mut self,
        plan: &StepPlan,
        logits: &Logits,
    ) -> SeqMap<Result<SampledToken, SamplerError>> {
        // Each plain member's request, taken out of the map for the draw, with its logits
        // row and its outputs so far.
        let mut jobs = Vec::new();
        let mut row = 0;
        for s in plan.seqs.iter().filter(|s| s.num_output_rows > 0) {
            row += s.num_output_rows;
            if s.num_output_rows > 1 || self.beams.contains(s.seq_id) {
                continue;
            }
            let num_output = self.num_output(s.seq_id);
            let siblings = self.scheduler.pending_siblings(s.seq_id);
            for id in std::iter::once(s.seq_id).chain(siblings.iter().copied()) {
                if let Some(req) = self.requests.remove(&id) {
                    jobs.push(RowJob {
                        id,
                        row: row - 1,
                        num_output,
                        req,
                        sampled: None,
                    });
                }
            }
        }
        match self.runner.host_pool() {
            Some(pool) if jobs.len() > 1 => {
                for_each_chunk_mut(pool, &mut jobs, 1, |_, job| job[0].sample(logits))
            }
            _ => jobs.iter_mut().for_each(|job| job.sample(logits)),
        }
        let mut drawn = SeqMap::default();
        for job in jobs {
            self.requests.insert(job.id, job.req);
            if let Some(sampled) = job.sampled {
                drawn.insert(job.id, sampled);
            }
        }
        drawn
    }

    /// How the rows of `plan` get their tokens: from the runner when every row is one
    /// sequence's only row (no beam, no sibling fork, no drafts) without a grammar — greedy
    /// picks when all are greedy without processors or top logprobs (see
    /// [`crate::sampler::SamplingParams::is_unprocessed`]), else draws where the logits are
    /// when the runner makes them — otherwise by the sampler on the host from the logits.
    pub(super) fn row_path(&self, plan: &StepPlan) -> RowPath {
        let mut all_plain_greedy = true;
        for s in plan.seqs.iter().filter(|s| s.num_output_rows > 0) {
            let Some(req) = self.requests.get(&s.seq_id) else {
                return RowPath::Host;
            };
            let single = s.num_output_rows == 1
                && !self.beams.contains(s.seq_id)
                && self.scheduler.pending_siblings(s.seq_id).is_empty()
                && !req.state.is_constrained();
            if !single {
                return RowPath::Host;
            }
            let num_output = self.num_output(s.seq_id);
            all_plain_greedy &= req.sampling.is_greedy() && req.sampling.is_unprocessed(num_output);
        }
        if all_plain_greedy {
            RowPath::Greedy
        } else if self.runner.samples_rows() {
            RowPath::Device
        } else {
            RowPath::Host
        }
    }

    /// Whether a request with an output row in `plan` asked for logprobs.
    fn reports_logprobs(&self, plan: &StepPlan) -> bool {
        let rows = plan.seqs.iter().filter(|s| s.num_output_rows > 0);
        rows.filter_map(|s| self.requests.get(&s.seq_id))
            .any(|r| r.sampling.logprobs)
    }

    /// Tokens the sequence has generated so far.
    fn num_output(&self, id: SeqId) -> usize {
        self.scheduler.sequence(id).map_or(0, |q| q.output().len())
    }

    /// The one draw per row from each request's stream that `sample` would make, with the
    /// rest of what the runner needs to choose the token as `sample` would (for a plan
    /// [`Self::row_path`] gave to the runner).
    pub(super) fn draw_rows(&mut self, plan: &StepPlan) -> Vec<RowDraw> {
        let vocab = self.runner.config().vocab_size;
        let mut rows = Vec::new();
        for s in plan.seqs.iter().filter(|s| s.num_output_rows > 0) {
            // A carried token (a step planned ahead) is output the row comes after.
            let num_output = self.num_output(s.seq_id) + usize::from(s.carries_pick);
            let req = self
                .requests
                .get_mut(&s.seq_id)
                .expect("every scheduled sequence has a request");
            let u = req.state.draw_uniform();
            let buffer = self.spare_lists.pop().unwrap_or_default();
            rows.push(
                req.sampling
                    .row_draw_in(&req.state, num_output, u, vocab, buffer),
            );
        }
        rows
    }

    /// Keeps the processor lists of answered row draws for the next steps' draws (at most
    /// [`SPARE_LISTS`]).
    pub(super) fn recycle_rows(&mut self, rows: Vec<RowDraw>) {
        let room = SPARE_LISTS.saturating_sub(self.spare_lists.len());
        let lists = rows.into_iter().map(|r| r.processing.tokens);
        self.spare_lists
            .extend(lists.filter(|l| l.capacity() > 0).take(room));
    }

    /// The samples of a plan given to the runner, from its picks (one per output row, in
    /// order, drawn as `draws` from [`Self::draw_rows`] said; a logprob is kept for the
    /// requests that asked for it). A row without a pick had a NaN or an infinity, or, when
    /// its processors suppress the whole vocabulary (bias and penalties never make a
    /// `-inf`), no candidate.
    pub(super) fn picked_samples(
        &mut self,
        plan: &StepPlan,
        draws: &[RowDraw],
        picks: Vec<Option<SampledToken>>,
    ) -> StepSamples {
        let mut out = StepSamples::default();
        let vocab = self.runner.config().vocab_size;
        let rows = plan.seqs.iter().filter(|s| s.num_output_rows > 0);
        for ((s, pick), draw) in rows.zip(picks).zip(draws) {
            let Some(req) = self.requests.get(&s.seq_id) else {
                continue; // ended while its step was launched: the row is discarded
            };
            let all_suppressed = || {
                let suppressed = draw.processing.tokens.iter().filter(|t| t.suppressed);
                suppressed.count() == vocab
            };
            let pick = match req.sampling.validate_ids(vocab) {
                Err(e) => Err(e),
                Ok(()) if pick.is_none() && all_suppressed() => Err(SamplerError::NoCandidates),
                Ok(()) => pick.ok_or(SamplerError::NonFiniteLogits),
            };
            match pick {
                Ok(mut t) => {
                    out.outputs.push(SeqOutput {
                        seq_id: s.seq_id,
                        tokens: vec![TokenId(t.token)],
                    });
                    if !req.sampling.logprobs {
                        t.logprob = None;
                    }
                    out.sampled.insert(s.seq_id, VecDeque::from([t]));
                }
                Err(e) => out.failed.push((s.seq_id, e.finish_reason())),
            }
        }
        out
    }

    /// Ends the sequences whose row failed to sample (a group parent takes its pending
    /// siblings with it) and returns their `Finished` events.
    pub(super) fn end_failed(&mut self, failed: Vec<(SeqId, FinishReason)>) -> Vec<SeqEvent> {
        let mut events = Vec::new();
        for (id, reason) in failed {
            let mut ids = vec![id];
            ids.extend_from_slice(self.scheduler.pending_siblings(id));
            if self.scheduler.finish_early(id, reason.clone()).is_err() {
                continue; // already ended with its group's parent
            }
            events.extend(ids.into_iter().map(|seq_id| SeqEvent::Finished {
                seq_id,
                reason: reason.clone(),
            }));
        }
        events
    }

    /// Turns scheduler events into client events, updating penalty counts and dropping the
    /// state of finished requests. A beam's end (a failed step) fails its beam request
    /// instead (reported by `advance_beams`).
    pub(super) fn translate(
        &mut self,
        events: Vec<SeqEvent>,
        mut sampled: SeqMap<VecDeque<SampledToken>>,
    ) -> Vec<EngineEvent> {
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            match e {
                SeqEvent::Token { seq_id, token } => {
                    if let Some(r) = self.requests.get_mut(&seq_id) {
                        r.state.append_output(token.0);
                        let is_stop = r.sampling.is_stop_token(token.0);
                        r.state.advance_constraint(token.0, is_stop);
                    }
                    let (logprob, top_logprobs) =
                        match sampled.get_mut(&seq_id).and_then(VecDeque::pop_front) {
                            Some(s) => (
                                s.logprob,
                                s.top_logprobs
                                    .into_iter()
                                    .map(|(t, l)| (TokenId(t), l))
                                    .collect(),
                            ),
                            None => (None, Vec::new()),
                        };
                    out.push(EngineEvent::Token {
                        seq_id,
                        token,
                        logprob,
                        top_logprobs,
                    });
                }
                SeqEvent::Finished { seq_id, reason } => {
                    self.forget_speculation(seq_id);
                    if !self.fail_beam(seq_id, &reason) {
                        self.requests.remove(&seq_id);
                        out.push(EngineEvent::Finished { seq_id, reason });
                    }
                }
            }
        }
        out
    }
}
