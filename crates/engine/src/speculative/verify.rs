//! The rejection sampler: judges a sequence's drafts against the target's logits so that the
//! emitted tokens follow exactly the distribution plain decoding draws from.
//!
//! At position `i` (history = output + the drafts before `i`), `p` is the processed target
//! distribution ([`processed_distribution`]: bias, min_tokens, penalties, temperature,
//! top-k/top-p/min-p; one-hot on the argmax when greedy) and `q` the distribution the draft
//! was drawn from (one-hot when the proposer is certain). The draft `d` is accepted with
//! probability `min(1, p(d) / q(d))` (one uniform `u` from the request's stream: accept iff
//! `u * q(d) < p(d)`); on rejection one token is drawn from the normalised `max(p - q, 0)`
//! and verification ends. If every draft is accepted, a bonus token is drawn by
//! [`sample`] at the position after them. Greedy requests thus accept exactly while the draft
//! equals the argmax, and emit the argmax otherwise. Each emitted token reports the raw
//! logprobs of its own row, as plain decoding would.

use crate::sampler::{
    processed_argmax, processed_distribution, reported_token, sample, SampledToken, SamplerError,
    SamplerState, SamplingParams, TokenDistribution,
};

/// One sequence's drafts and the target rows that judge them.
#[derive(Debug, Clone, Copy)]
pub struct DraftRows<'a> {
    /// `[k + 1]` target logits rows (`[vocab_size]` each): row `i` predicts the token after
    /// the sequence's committed tokens and `drafts[..i]`.
    pub rows: &'a [&'a [f32]],
    /// `[k]` draft tokens.
    pub drafts: &'a [u32],
    /// `[k]` the distributions the drafts were drawn from; `None`: each draft is certain.
    pub dists: Option<&'a [TokenDistribution]>,
}

/// Where verification must stop early: after `max_new` emitted tokens, or after a token for
/// which `is_stop` holds (the scheduler applies the same stop rules; cutting here only saves
/// work and random draws).
pub struct Limits<'a> {
    /// Most tokens to emit (>= 1).
    pub max_new: usize,
    /// Whether emitting this token ends the request.
    pub is_stop: &'a dyn Fn(u32) -> bool,
}

/// Judges `d.drafts` and returns the tokens to emit: the accepted drafts, then (unless a stop
/// cut the run) one correction or bonus token, each with the raw logprobs of its row.
/// `num_output_tokens` is the request's output length before these tokens. `state` is used
/// for its history (extended by the accepted drafts while judging, then restored) and its
/// random stream.
///
/// Errors as [`sample`]: a non-finite row, ids outside the row, no candidate.
pub fn verify(
    d: DraftRows<'_>,
    params: &SamplingParams,
    state: &mut SamplerState,
    num_output_tokens: usize,
    limits: &Limits<'_>,
) -> Result<Vec<SampledToken>, SamplerError> {
    assert_eq!(
        d.rows.len(),
        d.drafts.len() + 1,
        "one row per draft plus one"
    );
    assert!(
        d.dists.is_none_or(|q| q.len() == d.drafts.len()),
        "one draft distribution per draft"
    );
    let mut out = Vec::with_capacity(d.rows.len());
    let mut recorded = Vec::with_capacity(d.drafts.len());
    let result = judge(
        d,
        params,
        state,
        num_output_tokens,
        limits,
        &mut out,
        &mut recorded,
    );
    // The accepted drafts were recorded in the history (and the grammar) while judging; the
    // engine records the emitted tokens itself once the scheduler has applied them.
    for &t in &recorded {
        state.retract_output(t);
    }
    state.rollback_constraint(recorded.len());
    result.map(|()| out)
}

impl std::fmt::Debug for Limits<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limits")
            .field("max_new", &self.max_new)
            .finish_non_exhaustive()
    }
}

/// The loop of [`verify`]: pushes the emitted tokens to `out` and the drafts it appended to
/// the state's history to `recorded`.
fn judge(
    d: DraftRows<'_>,
    params: &SamplingParams,
    state: &mut SamplerState,
    num_output_tokens: usize,
    limits: &Limits<'_>,
    out: &mut Vec<SampledToken>,
    recorded: &mut Vec<u32>,
) -> Result<(), SamplerError> {
    let k = d.drafts.len();
    for (i, &row) in d.rows.iter().enumerate() {
        let num_output = num_output_tokens + i;
        if i == k {
            out.push(sample(row, params, state, num_output)?);
            return Ok(());
        }
        let draft = d.drafts[i];
        let replacement = if params.is_greedy() {
            Some(processed_argmax(row, params, state, num_output)?).filter(|&t| t != draft)
        } else {
            judge_sampled(
                row,
                draft,
                d.dists.map(|q| &q[i]),
                params,
                state,
                num_output,
            )?
        };
        if let Some(token) = replacement {
            out.push(reported_token(row, token, params)?);
            return Ok(());
        }
        out.push(reported_token(row, draft, params)?);
        if out.len() >= limits.max_new || (limits.is_stop)(draft) {
            return Ok(());
        }
        state.append_output(draft);
        state.advance_constraint(draft, false); // a stop token returned above
        recorded.push(draft);
    }
    Ok(())
}

/// One sampled position: `None` when `draft` is accepted (probability `min(1, p/q)`), else
/// the token drawn from the residual `max(p - q, 0)`. `q` is `None` for a certain draft.
fn judge_sampled(
    row: &[f32],
    draft: u32,
    q: Option<&TokenDistribution>,
    params: &SamplingParams,
    state: &mut SamplerState,
    num_output: usize,
) -> Result<Option<u32>, SamplerError> {
    let p = processed_distribution(row, params, state, num_output)?;
    let q_draft = q.map_or(1.0, |q| q.prob(draft));
    let u = state.draw_uniform();
    if u * q_draft < p.prob(draft) {
        return Ok(None);
    }
    let residual = match q {
        Some(q) => p.residual(q),
        None => p.residual(&TokenDistribution::one_hot(p.len(), draft)),
    };
    // A rejection leaves mass in the residual; rounding aside, `p` is the fallback.
    let u = state.draw_uniform();
    residual
        .unwrap_or(p)
        .draw(u)
        .map(Some)
        .ok_or(SamplerError::NoCandidates)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEVER: &dyn Fn(u32) -> bool = &|_| false;

    fn greedy_verify(
        rows: &[&[f32]],
        drafts: &[u32],
        params: &SamplingParams,
        state: &mut SamplerState,
        limits: &Limits<'_>,
    ) -> Vec<u32> {
        let d = DraftRows {
            rows,
            drafts,
            dists: None,
        };
        verify(d, params, state, 0, limits)
            .expect("finite rows")
            .iter()
            .map(|t| t.token)
            .collect()
    }

    #[test]
    fn all_accepted_drafts_get_a_bonus_token() {
        let row: &[f32] = &[0.0, 3.0, 1.0];
        let rows = [row, row, row];
        let limits = Limits {
            max_new: 10,
            is_stop: NEVER,
        };
        let mut state = SamplerState::new(0, &[]);
        let out = greedy_verify(
            &rows,
            &[1, 1],
            &SamplingParams::greedy(),
            &mut state,
            &limits,
        );
        assert_eq!(out, vec![1, 1, 1]);
        assert_eq!(state.output_count(1), 0, "the history is restored");
    }

    #[test]
    fn stop_tokens_and_max_new_cut_an_accepted_run() {
        let row: &[f32] = &[0.0, 3.0, 1.0];
        let rows = [row, row, row, row];
        let mut state = SamplerState::new(0, &[]);
        let stop_on_1: &dyn Fn(u32) -> bool = &|t| t == 1;
        let limits = Limits {
            max_new: 10,
            is_stop: stop_on_1,
        };
        let greedy = SamplingParams::greedy();
        assert_eq!(
            greedy_verify(&rows, &[1, 1, 1], &greedy, &mut state, &limits),
            vec![1]
        );
        let limits = Limits {
            max_new: 2,
            is_stop: NEVER,
        };
        assert_eq!(
            greedy_verify(&rows, &[1, 1, 1], &greedy, &mut state, &limits),
            vec![1, 1]
        );
    }

    #[test]
    fn penalties_see_the_preceding_drafts() {
        // Token 1 leads token 2 by 0.5; once token 1 is in the history, a frequency penalty
        // of 1 puts token 2 ahead, so the second draft (1 again) is rejected for 2.
        let row: &[f32] = &[0.0, 3.0, 2.5];
        let rows = [row, row, row];
        let params = SamplingParams {
            frequency_penalty: 1.0,
            ..SamplingParams::greedy()
        };
        let limits = Limits {
            max_new: 10,
            is_stop: NEVER,
        };
        let mut state = SamplerState::new(0, &[]);
        assert_eq!(
            greedy_verify(&rows, &[1, 1], &params, &mut state, &limits),
            vec![1, 2]
        );
        assert_eq!(state.output_count(1), 0, "the history is restored");
    }
}
