//! Log-probabilities reported with each token. They come from the **raw** model
//! distribution, `log_softmax` of the unprocessed logits (before bias, penalties,
//! temperature or truncation), as vLLM reports them; the arithmetic is the same as the
//! kernels' `log_softmax`, so the numbers equal `tandem score`'s bit for bit.

use super::error::SamplerError;

/// `logsumexp` of one raw logits row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawLogSoftmax {
    lse: f64,
}

impl RawLogSoftmax {
    /// Computes `logsumexp(row)` as `max + ln(sum exp(row - max))` (the subtraction in f32,
    /// the sum in f64 by the kernels' `exp_sum`: `ops::row_log_sum_exp`, the one `tandem
    /// score` uses). Errors on an empty row or any NaN or infinity.
    pub(crate) fn of(row: &[f32]) -> Result<RawLogSoftmax, SamplerError> {
        if row.is_empty() {
            return Err(SamplerError::EmptyLogits);
        }
        let lse = tandem_kernels::ops::row_log_sum_exp(row).ok_or(SamplerError::NonFiniteLogits)?;
        Ok(RawLogSoftmax { lse })
    }

    /// `log p` of a token whose raw logit is `logit`.
    pub(crate) fn logprob(&self, logit: f32) -> f32 {
        tandem_kernels::ops::log_prob(logit, self.lse)
    }
}

/// The `n` most likely tokens of the raw distribution with their logprobs, most likely
/// first (ties to the lower id).
pub(crate) fn top_logprobs(row: &[f32], n: usize, lsm: RawLogSoftmax) -> Vec<(u32, f32)> {
    tandem_model::token_pick::top_logprobs_of(row, n, lsm.lse)
        .into_iter()
        .map(|(t, l)| (t.0, l))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_of_uniform_row_are_minus_ln_n() {
        let lsm = RawLogSoftmax::of(&[3.0; 4]).expect("finite");
        assert!((lsm.logprob(3.0) as f64 + 4f64.ln()).abs() < 1e-7);
    }

    #[test]
    fn rejects_non_finite_and_empty_rows() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let e = RawLogSoftmax::of(&[0.0, bad]).map(|_| ()).unwrap_err();
            assert_eq!(e, SamplerError::NonFiniteLogits);
        }
        let e = RawLogSoftmax::of(&[]).map(|_| ()).unwrap_err();
        assert_eq!(e, SamplerError::EmptyLogits);
    }

    #[test]
    fn top_logprobs_sorted_with_ties_to_lower_ids() {
        let row = [0.0, 2.0, 1.0, 2.0, -1.0];
        let lsm = RawLogSoftmax::of(&row).expect("finite");
        let top = top_logprobs(&row, 3, lsm);
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert_eq!(top_logprobs(&row, 9, lsm).len(), 5);
    }
}
