//! Log-probabilities reported with each token. They come from the **raw** model
//! distribution, `log_softmax` of the unprocessed logits (before bias, penalties,
//! temperature or truncation), as vLLM reports them; the arithmetic is the same as the
//! kernels' `log_softmax`, so the numbers equal `tandem score`'s bit for bit.

use super::error::SamplerError;
use super::params::SamplingParams;
use super::SampledToken;

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

    /// [`RawLogSoftmax::of`] `row` when `params` asks for logprobs; otherwise only its
    /// checks (a row that is empty or not finite is refused either way).
    pub(crate) fn if_reported(
        row: &[f32],
        params: &SamplingParams,
    ) -> Result<Option<RawLogSoftmax>, SamplerError> {
        if params.logprobs {
            return RawLogSoftmax::of(row).map(Some);
        }
        if row.is_empty() {
            return Err(SamplerError::EmptyLogits);
        }
        match tandem_kernels::row_max::max_finite(row) {
            Some(_) => Ok(None),
            None => Err(SamplerError::NonFiniteLogits),
        }
    }

    /// `log p` of a token whose raw logit is `logit`.
    pub(crate) fn logprob(&self, logit: f32) -> f32 {
        tandem_kernels::ops::log_prob(logit, self.lse)
    }
}

/// `token` of `row` as reported to a request with `params`: with its logprob and
/// `params.top_logprobs` alternatives when `lsm` (the row's, given when `params.logprobs`).
pub(crate) fn reported(
    row: &[f32],
    token: u32,
    params: &SamplingParams,
    lsm: Option<RawLogSoftmax>,
) -> SampledToken {
    let Some(lsm) = lsm else {
        return SampledToken {
            token,
            logprob: None,
            top_logprobs: Vec::new(),
        };
    };
    let top = match params.top_logprobs {
        0 => Vec::new(),
        n => top_logprobs(row, n, lsm),
    };
    SampledToken {
        token,
        logprob: Some(lsm.logprob(row[token as usize])),
        top_logprobs: top,
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
