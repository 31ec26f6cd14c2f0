//! The logit processors that run before temperature, in this order:
//! logit_bias -> min_tokens stop-token suppression -> repetition penalty ->
//! presence and frequency penalties. A request's processors at one position are one sparse
//! list of adjusted tokens ([`LogitProcessing`], whose documentation gives the arithmetic:
//! f64, rounded once to f32), the list a runner drawing where its logits are applies too.

use std::collections::BTreeMap;

use tandem_model::logit_processing::{LogitProcessing, TokenAdjustment};

use super::history::{History, PenaltyKinds};
use super::params::SamplingParams;
use super::state::SamplerState;

/// The processors of a request with this state's history and `num_output_tokens`
/// generated tokens: every token whose logit they change, once, in id order. The penalties'
/// part is the state's kept list (`history.rs`; built here from the sorted prompt and
/// output counts for a state without one), merged with the few tokens the parameters name:
/// one linear pass per step.
pub(crate) fn logit_processing(
    params: &SamplingParams,
    state: &SamplerState,
    num_output_tokens: usize,
) -> LogitProcessing {
    logit_processing_in(params, state, num_output_tokens, Vec::new())
}

/// [`logit_processing`] with its list written into `buffer` (cleared first), so that a
/// caller drawing many rows every step reuses the same allocations.
pub(crate) fn logit_processing_in(
    params: &SamplingParams,
    state: &SamplerState,
    num_output_tokens: usize,
    mut buffer: Vec<TokenAdjustment>,
) -> LogitProcessing {
    // The few tokens the parameters name: bias and suppression.
    let mut named: BTreeMap<u32, TokenAdjustment> = BTreeMap::new();
    for &(id, b) in &params.logit_bias {
        named.entry(id).or_insert_with(|| neutral(id)).bias += b as f64;
    }
    if num_output_tokens < params.min_tokens {
        for id in params.suppressed_while_short() {
            named.entry(id).or_insert_with(|| neutral(id)).suppressed = true;
        }
    }
    let kinds = PenaltyKinds::of(params);
    let built;
    let history: &[TokenAdjustment] = match state.history(kinds) {
        Some(kept) => kept,
        None if !kinds.any() => &[],
        None => {
            built = History::new(kinds, state.prompt_tokens(), state.output_counts());
            &built.tokens
        }
    };
    buffer.clear();
    if named.is_empty() {
        buffer.extend_from_slice(history);
    } else {
        merge(history.iter().copied(), named.into_values(), &mut buffer);
    }
    LogitProcessing {
        repetition_penalty: params.repetition_penalty,
        presence_penalty: params.presence_penalty,
        frequency_penalty: params.frequency_penalty,
        tokens: buffer,
    }
}

/// Token `id` with nothing to change.
fn neutral(id: u32) -> TokenAdjustment {
    TokenAdjustment {
        id,
        bias: 0.0,
        count: 0,
        seen: false,
        suppressed: false,
    }
}

/// Two lists ascending by id merged into `out`, the adjustments of an id both hold combined.
fn merge(
    a: impl Iterator<Item = TokenAdjustment>,
    b: impl Iterator<Item = TokenAdjustment>,
    out: &mut Vec<TokenAdjustment>,
) {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    out.reserve(a.size_hint().0 + b.size_hint().0);
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.id == y.id => {
                let (x, y) = (a.next(), b.next());
                x.zip(y).map(|(x, y)| TokenAdjustment {
                    id: x.id,
                    bias: x.bias + y.bias,
                    count: x.count.max(y.count),
                    seen: x.seen || y.seen,
                    suppressed: x.suppressed || y.suppressed,
                })
            }
            (Some(x), Some(y)) if x.id < y.id => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => None,
        };
        match next {
            Some(t) => out.push(t),
            None => return,
        }
    }
}

/// Applies every processor to `values` (`[vocab_size]`, holding the raw logits on entry).
/// Token ids outside the row are ignored (validation rejects them in parameters; prompt ids
/// are the engine's to check).
pub(crate) fn apply_all(
    values: &mut [f64],
    params: &SamplingParams,
    state: &SamplerState,
    num_output_tokens: usize,
) {
    let processing = logit_processing(params, state, num_output_tokens);
    for t in &processing.tokens {
        if let Some(v) = values.get_mut(t.id as usize) {
            *v = processing.value(t, *v as f32) as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with(prompt: &[u32], output: &[u32]) -> SamplerState {
        let mut s = SamplerState::new(0, prompt);
        for &t in output {
            s.append_output(t);
        }
        s
    }

    #[test]
    fn logit_bias_adds_and_repeats_accumulate() {
        let params = SamplingParams {
            logit_bias: vec![(0, 0.5), (2, -3.0), (2, -1.0), (9, 5.0)],
            ..SamplingParams::default()
        };
        let mut v = vec![1.0, 2.0, 3.0];
        apply_all(&mut v, &params, &state_with(&[], &[]), 0);
        assert_eq!(v, vec![1.5, 2.0, -1.0]);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let params = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        let mut v = vec![2.0, -2.0, 0.0, 4.0, f64::NEG_INFINITY];
        apply_all(&mut v, &params, &state_with(&[0, 1, 2, 4], &[]), 0);
        assert_eq!(v, vec![1.0, -4.0, 0.0, 4.0, f64::NEG_INFINITY]);
    }

    #[test]
    fn only_tokens_a_processor_changes_are_listed() {
        // Neutral parameters list nothing, whatever the history.
        let state = state_with(&[4, 5], &[5, 6]);
        let neutral = SamplingParams {
            min_tokens: 9, // no stop token to suppress
            ..SamplingParams::default()
        };
        assert!(logit_processing(&neutral, &state, 2).is_empty());
        // A presence penalty lists the output tokens only; a repetition penalty all seen.
        let presence = SamplingParams {
            presence_penalty: 0.5,
            ..SamplingParams::default()
        };
        let ids = |p: &SamplingParams| -> Vec<u32> {
            logit_processing(p, &state, 2)
                .tokens
                .iter()
                .map(|t| t.id)
                .collect()
        };
        assert_eq!(ids(&presence), vec![5, 6]);
        let repetition = SamplingParams {
            repetition_penalty: 1.5,
            ..SamplingParams::default()
        };
        assert_eq!(ids(&repetition), vec![4, 5, 6]);
    }

    #[test]
    fn processed_values_are_rounded_to_f32() {
        let params = SamplingParams {
            logit_bias: vec![(0, 0.1)],
            ..SamplingParams::default()
        };
        let mut v = vec![1.0, 2.0];
        apply_all(&mut v, &params, &state_with(&[], &[]), 0);
        assert_eq!(v[0], (1.0f64 + 0.1f32 as f64) as f32 as f64);
        assert_ne!(v[0], 1.0 + 0.1f32 as f64, "not the unrounded f64 sum");
    }

    #[test]
    fn repetition_penalty_hits_prompt_and_output_tokens_once_each() {
        // Token 1 is in the prompt and generated twice: penalised once, not three times.
        let params = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        let state = state_with(&[1, 1, 3], &[1, 1, 0]);
        let mut v = vec![8.0, 8.0, 8.0, -8.0];
        apply_all(&mut v, &params, &state, 3);
        assert_eq!(v, vec![4.0, 4.0, 8.0, -16.0]);
    }

    #[test]
    fn presence_and_frequency_use_output_counts_only() {
        let params = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::default()
        };
        // Token 2 is only in the prompt: untouched. Token 0 twice, token 1 once.
        let state = state_with(&[2], &[0, 1, 0]);
        let mut v = vec![1.0, 1.0, 1.0];
        apply_all(&mut v, &params, &state, 3);
        assert_eq!(v, vec![1.0 - 0.5 - 0.5, 1.0 - 0.5 - 0.25, 1.0]);
    }

    #[test]
    fn min_tokens_suppresses_stop_and_eos_until_reached() {
        let params = SamplingParams {
            min_tokens: 2,
            stop_token_ids: vec![1],
            eos_token_ids: vec![3],
            ..SamplingParams::default()
        };
        let state = state_with(&[], &[]);
        let ninf = f64::NEG_INFINITY;
        let mut v = vec![0.0; 4];
        apply_all(&mut v, &params, &state, 1);
        assert_eq!(v, vec![0.0, ninf, 0.0, ninf]);
        let mut v = vec![0.0; 4];
        apply_all(&mut v, &params, &state, 2);
        assert_eq!(v, vec![0.0; 4]);
        // ignore_eos: EOS is not a stop token, so it is not suppressed either.
        let params = SamplingParams {
            ignore_eos: true,
            ..params
        };
        let mut v = vec![0.0; 4];
        apply_all(&mut v, &params, &state, 0);
        assert_eq!(v, vec![0.0, ninf, 0.0, 0.0]);
    }

    #[test]
    fn order_is_bias_then_suppression_then_repetition_then_presence() {
        // Bias first flips token 0's sign, so the repetition penalty multiplies it.
        let params = SamplingParams {
            logit_bias: vec![(0, -3.0), (1, 100.0)],
            repetition_penalty: 2.0,
            presence_penalty: 1.0,
            min_tokens: 1,
            stop_token_ids: vec![1],
            ..SamplingParams::default()
        };
        let state = state_with(&[0], &[0]);
        let mut v = vec![1.0, 5.0, 5.0];
        apply_all(&mut v, &params, &state, 0);
        // 1 - 3 = -2; * 2 = -4; - 1 (presence) = -5. Token 1: biased then suppressed.
        assert_eq!(v, vec![-5.0, f64::NEG_INFINITY, 5.0]);
    }
}
