//! Beam search requests inside the engine ([`Engine::add_beam_request`]).
//!
//! A beam request is a tree of *managed* sequences in the scheduler: the root computes the
//! prompt; every live beam's logits row gives its `2 * width` best next tokens; once every
//! live beam of the request has them, [`crate::beam_search::BeamSearch::step`] picks the
//! next beams, each a fork of its parent with one more token (sharing the parent's blocks by
//! refcount; the first write into a shared partial block copies it), and the old beams are
//! released. Beams are computed and batched like any other sequence; a beam whose logits are
//! out waits (parked) until its siblings' are, so preemption or a short token budget delays
//! the search but never changes it.
//!
//! A constrained beam request (a grammar in its sampling parameters) keeps one grammar state
//! per beam: a beam's candidates come from the log-softmax of its logits over the tokens its
//! grammar allows (stop tokens only where the grammar accepts), and a fork advances a copy
//! of its parent's state by the chosen token. A beam that ends on a stop token therefore
//! holds a complete match.
//!
//! A beam request emits no `Token` events: when the search ends it emits one
//! `EngineEvent::Finished { seq_id: root, reason }` (`Length` when beams reached
//! `max_tokens`, else `Stop`, or an `Error`), and [`Engine::take_beam_result`] then returns
//! its hypotheses, best first.

use tandem_model::logits::Logits;
use tandem_model::scoring::top_logprobs_of_row;

use super::{Engine, EngineEvent, GenerationRequest};
use crate::beam_search::{top_k_logprobs, BeamHypothesis, BeamParams, BeamSearch, LiveBeam};
use crate::error::{EngineError, Result};
use crate::sampler::constraint::ConstraintState;
use crate::sequence::{FinishReason, SeqId, SeqMap};

/// One live beam: its sequence, cumulative logprob and, once computed, its candidates.
#[derive(Debug)]
struct Beam {
    seq: SeqId,
    cum_logprob: f32,
    /// `[<= 2 * width]` best next tokens and their logprobs, once its logits are out.
    candidates: Option<Vec<(tandem_model::batch::TokenId, f32)>>,
    /// Its position in the request's grammar, if constrained.
    constraint: Option<ConstraintState>,
}

/// A beam request in flight.
#[derive(Debug)]
pub(super) struct BeamGroup {
    search: BeamSearch,
    live: Vec<Beam>,
    /// Set when a beam's step failed: how the request ends.
    failed: Option<FinishReason>,
}

/// The engine's beam requests: groups by root id, and the root of every live beam.
#[derive(Debug, Default)]
pub(super) struct Beams {
    groups: std::collections::BTreeMap<SeqId, BeamGroup>,
    root_of: SeqMap<SeqId>,
    results: SeqMap<Vec<BeamHypothesis>>,
}

impl Beams {
    /// Whether `seq` is a live beam of some beam request.
    pub(super) fn contains(&self, seq: SeqId) -> bool {
        self.root_of.contains_key(&seq)
    }

    /// Whether no beam request is live.
    pub(super) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

impl Engine {
    /// Validates and queues a beam search over `req.prompt` (its `sampling` is ignored; its
    /// `limits` give `max_tokens`, `ignore_eos` and `stop_token_ids`). Returns the request's
    /// id: it gets no `Token` events, one `Finished` event at the end, then its hypotheses
    /// from [`Engine::take_beam_result`]. Nothing is started when it is refused.
    pub fn add_beam_request(&mut self, req: GenerationRequest, beam: BeamParams) -> Result<SeqId> {
        beam.validate()?;
        if req.prompt_logprobs.is_some() {
            return Err(EngineError::InvalidParams(
                "prompt logprobs are not supported with beam search".into(),
            ));
        }
        self.check_prompt(&req)?;
        let config = self.scheduler.config();
        let room = config.max_seq_len().saturating_sub(req.prompt.len());
        let max_len = req.limits.max_tokens.min(room);
        let mut stop = req.limits.stop_token_ids.clone();
        if !req.limits.ignore_eos {
            stop.extend_from_slice(&config.eos_token_ids);
        }
        let root = self
            .scheduler
            .add_managed(req.prompt, req.limits, beam.width)?;
        let live = vec![Beam {
            seq: root,
            cum_logprob: 0.0,
            candidates: None,
            constraint: req.sampling.constraint.as_ref().map(|c| c.start()),
        }];
        let search = BeamSearch::new(beam, max_len, stop);
        let group = BeamGroup {
            search,
            live,
            failed: None,
        };
        self.beams.groups.insert(root, group);
        self.beams.root_of.insert(root, root);
        Ok(root)
    }

    /// The hypotheses of a finished beam request, best first (once; `None` before it
    /// finished, after an error, or when already taken).
    pub fn take_beam_result(&mut self, id: SeqId) -> Option<Vec<BeamHypothesis>> {
        self.beams.results.remove(&id)
    }

    /// If `seq` is a beam, records its candidates from logits row `row` (or the failure of a
    /// non-finite row) and returns true.
    pub(super) fn record_beam(&mut self, seq: SeqId, logits: &Logits, row: usize) -> bool {
        let Some(root) = self.beams.root_of.get(&seq) else {
            return false;
        };
        let group = self
            .beams
            .groups
            .get_mut(root)
            .expect("every live beam has a group");
        let k = 2 * group.search.params().width;
        let stop: Vec<u32> = group.search.stop_tokens().iter().map(|t| t.0).collect();
        let beam = group.live.iter_mut().find(|b| b.seq == seq);
        let beam = beam.expect("a live beam is in its group's live list");
        // The `k` most likely tokens: read off the raw row in one pass without a grammar,
        // else from the log-softmax over the tokens the grammar allows.
        let candidates = match beam.constraint.as_mut() {
            None => top_logprobs_of_row(logits.row(row), k).ok_or_else(non_finite),
            Some(c) => {
                constrained_log_probs(logits.row(row), c, &stop).map(|lp| top_k_logprobs(&lp, k))
            }
        };
        match candidates {
            Ok(mut candidates) => {
                candidates.retain(|(_, l)| l.is_finite()); // tokens the grammar forbids
                beam.candidates = Some(candidates);
            }
            Err(m) => group.failed = Some(m),
        }
        true
    }

    /// If `seq` is a beam, marks its request failed with `reason` and returns true.
    pub(super) fn fail_beam(&mut self, seq: SeqId, reason: &FinishReason) -> bool {
        let Some(root) = self.beams.root_of.get(&seq) else {
            return false;
        };
        let group = self.beams.groups.get_mut(root).expect("beam has a group");
        group.failed = Some(match reason {
            FinishReason::Error(_) | FinishReason::Refused(_) => reason.clone(),
            other => FinishReason::Error(format!("{other:?}")),
        });
        true
    }

    /// Steps every beam request whose live beams all have candidates, and ends failed ones;
    /// returns the `Finished` events of the requests that ended.
    pub(super) fn advance_beams(&mut self) -> Result<Vec<EngineEvent>> {
        let mut events = Vec::new();
        let roots: Vec<SeqId> = self.beams.groups.keys().copied().collect();
        for root in roots {
            let group = &self.beams.groups[&root];
            let reason = if let Some(failed) = &group.failed {
                Some(failed.clone())
            } else if group.live.iter().all(|b| b.candidates.is_some()) {
                self.select_beams(root)?
            } else {
                None
            };
            if let Some(reason) = reason {
                self.end_beam_request(root, reason.is_failure());
                events.push(EngineEvent::Finished {
                    seq_id: root,
                    reason,
                });
            }
        }
        Ok(events)
    }

    /// One search step of `root`: forks the chosen beams, releases the old ones. Returns
    /// why the search ended, if it did.
    fn select_beams(&mut self, root: SeqId) -> Result<Option<FinishReason>> {
        let group = self.beams.groups.get_mut(&root).expect("live group");
        let live: Vec<LiveBeam<'_>> = group
            .live
            .iter()
            .map(|b| LiveBeam {
                tokens: self
                    .scheduler
                    .sequence(b.seq)
                    .expect("a live beam is a live sequence")
                    .output(),
                cum_logprob: b.cum_logprob,
                candidates: b.candidates.as_deref().expect("checked by the caller"),
            })
            .collect();
        let Some(next) = group.search.step(&live) else {
            return Ok(Some(if group.search.reached_max_len() {
                FinishReason::Length
            } else {
                FinishReason::Stop
            }));
        };
        let mut new_live = Vec::with_capacity(next.len());
        for n in next {
            let parent = &group.live[n.parent];
            let seq = self.scheduler.fork_managed(parent.seq, n.token)?;
            self.beams.root_of.insert(seq, root);
            let mut constraint = parent.constraint.clone();
            if let Some(c) = constraint.as_mut() {
                c.commit(n.token.0); // a live beam's token is never a stop token
            }
            new_live.push(Beam {
                seq,
                cum_logprob: n.cum_logprob,
                candidates: None,
                constraint,
            });
        }
        for old in std::mem::replace(&mut group.live, new_live) {
            self.beams.root_of.remove(&old.seq);
            self.scheduler.finish_early(old.seq, FinishReason::Abort)?;
        }
        Ok(None)
    }

    /// Releases every live beam of `root` and keeps its hypotheses unless it `failed`.
    pub(super) fn end_beam_request(&mut self, root: SeqId, failed: bool) {
        let Some(group) = self.beams.groups.remove(&root) else {
            return;
        };
        for b in &group.live {
            self.beams.root_of.remove(&b.seq);
            // A beam ended by a failed step is already gone from the scheduler.
            let _gone = self.scheduler.finish_early(b.seq, FinishReason::Abort);
        }
        if !failed {
            self.beams
                .results
                .insert(root, group.search.into_hypotheses());
        }
    }

    /// Whether `id` is a beam request in flight.
    pub(super) fn is_beam_request(&self, id: SeqId) -> bool {
        self.beams.groups.contains_key(&id)
    }
}

/// The log-softmax of a logits `row` over the tokens `constraint` allows (`stop` tokens only
/// where it accepts); forbidden tokens get `-inf`. Errors: a non-finite row, the grammar's
/// error, or a dead end.
fn constrained_log_probs(
    row: &[f32],
    constraint: &mut ConstraintState,
    stop: &[u32],
) -> std::result::Result<Vec<f32>, FinishReason> {
    if row.iter().any(|v| !v.is_finite()) {
        return Err(non_finite());
    }
    let mut values: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
    // The grammar's dead end: the request's fault.
    constraint
        .apply(&mut values, stop)
        .map_err(FinishReason::Refused)?;
    let allowed: Vec<usize> = (0..values.len())
        .filter(|&i| values[i] > f64::NEG_INFINITY)
        .collect();
    let kept: Vec<f32> = allowed.iter().map(|&i| row[i]).collect();
    let mut kept_lp = vec![0.0; kept.len()];
    tandem_kernels::ops::log_softmax(&kept, &mut kept_lp).ok_or_else(non_finite)?;
    let mut out = vec![f32::NEG_INFINITY; row.len()];
    for (&i, &lp) in allowed.iter().zip(&kept_lp) {
        out[i] = lp;
    }
    Ok(out)
}

/// How a beam request whose row holds NaN or infinity ends: the model's fault.
fn non_finite() -> FinishReason {
    FinishReason::Error("the logits hold NaN or infinity".into())
}
