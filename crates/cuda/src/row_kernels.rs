//! The launches of the kernels that reduce rows of logits where they are (logprobs.cu,
//! sampling.cu), for `device_rows.rs`. Like every launch they go through
//! [`Kernels::launch`].

use tandem_model::logit_processing::LogitProcessing;

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

/// Results per row of `top_logits` (`TOP_LOGITS_MAX` in sampling.cu): the most a request
/// may ask for.
pub(crate) const TOP_LOGITS_MAX: usize = 20;
/// Bytes of one row's `RowProcessing` and of one `TokenAdjustment` (processing.cu).
pub(crate) const ROW_PROCESSING_BYTES: usize = 24;
pub(crate) const TOKEN_ADJUSTMENT_BYTES: usize = 24;

/// The processing of rows, as `process_rows` reads it: one `RowProcessing` per row
/// (appended to `rows`), its tokens' `TokenAdjustment`s (appended to `tokens`, the row's
/// range within them recorded in its `RowProcessing`).
pub(crate) fn append_processing(p: &LogitProcessing, rows: &mut Vec<u8>, tokens: &mut Vec<u8>) {
    let begin = tokens.len() / TOKEN_ADJUSTMENT_BYTES;
    for t in &p.tokens {
        let flags = u32::from(t.seen) | (u32::from(t.suppressed) << 1);
        tokens.extend_from_slice(&t.bias.to_ne_bytes());
        tokens.extend_from_slice(&t.id.to_ne_bytes());
        tokens.extend_from_slice(&t.count.to_ne_bytes());
        tokens.extend_from_slice(&flags.to_ne_bytes());
        tokens.extend_from_slice(&0u32.to_ne_bytes());
    }
    let end = tokens.len() / TOKEN_ADJUSTMENT_BYTES;
    rows.extend_from_slice(&p.repetition_penalty.to_ne_bytes());
    rows.extend_from_slice(&p.presence_penalty.to_ne_bytes());
    rows.extend_from_slice(&p.frequency_penalty.to_ne_bytes());
    rows.extend_from_slice(&(begin as i32).to_ne_bytes());
    rows.extend_from_slice(&(end as i32).to_ne_bytes());
    rows.extend_from_slice(&0i32.to_ne_bytes());
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

    /// Applies each row's processors to its logits in place, saving the raw values
    /// (`restore` puts them back): logits `[rows, vocab]` f32; row_params and tokens as
    /// [`append_processing`] lays them out; saved: one f32 per token of the list. With
    /// `carried` (`[rows]` i32 tokens, -1 for none, and `[rows]` f32 of room), each row's
    /// carried token counts once more for its penalties (processing.cu).
    #[allow(clippy::too_many_arguments)] // the kernel's arguments and the direction
    pub fn process_rows(
        &self,
        logits: DevPtr,
        row_params: DevPtr,
        tokens: DevPtr,
        saved: DevPtr,
        carried: Option<(DevPtr, DevPtr)>,
        rows: usize,
        vocab: usize,
        restore: bool,
    ) -> Result<(), CudaError> {
        let (carried, carried_saved) = carried.unwrap_or((0, 0));
        let args = [
            Arg::Ptr(logits),
            Arg::Ptr(row_params),
            Arg::Ptr(tokens),
            Arg::Ptr(saved),
            Arg::Ptr(carried),
            Arg::Ptr(carried_saved),
            Arg::I32(vocab as i32),
        ];
        let name = if restore {
            "restore_rows"
        } else {
            "process_rows"
        };
        self.launch(name, (rows as u32, 1), SAMPLE_THREADS, &args)
    }

    /// The `counts[r]` (at most [`TOP_LOGITS_MAX`]) largest logits of each row, largest
    /// first, ties to the lower id: logits `[rows, vocab]` f32; counts `[rows]` i32; ids
    /// and values `[rows, TOP_LOGITS_MAX]` i32 and f32.
    pub fn top_logits(
        &self,
        logits: DevPtr,
        counts: DevPtr,
        rows: usize,
        vocab: usize,
        ids: DevPtr,
        values: DevPtr,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(logits),
            Arg::Ptr(counts),
            Arg::I32(vocab as i32),
            Arg::Ptr(ids),
            Arg::Ptr(values),
        ];
        self.launch("top_logits", (rows as u32, 1), SAMPLE_THREADS, &args)
    }

    /// `tokens[row] = max(picks[from_output], 0)` and `carried[output] = picks[from_output]`
    /// for each of `count` triples `(row, from_output, output)`, `carried` -1 at the other of
    /// the step's `outputs` output rows: the tokens an overlapped step carries from the picks
    /// of the step before, and the ones its rows' penalties count. tokens: the step's `[n]`
    /// i32 input tokens; picks: `[outputs before]` i32 as `sample_rows` wrote them; triples:
    /// `[count, 3]` i32, distinct rows and outputs; carried: `[outputs]` i32.
    pub fn carry_tokens(
        &self,
        tokens: DevPtr,
        picks: DevPtr,
        triples: DevPtr,
        count: usize,
        carried: DevPtr,
        outputs: usize,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(tokens),
            Arg::Ptr(picks),
            Arg::Ptr(triples),
            Arg::I32(count as i32),
            Arg::Ptr(carried),
            Arg::I32(outputs as i32),
        ];
        let blocks = u32::from(count > 0);
        self.launch("carry_tokens", (blocks, 1), SAMPLE_THREADS, &args)
    }
}
