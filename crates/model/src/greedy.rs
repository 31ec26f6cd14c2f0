//! The greedy choice of a logits row, as the sampler makes it for a request without
//! processors: the lowest id holding the largest logit, and that token's log-probability
//! under the row's softmax (`max + ln Σ exp(x - max)`, the sum by the kernels' `exp_sum`),
//! bitwise the numbers the sampler and `tandem score` report. A device runner computes the
//! same from three numbers per row ([`GreedyPick::from_row_stats`]) instead of copying the
//! row to the host.

use tandem_kernels::ops::{log_prob, log_sum_exp};

use crate::batch::TokenId;

/// One output row's greedy token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GreedyPick {
    pub token: TokenId,
    /// `log p(token)` under the raw distribution of the row.
    pub logprob: f32,
}

impl GreedyPick {
    /// The pick of a logits row; `None` when it is empty or holds a NaN or an infinity.
    pub fn of_row(row: &[f32]) -> Option<GreedyPick> {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() || row.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let token = row.iter().position(|&v| v == max)?;
        let sum = tandem_kernels::exp_sum::exp_sum(row, max);
        GreedyPick::from_row_stats(token as i64, max, sum)
    }

    /// The pick from a row's statistics: the lowest index of its maximum, the maximum and
    /// `Σ exp(x - max)` in the host's order; `None` for a row marked non-finite (a negative
    /// index or a zero sum: a finite row sums at least its maximum's term, 1).
    pub fn from_row_stats(argmax: i64, max: f32, exp_sum: f64) -> Option<GreedyPick> {
        if argmax < 0 || exp_sum == 0.0 || argmax > u32::MAX as i64 {
            return None;
        }
        Some(GreedyPick {
            token: TokenId(argmax as u32),
            logprob: log_prob(max, log_sum_exp(max, exp_sum)),
        })
    }
}
