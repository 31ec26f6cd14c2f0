//! Prompt log-probabilities: the teacher-forced score of every prompt token, computed by the same
//! forward passes that prefill the prompt (ARCHITECTURE.md § The forward pass: their prompt rows
//! are added to the batch's output selection).
//!
//! A request with [`GenerationRequest::prompt_logprobs`] `= Some(k)` gets, for every prompt
//! position `i >= 1`, `log p(prompt[i] | prompt[..i])` from the logits row of position
//! `i - 1`, the token's rank in the full distribution (1 = most likely) and the `k` most
//! likely alternatives. The numbers come from [`tandem_model::scoring::score_row`], the one
//! implementation `tandem score` uses, so they are bitwise equal to
//! [`tandem_model::scoring::score_tokens`] on the same tokens (the forward pass is invariant
//! to batching and chunking).
//!
//! How it runs, each step:
//! 1. [`PromptLogprobs::plan_rows`]: for every scheduled sequence with pending prompt
//!    positions, the rows of its chunk whose position predicts a prompt token not yet
//!    emitted (`next..prompt_len`); [`widen_output`] adds them to the batch's output rows.
//! 2. [`PromptLogprobs::extract`]: scores those rows into [`EngineEvent::PromptLogprobs`]
//!    events and hands the sampler a [`Logits`] holding only the rows the plan itself asked
//!    for, exactly as without prompt logprobs.
//!
//! Events: one `PromptLogprobs` per step in which a chunk of the prompt is computed, before
//! that request's `Token`/`Finished` events of the same step; `start` is the prompt index of
//! `entries[0]` and is always >= 1 (position 0 has no logprob: nothing predicts it). The
//! chunks of one request are contiguous and in order, and every index `1..prompt_len` (from
//! [`GenerationRequest::prompt_logprobs_start`] on, when that is larger) is emitted exactly once: a preempted request recomputes its prompt without emitting again. A
//! one-token prompt emits nothing. The members of an `n > 1` group share the prompt: each
//! gets the same events (computed once).
//!
//! Prefix-cache hits: positions whose K/V were reused from the cache are not computed by
//! this request's forward passes, but their final hidden states are in the KV store beside
//! their K/V, so [`PromptLogprobs::score_cached`] gets their logits from the LM head alone
//! ([`ModelRunner::cached_logits`], bitwise equal to the forward's rows) in the step that admits
//! the request, before the rows of its first computed chunk. The events are the same as
//! without the cache; the cost of those positions drops to one LM-head row each.

use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_kernels::thread_pool::ThreadPool;
use tandem_model::batch::{ForwardBatch, OutputSelection, TokenId};
use tandem_model::logits::Logits;
use tandem_model::runner::ModelRunner;
use tandem_model::scoring::score_row;

use super::{EngineEvent, GenerationRequest};
use crate::error::{EngineError, Result};
use crate::sampler::MAX_TOP_LOGPROBS;
use crate::scheduler::Scheduler;
use crate::sequence::{SeqId, SeqMap};
use crate::step_plan::StepPlan;
use crate::FinishReason;

/// The score of one prompt token.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptTokenLogprob {
    /// The prompt token.
    pub token: TokenId,
    /// `log p(token | prompt before it)` in nats, from the raw model distribution.
    pub logprob: f32,
    /// 1 + the number of vocabulary entries strictly more likely than `token`.
    pub rank: usize,
    /// The requested number of most likely tokens with their logprobs, most likely first
    /// (ties to the lower id).
    pub top: Vec<(TokenId, f32)>,
}

/// The refusals tied to prompt logprobs: more than [`MAX_TOP_LOGPROBS`] alternatives, and
/// `max_tokens == 0` without prompt logprobs (such a request would compute nothing useful).
pub(super) fn validate(req: &GenerationRequest) -> Result<()> {
    match req.prompt_logprobs {
        Some(k) if k > MAX_TOP_LOGPROBS => Err(EngineError::InvalidParams(format!(
            "prompt_logprobs must be at most {MAX_TOP_LOGPROBS}, got {k}"
        ))),
        None if req.limits.max_tokens == 0 => Err(EngineError::InvalidParams(
            "max_tokens must be at least 1 unless prompt logprobs are requested".into(),
        )),
        Some(_) if req.prompt_logprobs_start > req.prompt.len() => {
            Err(EngineError::InvalidParams(format!(
                "prompt_logprobs_start {} is beyond the prompt's {} tokens",
                req.prompt_logprobs_start,
                req.prompt.len()
            )))
        }
        _ => Ok(()),
    }
}

/// A request still owed prompt logprobs.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Alternatives per position.
    top_k: usize,
    /// The next prompt index to emit (starts at 1).
    next: usize,
}

/// The prompt rows one sequence gets this step.
#[derive(Debug, Clone)]
pub(super) struct PromptRows {
    seq_id: SeqId,
    /// The flat batch row of the position predicting prompt index `first`.
    first_row: usize,
    /// The first prompt index scored.
    first: usize,
    /// Number of consecutive rows (and prompt indices).
    len: usize,
}

/// The engine's requests owed prompt logprobs, by id.
#[derive(Debug, Default)]
pub(super) struct PromptLogprobs {
    pending: SeqMap<Pending>,
}

/// What [`PromptLogprobs::extract`] produced.
#[derive(Debug)]
pub(super) struct Extracted {
    /// The logits of the rows the plan itself asked for, in the plan's order.
    pub(super) sampling: Logits,
    /// One event per sequence that got prompt rows (and per pending sibling of its group).
    pub(super) events: Vec<EngineEvent>,
    /// Sequences whose prompt rows were not finite, with the reason.
    pub(super) failed: Vec<(SeqId, FinishReason)>,
}

impl PromptLogprobs {
    /// Registers a queued request that asked for `top_k` alternatives per prompt position,
    /// from prompt index `start` on.
    pub(super) fn register(&mut self, id: SeqId, top_k: usize, start: usize) {
        let next = start.max(1);
        self.pending.insert(id, Pending { top_k, next });
    }

    /// Whether no request is owed prompt logprobs.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Forgets requests that are no longer live (finished or aborted).
    pub(super) fn retain_live(&mut self, scheduler: &Scheduler) {
        self.pending
            .retain(|id, _| scheduler.sequence(*id).is_some());
    }

    /// Emits the prompt logprobs of positions the plan's sequences took from the prefix
    /// cache (below their `num_computed`, not yet emitted), from the final hidden states
    /// stored with their K/V. Call before [`PromptLogprobs::plan_rows`].
    pub(super) fn score_cached(
        &mut self,
        plan: &StepPlan,
        scheduler: &Scheduler,
        runner: &mut dyn ModelRunner,
    ) -> (Vec<EngineEvent>, Vec<(SeqId, FinishReason)>) {
        let mut events = Vec::new();
        let mut failed = Vec::new();
        if self.pending.is_empty() {
            return (events, failed);
        }
        for s in &plan.seqs {
            let (Some(p), Some(seq)) = (
                self.pending.get_mut(&s.seq_id),
                scheduler.sequence(s.seq_id),
            ) else {
                continue;
            };
            let lo = p.next - 1;
            let hi = s.num_computed.min(seq.prompt_len() - 1);
            if lo >= hi {
                continue;
            }
            let logits = match runner.cached_logits(&s.block_table, lo..hi) {
                Ok(logits) => logits,
                Err(e) => {
                    failed.push((s.seq_id, failure(&e)));
                    continue;
                }
            };
            let r = PromptRows {
                seq_id: s.seq_id,
                first_row: 0,
                first: lo + 1,
                len: hi - lo,
            };
            let prompt = &seq.tokens()[..seq.prompt_len()];
            match score_rows(&logits, &r, prompt, p.top_k, runner.host_pool()) {
                Ok(entries) => {
                    p.next = r.first + r.len;
                    group_events(&mut events, scheduler, &r, entries);
                }
                Err(e) => failed.push((s.seq_id, failure(&e))),
            }
        }
        (events, failed)
    }

    /// The prompt rows of `plan` still to emit, in plan order.
    pub(super) fn plan_rows(&self, plan: &StepPlan, scheduler: &Scheduler) -> Vec<PromptRows> {
        if self.pending.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut flat = 0; // first flat row of the current sequence
        for s in &plan.seqs {
            let span_start = flat;
            flat += s.len();
            let (Some(p), Some(seq)) = (self.pending.get(&s.seq_id), scheduler.sequence(s.seq_id))
            else {
                continue;
            };
            // Row of position `pos` predicts prompt index `pos + 1`; positions computed now
            // are `num_computed..num_computed + len`.
            let lo = s.num_computed.max(p.next - 1);
            let hi = (s.num_computed + s.len()).min(seq.prompt_len() - 1);
            if lo < hi {
                out.push(PromptRows {
                    seq_id: s.seq_id,
                    first_row: span_start + lo - s.num_computed,
                    first: lo + 1,
                    len: hi - lo,
                });
            }
        }
        out
    }

    /// Scores the prompt rows out of `logits` (the forward's output over the widened
    /// selection) and advances each request's next index. `plan_rows` are the flat rows the
    /// plan itself selected (see [`crate::to_forward_batch`]).
    pub(super) fn extract(
        &mut self,
        logits: Logits,
        rows: &[PromptRows],
        plan_rows: &[usize],
        scheduler: &Scheduler,
        pool: Option<&ThreadPool>,
    ) -> Extracted {
        let mut events = Vec::with_capacity(rows.len());
        let mut failed = Vec::new();
        for r in rows {
            let (p, seq) = match (
                self.pending.get_mut(&r.seq_id),
                scheduler.sequence(r.seq_id),
            ) {
                (Some(p), Some(seq)) => (p, seq),
                _ => continue,
            };
            let prompt = &seq.tokens()[..seq.prompt_len()];
            let scored = score_rows(&logits, r, prompt, p.top_k, pool);
            match scored {
                Ok(entries) => {
                    p.next = r.first + r.len;
                    group_events(&mut events, scheduler, r, entries);
                }
                Err(e) => failed.push((r.seq_id, failure(&e))),
            }
        }
        let sampling = if logits.rows() == plan_rows {
            logits
        } else {
            select_rows(&logits, plan_rows)
        };
        Extracted {
            sampling,
            events,
            failed,
        }
    }
}

/// One `PromptLogprobs` event for `r`'s sequence and one for each pending sibling of its
/// group (they share the prompt: each gets a copy).
fn group_events(
    events: &mut Vec<EngineEvent>,
    scheduler: &Scheduler,
    r: &PromptRows,
    entries: Vec<PromptTokenLogprob>,
) {
    let group = std::iter::once(&r.seq_id).chain(scheduler.pending_siblings(r.seq_id));
    events.extend(group.map(|&seq_id| EngineEvent::PromptLogprobs {
        seq_id,
        start: r.first,
        entries: entries.clone(),
    }));
}

/// The scores of the prompt tokens `r` predicts, from the forward's `logits`, the rows side
/// by side on `pool` when the runner lends one (each row's score is its own).
fn score_rows(
    logits: &Logits,
    r: &PromptRows,
    prompt: &[TokenId],
    top_k: usize,
    pool: Option<&ThreadPool>,
) -> tandem_model::Result<Vec<PromptTokenLogprob>> {
    let score = |j: usize| {
        let flat = r.first_row + j;
        let row = logits
            .rows()
            .binary_search(&flat)
            .expect("every prompt row has logits");
        let token = prompt[r.first + j];
        let s = score_row(logits, row, token, top_k, true)?;
        Ok(PromptTokenLogprob {
            token,
            logprob: s.logprob,
            rank: s.rank.expect("asked for the rank"),
            top: s.top,
        })
    };
    let mut scored: Vec<Option<tandem_model::Result<PromptTokenLogprob>>> =
        (0..r.len).map(|_| None).collect();
    match pool {
        Some(pool) if r.len > 1 => {
            for_each_chunk_mut(pool, &mut scored, 1, |j, s| s[0] = Some(score(j)))
        }
        _ => (0..r.len).for_each(|j| scored[j] = Some(score(j))),
    }
    scored
        .into_iter()
        .map(|s| {
            s.unwrap_or_else(|| {
                Err(tandem_model::ModelError::Batch(
                    "a prompt row was not scored".into(),
                ))
            })
        })
        .collect()
}

/// Adds the prompt rows to the batch's explicit output rows (kept increasing).
pub(super) fn widen_output(batch: &mut ForwardBatch, rows: &[PromptRows]) {
    if rows.is_empty() {
        return;
    }
    let mut all = batch.output_rows();
    for r in rows {
        all.extend(r.first_row..r.first_row + r.len);
    }
    all.sort_unstable();
    all.dedup();
    batch.output = OutputSelection::Rows(all);
}

/// The logits of flat rows `rows` (a subset of `logits.rows()`), in order.
fn select_rows(logits: &Logits, rows: &[usize]) -> Logits {
    let vocab = logits.vocab_size();
    let mut data = Vec::with_capacity(rows.len() * vocab);
    for &flat in rows {
        let i = logits
            .rows()
            .binary_search(&flat)
            .expect("the plan's rows are among the computed rows");
        data.extend_from_slice(logits.row(i));
    }
    Logits::new(rows.to_vec(), vocab, data)
}

/// How a sequence whose prompt logprobs could not be computed ends: the model's or the
/// engine's fault.
fn failure(e: &impl std::fmt::Display) -> FinishReason {
    FinishReason::Error(format!("prompt logprobs: {e}"))
}
