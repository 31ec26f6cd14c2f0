//! The logit processors that run before temperature, in this order:
//! logit_bias -> min_tokens stop-token suppression -> repetition penalty ->
//! presence and frequency penalties. They work in f64 on a copy of the raw row, so no
//! finite input and in-range parameter can overflow.

use super::params::SamplingParams;
use super::state::SamplerState;

/// Applies every processor, in the documented order, to `values` (`[vocab_size]`, holding
/// the raw logits on entry). Token ids outside the row are ignored (validation rejects them
/// in parameters; prompt ids are the engine's to check).
pub(crate) fn apply_all(
    values: &mut [f64],
    params: &SamplingParams,
    state: &SamplerState,
    num_output_tokens: usize,
) {
    apply_logit_bias(values, &params.logit_bias);
    if num_output_tokens < params.min_tokens {
        suppress(values, params.suppressed_while_short());
    }
    if params.repetition_penalty != 1.0 {
        let seen = state.prompt_tokens().iter().copied().chain(
            state
                .output_counts()
                .map(|(t, _)| t)
                .filter(|&t| !state.in_prompt(t)),
        );
        apply_repetition_penalty(values, seen, params.repetition_penalty as f64);
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        apply_presence_frequency(
            values,
            state.output_counts(),
            params.presence_penalty as f64,
            params.frequency_penalty as f64,
        );
    }
}

/// `values[id] += bias` for every pair (repeated ids add up).
fn apply_logit_bias(values: &mut [f64], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(v) = values.get_mut(id as usize) {
            *v += b as f64;
        }
    }
}

/// Sets the listed ids to `-inf` so they can never be chosen.
fn suppress(values: &mut [f64], ids: impl Iterator<Item = u32>) {
    for id in ids {
        if let Some(v) = values.get_mut(id as usize) {
            *v = f64::NEG_INFINITY;
        }
    }
}

/// For each id in `seen` (each at most once): divide a positive logit by `penalty`, multiply
/// a non-positive one by it (the CTRL / Hugging Face rule; `-inf` stays `-inf`).
fn apply_repetition_penalty(values: &mut [f64], seen: impl Iterator<Item = u32>, penalty: f64) {
    for id in seen {
        if let Some(v) = values.get_mut(id as usize) {
            *v = if *v > 0.0 { *v / penalty } else { *v * penalty };
        }
    }
}

/// For each generated token with `count` occurrences:
/// `logit -= presence + frequency * count` (OpenAI's definition).
fn apply_presence_frequency(
    values: &mut [f64],
    counts: impl Iterator<Item = (u32, u32)>,
    presence: f64,
    frequency: f64,
) {
    for (id, count) in counts {
        if let Some(v) = values.get_mut(id as usize) {
            *v -= presence + frequency * count as f64;
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
        let mut v = vec![1.0, 2.0, 3.0];
        apply_logit_bias(&mut v, &[(0, 0.5), (2, -3.0), (2, -1.0), (9, 5.0)]);
        assert_eq!(v, vec![1.5, 2.0, -1.0]);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let mut v = vec![2.0, -2.0, 0.0, 4.0, f64::NEG_INFINITY];
        apply_repetition_penalty(&mut v, [0, 1, 2, 4].into_iter(), 2.0);
        assert_eq!(v, vec![1.0, -4.0, 0.0, 4.0, f64::NEG_INFINITY]);
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
