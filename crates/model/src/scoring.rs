//! Teacher-forced scoring: the log-probability of every token of a known sequence given the
//! tokens before it, from forward passes with output `All`.
//!
//! Long inputs run as successive chunks through one KV store (the same as one pass, see the
//! chunk-invariance test). Inputs longer than the context need an explicit [`Window`].

use crate::batch::{BlockId, ForwardBatch, OutputSelection, TokenId};
use crate::error::{ModelError, Result};
use crate::logits::Logits;
use crate::runner::ModelRunner;

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
}

impl Default for ScoreOptions {
    fn default() -> ScoreOptions {
        ScoreOptions {
            top_k: 0,
            window: None,
            chunk_len: 256,
            max_context: None,
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
        let batch = ForwardBatch::single(
            seq[done..done + n].to_vec(),
            done,
            table[..(done + n).div_ceil(block_size)].to_vec(),
            OutputSelection::All,
        );
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
/// logits row `row` (see [`Logits::log_probs`]) read at `actual`; with `with_rank`, the rank
/// of `actual` (1 + the number of entries strictly more likely); and the `top_k` most likely
/// tokens, most likely first, ties to the lower id. Errors when the row is not finite.
pub fn score_row(
    logits: &Logits,
    row: usize,
    actual: TokenId,
    top_k: usize,
    with_rank: bool,
) -> Result<PositionScore> {
    let lp = logits
        .log_probs(row)
        .ok_or_else(|| ModelError::Batch(format!("non-finite logits at row {row}")))?;
    let logprob = lp[actual.0 as usize];
    let rank = with_rank.then(|| 1 + lp.iter().filter(|&&v| v > logprob).count());
    Ok(PositionScore {
        logprob,
        rank,
        top: top_alternatives(&lp, top_k),
    })
}

/// The `k` largest entries of `lp` as `(id, logprob)`, largest first, ties to the lower id.
fn top_alternatives(lp: &[f32], k: usize) -> Vec<(TokenId, f32)> {
    let k = k.min(lp.len());
    if k == 0 {
        return Vec::new();
    }
    let mut order: Vec<u32> = (0..lp.len() as u32).collect();
    let by_logprob = |a: &u32, b: &u32| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b));
    order.select_nth_unstable_by(k - 1, by_logprob);
    order.truncate(k);
    order.sort_by(by_logprob);
    order
        .into_iter()
        .map(|i| (TokenId(i), lp[i as usize]))
        .collect()
}
