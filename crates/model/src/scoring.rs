//! Teacher-forced scoring: the log-probability of every token of a known sequence given the
//! tokens before it, from forward passes with output `All`.
//!
//! Long inputs run as successive chunks through one KV store (the same as one pass, see the
//! chunk-invariance test). Inputs longer than the context need an explicit [`Window`].

use tandem_kernels::ops::log_prob;

use crate::batch::{AdapterId, BlockId, ForwardBatch, OutputSelection, TokenId};
use crate::error::{ModelError, Result};
use crate::logits::Logits;
use crate::runner::ModelRunner;
use crate::token_pick::top_n;

/// Strided sliding windows for inputs longer than the context, as in HF's perplexity recipe:
/// window `w` covers tokens `[w * stride, w * stride + size)`, run as a fresh sequence, and
/// contributes the log-probabilities of the tokens no earlier window has scored. Every token
/// after the first window is thus predicted from at least `size - stride` tokens of context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub size: usize,
    pub stride: usize,
}

/// What to compute besides each token's log-probability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreOptions {
    /// Number of top alternatives (and the actual token's rank) per position; 0 for none.
    pub top_k: usize,
    pub window: Option<Window>,
    /// Tokens per forward call (bounds the logits buffer to `chunk_len * vocab` floats).
    pub chunk_len: usize,
    /// Longest sequence one forward context may hold (the model's context unless lowered).
    pub max_context: Option<usize>,
    /// The LoRA adapter the text is scored with.
    pub adapter: Option<AdapterId>,
}

impl Default for ScoreOptions {
    fn default() -> ScoreOptions {
        ScoreOptions {
            top_k: 0,
            window: None,
            chunk_len: 256,
            max_context: None,
            adapter: None,
        }
    }
}

/// The score of one position: `log p(token | tokens before it)`.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionScore {
    pub logprob: f32,
    /// 1 + the number of vocabulary entries strictly more likely than the actual token
    /// (`tandem score`: only with `top_k > 0`; the engine's prompt logprobs: always).
    pub rank: Option<usize>,
    /// The `top_k` most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(TokenId, f32)>,
}

/// Scores of a whole sequence; `positions[0]` is `None` (nothing predicts the first token).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreOutput {
    pub tokens: Vec<TokenId>,
    pub positions: Vec<Option<PositionScore>>,
}

impl ScoreOutput {
    /// Sum of the log-probabilities of all scored positions (natural log).
    pub fn sum_logprob(&self) -> f64 {
        self.positions
            .iter()
            .flatten()
            .map(|p| p.logprob as f64)
            .sum()
    }

    /// `exp(-mean logprob)` over scored positions, `None` when nothing was scored.
    pub fn perplexity(&self) -> Option<f64> {
        let n = self.positions.iter().flatten().count();
        (n > 0).then(|| (-self.sum_logprob() / n as f64).exp())
    }
}

/// Tokens one forward context of [`score_tokens`] holds: the runner's pool needs
/// `span_tokens(..).div_ceil(block_size)` blocks (it uses blocks `0..` of the pool).
pub fn span_tokens(num_tokens: usize, opts: &ScoreOptions, context_len: usize) -> usize {
    let context = opts.max_context.unwrap_or(context_len).min(context_len);
    match opts.window {
        Some(w) => w.size.min(num_tokens),
        None => num_tokens.min(context),
    }
    .max(1)
}

/// Scores `tokens` with `runner`, whose KV pool is free for the call and holds
/// [`span_tokens`]; `progress(done, total)` is called after every chunk.
pub fn score_tokens(
    runner: &mut dyn ModelRunner,
    tokens: &[TokenId],
    opts: &ScoreOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ScoreOutput> {
    let context_len = runner.config().context_len;
    let context = opts.max_context.unwrap_or(context_len).min(context_len);
    let mut positions = vec![None; tokens.len()];
    match opts.window {
        None if tokens.len() > context => {
            return Err(ModelError::ContextTooLong {
                num_tokens: tokens.len(),
                context_len: context,
            })
        }
        None => score_span(runner, tokens, 0, 1, opts, &mut positions, progress)?,
        Some(w) => {
            if w.size < 2 || w.stride == 0 || w.stride > w.size || w.size > context {
                return Err(ModelError::Batch(format!(
                    "window size {} and stride {} must satisfy 0 < stride <= size <= context ({context}) and size >= 2",
                    w.size, w.stride
                )));
            }
            let mut scored_until = 1; // positions below this already have scores
            let mut start = 0;
            while scored_until < tokens.len() {
                let end = (start + w.size).min(tokens.len());
                score_span(
                    runner,
                    &tokens[..end],
                    start,
                    scored_until,
                    opts,
                    &mut positions,
                    progress,
                )?;
                scored_until = end;
                start += w.stride;
            }
        }
    }
    Ok(ScoreOutput {
        tokens: tokens.to_vec(),
        positions,
    })
}

/// Runs `tokens[start..]` as one fresh sequence and fills `positions[first_scored..]`.
fn score_span(
    runner: &mut dyn ModelRunner,
    tokens: &[TokenId],
    start: usize,
    first_scored: usize,
    opts: &ScoreOptions,
    positions: &mut [Option<PositionScore>],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let seq = &tokens[start..];
    let geometry = runner.kv_geometry();
    let block_size = geometry.block_size;
    let num_blocks = seq.len().div_ceil(block_size);
    if num_blocks > geometry.num_blocks {
        return Err(ModelError::Batch(format!(
            "scoring {} tokens needs {num_blocks} KV blocks of {block_size}; the pool has {}",
            seq.len(),
            geometry.num_blocks
        )));
    }
    let table: Vec<BlockId> = (0..num_blocks as u32).map(BlockId).collect();
    let chunk_len = opts.chunk_len.max(1);
    let mut done = 0;
    while done < seq.len() {
        let n = chunk_len.min(seq.len() - done);
        let mut batch = ForwardBatch::single(
            seq[done..done + n].to_vec(),
            done,
            table[..(done + n).div_ceil(block_size)].to_vec(),
            OutputSelection::All,
        );
        batch.seqs[0].adapter = opts.adapter;
        // The token each row predicts, where it is one this span scores.
        let target = |row: usize| {
            let t = start + done + row + 1;
            (t >= first_scored && t < tokens.len()).then_some(t)
        };
        if opts.top_k == 0 {
            // Only the log-probabilities: a device runner computes them where the logits are.
            let targets: Vec<Option<TokenId>> =
                (0..n).map(|row| target(row).map(|t| tokens[t])).collect();
            let logprobs = runner.forward_logprobs(&batch, &targets)?;
            for (row, logprob) in logprobs.into_iter().enumerate() {
                if let (Some(t), Some(logprob)) = (target(row), logprob) {
                    positions[t] = Some(PositionScore {
                        logprob,
                        rank: None,
                        top: Vec::new(),
                    });
                }
            }
        } else {
            let logits = runner.forward(&batch)?;
            for row in 0..n {
                if let Some(t) = target(row) {
                    positions[t] = Some(position_score(&logits, row, tokens[t], opts.top_k)?);
                }
            }
        }
        done += n;
        progress(start + done, tokens.len());
    }
    Ok(())
}

/// The score of `actual` under logits row `row`, as `tandem score` reports it: the rank only
/// when `top_k > 0` (see [`score_row`]).
pub fn position_score(
    logits: &Logits,
    row: usize,
    actual: TokenId,
    top_k: usize,
) -> Result<PositionScore> {
    score_row(logits, row, actual, top_k, top_k > 0)
}

/// The one implementation of a position's score (teacher-forced scoring and the engine's
/// prompt logprobs both call it, so their numbers are bitwise equal): the log-softmax of
/// logits row `row` at `actual`, bitwise [`Logits::log_probs`]'s entry but formed for the
/// entries it needs only; with `with_rank`, the rank of `actual` (1 + the number of entries
/// strictly more likely); and the `top_k` most likely tokens, most likely first, ties to the
/// lower id. Errors when the row is not finite or `actual` is outside it.
pub fn score_row(
    logits: &Logits,
    row: usize,
    actual: TokenId,
    top_k: usize,
    with_rank: bool,
) -> Result<PositionScore> {
    let x = logits.row(row);
    let lse = tandem_kernels::ops::row_log_sum_exp(x)
        .ok_or_else(|| ModelError::Batch(format!("non-finite logits at row {row}")))?;
    let logit = x.get(actual.0 as usize).ok_or_else(|| {
        ModelError::Batch(format!("token {} is outside the vocabulary", actual.0))
    })?;
    // Every entry's logprob is `log_prob(v, lse)`, the log-softmax's own arithmetic; the
    // row is read, never written out.
    let logprob = log_prob(*logit, lse);
    let rank = with_rank.then(|| 1 + x.iter().filter(|&&v| log_prob(v, lse) > logprob).count());
    Ok(PositionScore {
        logprob,
        rank,
        top: top_alternatives(x, lse, top_k),
    })
}

/// The `k` most likely tokens of the raw logits row `x` with their logprobs, as
/// [`score_row`]'s alternatives: largest first, ties to the lower id, each bitwise the
/// log-softmax's entry; `None` when the row is empty or not finite. One pass over the row
/// after its logsumexp, nothing written out (beam search reads its candidates this way).
pub fn top_logprobs_of_row(x: &[f32], k: usize) -> Option<Vec<(TokenId, f32)>> {
    Some(top_alternatives(
        x,
        tandem_kernels::ops::row_log_sum_exp(x)?,
        k,
    ))
}

/// The `k` largest logprobs of the row `x` whose logsumexp is `lse`, as `(id, logprob)`,
/// largest first, ties to the lower id (logprobs in their total order), in one pass
/// ([`top_n`] over each entry's logprob, formed as the log-softmax forms it).
fn top_alternatives(x: &[f32], lse: f64, k: usize) -> Vec<(TokenId, f32)> {
    top_n(x.iter().map(|&v| log_prob(v, lse)), k.min(x.len()))
        .into_iter()
        .map(|(id, lp)| (TokenId(id), lp))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: the whole log-softmax written out, the rank counted on it, the top
    /// alternatives by sorting every entry.
    fn reference(x: &[f32], actual: usize, k: usize) -> (f32, usize, Vec<(TokenId, f32)>) {
        let mut lp = vec![0.0; x.len()];
        tandem_kernels::ops::log_softmax(x, &mut lp).expect("finite");
        let rank = 1 + lp.iter().filter(|&&v| v > lp[actual]).count();
        let mut order: Vec<u32> = (0..x.len() as u32).collect();
        order.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
        let top = order
            .iter()
            .take(k)
            .map(|&i| (TokenId(i), lp[i as usize]))
            .collect();
        (lp[actual], rank, top)
    }

    #[test]
    fn a_rows_score_is_the_written_out_log_softmax_bitwise() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for case in 0..200 {
            let n = [1, 2, 5, 64, 1000, 5000][case % 6];
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 30.0;
                    match i % 7 {
                        0 => 3.0,                      // exact ties
                        1 => 3.0 + f32::EPSILON * 4.0, // ties once rounded to logprobs
                        _ => v,
                    }
                })
                .collect();
            let actual = (case * 37) % n;
            let k = [0, 1, 5, 20, n][case % 5];
            let logits = Logits::new(vec![0], n, x.clone());
            let got = score_row(&logits, 0, TokenId(actual as u32), k, true).expect("finite");
            let (logprob, rank, top) = reference(&x, actual, k.min(n));
            assert_eq!(got.logprob.to_bits(), logprob.to_bits(), "case {case}");
            assert_eq!(got.rank, Some(rank), "case {case}");
            let bits = |t: &[(TokenId, f32)]| {
                t.iter()
                    .map(|(i, l)| (i.0, l.to_bits()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&got.top), bits(&top), "case {case}");
        }
    }

    #[test]
    fn non_finite_rows_and_tokens_outside_the_row_are_errors() {
        let logits = Logits::new(vec![0, 1], 3, vec![1.0, f32::NAN, 0.0, 1.0, 2.0, 3.0]);
        assert!(score_row(&logits, 0, TokenId(0), 2, true).is_err());
        assert!(score_row(&logits, 1, TokenId(3), 2, true).is_err());
        assert!(score_row(&logits, 1, TokenId(2), 2, true).is_ok());
    }
}
