//! Applying a step's result: computed tokens, sampled tokens, stop conditions, events.

use tandem_model::batch::TokenId;

use super::{Grant, InFlight, Scheduler};
use crate::error::{EngineError, Result};
use crate::scheduler_config::SchedulerConfig;
use crate::sequence::{FinishReason, RequestParams, SeqId, SeqMap};
use crate::step_plan::{SeqEvent, StepResult};

impl Scheduler {
    /// Applies the runner's answer to the (oldest) plan in flight: advances
    /// `num_computed_tokens` by each grant, appends the sampled tokens, applies the stop
    /// conditions (in order: EOS unless `ignore_eos`, `stop_token_ids`, `max_tokens`, the
    /// longest sequence the engine holds) and releases finished sequences' blocks. Sequences
    /// that ended while the step was in flight (aborted, or finished by the step before it)
    /// are skipped. A group whose prompt completed is first forked into its siblings (each
    /// then gets its own token); managed sequences only advance. A result that does not
    /// answer the plan changes nothing.
    pub fn update(&mut self, result: &StepResult) -> Result<Vec<SeqEvent>> {
        let flight = self
            .in_flight
            .front()
            .ok_or_else(|| EngineError::ResultMismatch("no step is in flight".into()))?;
        let outputs = self.check_result(flight, result)?;
        let flight = self.in_flight.pop_front().expect("checked above");
        let mut events = Vec::new();
        for g in &flight.grants {
            let Some(seq) = self.seqs.get_mut(&g.seq_id) else {
                continue; // aborted while the step was in flight
            };
            seq.advance_computed(g.num_new);
            let prompt_only = seq.params().max_tokens == 0 && seq.num_uncomputed() == 0;
            // Before anything can finish it and release its blocks.
            self.register_blocks(g.seq_id);
            if prompt_only {
                // A prompt-only request (prompt logprobs): done once its prompt is computed.
                self.finish(g.seq_id, FinishReason::Length);
                events.push(SeqEvent::Finished {
                    seq_id: g.seq_id,
                    reason: FinishReason::Length,
                });
                continue;
            }
            let Some(tokens) = outputs.get(&g.seq_id) else {
                continue; // a prompt chunk, or a managed sequence
            };
            // Fork before the parent's token: it may finish on it and release its blocks.
            let siblings = self.spawn_siblings(g.seq_id);
            self.append_sampled(g.seq_id, tokens, &mut events);
            for s in siblings {
                let t = outputs
                    .get(&s)
                    .expect("checked: every pending sibling has an output");
                self.append_sampled(s, t, &mut events);
            }
        }
        Ok(events)
    }

    /// Ends every live sequence of the plans in flight with `FinishReason::Error` (the
    /// runner failed; a step planned ahead of the failed one fails with it) and releases
    /// their blocks.
    pub fn fail_step(&mut self, message: &str) -> Vec<SeqEvent> {
        let grants: Vec<Grant> = self.in_flight.drain(..).flat_map(|f| f.grants).collect();
        let mut events = Vec::new();
        for g in grants {
            if self.seqs.contains_key(&g.seq_id) {
                let mut ids = vec![g.seq_id];
                ids.extend_from_slice(self.pending_siblings(g.seq_id));
                let reason = FinishReason::Error(message.to_owned());
                self.finish(g.seq_id, reason.clone());
                events.extend(ids.into_iter().map(|seq_id| SeqEvent::Finished {
                    seq_id,
                    reason: reason.clone(),
                }));
            }
        }
        events
    }

    /// Checks that `result` answers `flight`: the same step, one output per live unmanaged
    /// sequence with output rows and per pending sibling forked from one, 1..=rows tokens
    /// each, accepted drafts equal to the drafts.
    fn check_result<'r>(
        &self,
        flight: &InFlight,
        result: &'r StepResult,
    ) -> Result<SeqMap<&'r [TokenId]>> {
        let bad = |m: String| Err(EngineError::ResultMismatch(m));
        if result.step != flight.step {
            return bad(format!(
                "result is for step {}, step {} is in flight",
                result.step, flight.step
            ));
        }
        // Who answers for each id: its own grant, or its parent's for a sibling.
        let mut grants: SeqMap<&Grant> = SeqMap::default();
        for g in &flight.grants {
            grants.insert(g.seq_id, g);
            grants.extend(g.siblings.iter().map(|&s| (s, g)));
        }
        let mut outputs = SeqMap::default();
        for o in &result.outputs {
            let managed = self.seqs.get(&o.seq_id).is_some_and(|s| s.is_managed());
            let Some(g) = grants
                .get(&o.seq_id)
                .filter(|g| g.num_output_rows > 0 && !managed)
            else {
                return bad(format!("{:?} asked for no logits this step", o.seq_id));
            };
            if o.tokens.is_empty() || o.tokens.len() > g.num_output_rows {
                return bad(format!(
                    "{:?} got {} tokens for {} output rows",
                    o.seq_id,
                    o.tokens.len(),
                    g.num_output_rows
                ));
            }
            if outputs.insert(o.seq_id, &o.tokens[..]).is_some() {
                return bad(format!("{:?} has two outputs", o.seq_id));
            }
        }
        for g in flight.grants.iter().filter(|g| g.num_output_rows > 0) {
            let Some(seq) = self.seqs.get(&g.seq_id).filter(|s| !s.is_managed()) else {
                outputs.remove(&g.seq_id);
                for s in &g.siblings {
                    outputs.remove(s);
                }
                continue;
            };
            for s in self.pending_siblings(g.seq_id) {
                if outputs.get(s).is_none_or(|t| t.len() != 1) {
                    return bad(format!("sibling {s:?} needs exactly one token"));
                }
            }
            let Some(tokens) = outputs.get(&g.seq_id) else {
                return bad(format!("{:?} has no output", g.seq_id));
            };
            let drafts = &seq.tokens()[seq.num_tokens() - seq.num_draft()..];
            let accepted = &tokens[..tokens.len() - 1];
            if !drafts.starts_with(accepted) {
                return bad(format!(
                    "{:?}: accepted tokens differ from drafts",
                    g.seq_id
                ));
            }
        }
        Ok(outputs)
    }

    /// Commits accepted drafts and the sampled token, emitting events and stopping at the
    /// first stop condition (tokens after it are dropped).
    fn append_sampled(&mut self, id: SeqId, tokens: &[TokenId], events: &mut Vec<SeqEvent>) {
        let seq = self.seq_mut(id);
        let accepted = tokens.len() - 1;
        seq.commit_drafts(accepted);
        seq.append_output(tokens[accepted]);
        let end = seq.num_tokens();
        let first_new = end - tokens.len();
        for len in first_new + 1..=end {
            let seq = &self.seqs[&id];
            let token = seq.tokens()[len - 1];
            events.push(SeqEvent::Token { seq_id: id, token });
            let output_len = len - seq.prompt_len();
            if let Some(reason) = stop_reason(&self.config, seq.params(), token, output_len, len) {
                self.seq_mut(id).rollback_to(len);
                self.finish(id, reason.clone());
                events.push(SeqEvent::Finished { seq_id: id, reason });
                return;
            }
        }
    }
}

/// Why a sequence whose last token is `token` (with `output_len` output tokens and
/// `num_tokens` tokens in all) stops, if it does.
fn stop_reason(
    config: &SchedulerConfig,
    params: &RequestParams,
    token: TokenId,
    output_len: usize,
    num_tokens: usize,
) -> Option<FinishReason> {
    if !params.ignore_eos && config.eos_token_ids.contains(&token) {
        return Some(FinishReason::Stop);
    }
    if params.stop_token_ids.contains(&token) {
        return Some(FinishReason::Stop);
    }
    if output_len >= params.max_tokens || num_tokens >= config.max_seq_len() {
        return Some(FinishReason::Length);
    }
    None
}
