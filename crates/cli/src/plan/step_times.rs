//! The model's own steps, timed on any runner (CPU or CUDA) with `tandem bench`'s
//! measurement, each paired with the work the roofline sees in it ([`SeqWork`]): what
//! [`super::calibrate::fit_to_model`] and [`super::fit_gpu::fit`] fit a profile to.

use anyhow::Result;
use tandem_model::runner::ModelRunner;

use super::calibrate::best_measure;
use super::cost::SeqWork;

/// One kind of step and its time, in seconds (the fastest of three runs).
#[derive(Debug, Clone, PartialEq)]
pub struct TimedStep {
    pub work: Vec<SeqWork>,
    pub secs: f64,
}

impl TimedStep {
    /// New tokens of the step: the tokens each matrix product sees.
    pub fn tokens(&self) -> f64 {
        self.work.iter().map(|w| w.new).sum()
    }
}

/// The mean of `steps` decode steps of `batch` sequences after prompts of `prompt` tokens:
/// each sequence one new token on a context at its mean over the steps.
pub fn decode_work(batch: usize, prompt: usize, steps: usize) -> Vec<SeqWork> {
    let w = SeqWork {
        cached: prompt as f64 + (steps as f64 - 1.0) / 2.0,
        new: 1.0,
        rows: 1.0,
    };
    vec![w; batch]
}

/// One prefill step of `seqs` prompts of `len` tokens, the last row of each sampled.
pub fn prefill_work(seqs: usize, len: usize) -> Vec<SeqWork> {
    let w = SeqWork {
        cached: 0.0,
        new: len as f64,
        rows: 1.0,
    };
    vec![w; seqs]
}

/// Times [`decode_work`] on `runner` (its pool must hold `batch` sequences of
/// `prompt + steps` tokens).
pub fn decode(
    runner: &mut dyn ModelRunner,
    batch: usize,
    prompt: usize,
    steps: usize,
) -> Result<TimedStep> {
    let secs = best_measure(runner, batch, prompt, steps)?.decode_s / steps as f64;
    Ok(TimedStep {
        work: decode_work(batch, prompt, steps),
        secs,
    })
}

/// Times [`prefill_work`] on `runner`: `seqs * len` tokens, at most 8192 (one step).
pub fn prefill(runner: &mut dyn ModelRunner, seqs: usize, len: usize) -> Result<TimedStep> {
    anyhow::ensure!(
        seqs * len <= 8192,
        "a prefill step holds at most 8192 tokens"
    );
    let secs = best_measure(runner, seqs, len, 1)?.prefill_s;
    Ok(TimedStep {
        work: prefill_work(seqs, len),
        secs,
    })
}
