//! The launches of the kernels that reduce rows of logits where they are (logprobs.cu,
//! sampling.cu), for `device_rows.rs`. Like every launch they go through
//! [`Kernels::launch`].

use crate::error::CudaError;
use crate::kernels::{Arg, DevPtr, Kernels};

/// Threads of a `logit_exp_sums` block (`LP_THREADS` in logprobs.cu).
const LOGPROB_THREADS: u32 = 256;
/// Threads of a `sample_rows` block (`SAMPLE_THREADS` in sampling.cu).
const SAMPLE_THREADS: u32 = 256;
/// Bytes of one row's parameters for `sample_rows` (`RowSampling` in sampling.cu).
pub(crate) const ROW_SAMPLING_BYTES: usize = 24;

/// `RowSampling` of sampling.cu, as bytes: temperature, top_k, top_p, min_p (4 bytes
/// each), the uniform number (8).
pub(crate) fn row_sampling_bytes(s: &tandem_model::row_sampling::RowSampling) -> [u8; 24] {
    let mut b = [0u8; ROW_SAMPLING_BYTES];
    b[0..4].copy_from_slice(&s.temperature.to_ne_bytes());
    b[4..8].copy_from_slice(&s.top_k.to_ne_bytes());
    b[8..12].copy_from_slice(&s.top_p.to_ne_bytes());
    b[12..16].copy_from_slice(&s.min_p.to_ne_bytes());
    b[16..24].copy_from_slice(&s.uniform.to_ne_bytes());
    b
}

impl Kernels {
    /// Per row of `rows` logits rows: the maximum, the host-order `Σ exp(x - max)` (0 for a
    /// row holding a NaN or an infinity) and the logit of the row's target (see
    /// logprobs.cu). logits: `[rows, vocab]` f32; targets: `[rows]` i32 (negative: none) or
    /// 0 (none for every row); row_max, target_logit: `[rows]` f32; row_sum: `[rows]` f64.
    #[allow(clippy::too_many_arguments)] // the kernel's arguments
    pub fn logit_exp_sums(
        &self,
        logits: DevPtr,
        targets: DevPtr,
        rows: usize,
        vocab: usize,
        row_max: DevPtr,
        row_sum: DevPtr,
        target_logit: DevPtr,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(logits),
            Arg::Ptr(targets),
            Arg::I32(vocab as i32),
            Arg::Ptr(row_max),
            Arg::Ptr(row_sum),
            Arg::Ptr(target_logit),
        ];
        self.launch("logit_exp_sums", (rows as u32, 1), LOGPROB_THREADS, &args)
    }

    /// One token per row of `rows` logits rows, drawn as each row's parameters say (see
    /// sampling.cu); -1 for a row holding a NaN or an infinity. logits: `[rows, vocab]`
    /// f32; params: `[rows]` of [`row_sampling_bytes`]; tokens: `[rows]` i32.
    pub fn sample_rows(
        &self,
        logits: DevPtr,
        params: DevPtr,
        rows: usize,
        vocab: usize,
        tokens: DevPtr,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(logits),
            Arg::Ptr(params),
            Arg::I32(vocab as i32),
            Arg::Ptr(tokens),
        ];
        self.launch("sample_rows", (rows as u32, 1), SAMPLE_THREADS, &args)
    }
}
