//! `cuda_score check`'s comparison of overlapped steps with ordinary ones: two decode
//! steps launched back to back (`ModelRunner::launch_sample`), the second carrying the
//! first's picks on the device, then both collected, against `forward_sample` of the same
//! two steps with the tokens passed from the host (and counted there for the penalties of
//! the rows that have them). The picks must be bitwise equal
//! (`overlap_differ`: rows whose token, logprob or top logprobs differ). Also times decode
//! steps with and without overlap.

use std::time::Instant;

use anyhow::{ensure, Result};
use serde_json::{json, Value};
use tandem_cuda::CudaRunner;
use tandem_model::batch::{BlockId, CarriedToken, ForwardBatch, OutputSelection, SeqSpan, TokenId};
use tandem_model::logit_processing::{LogitProcessing, TokenAdjustment};
use tandem_model::row_sampling::{RowDraw, RowSampling};
use tandem_model::runner::ModelRunner;
use tandem_model::token_pick::TokenPick;

use crate::{blocks, decode_batch, BLOCK};

/// Prompt tokens of each sequence before the decode steps.
const PROMPT: usize = 40;

/// Fresh sequences `i` of `tokens[i..i + PROMPT]` (cycled) on `tables`, prefilled in one
/// batch.
fn prefill(runner: &mut CudaRunner, tokens: &[TokenId], tables: &[Vec<BlockId>]) -> Result<()> {
    let mut all = Vec::new();
    let mut seqs = Vec::new();
    for (i, table) in tables.iter().enumerate() {
        seqs.push(SeqSpan {
            start: all.len(),
            len: PROMPT,
            num_cached: 0,
            block_table: table.clone(),
            adapter: None,
        });
        all.extend((0..PROMPT).map(|p| tokens[(i + p) % tokens.len()]));
    }
    runner.forward(&ForwardBatch {
        tokens: all,
        seqs,
        output: OutputSelection::Last,
    })?;
    Ok(())
}

/// Each sequence's draw: sampled at a row-dependent temperature and uniform, greedy for
/// every fifth row, a few top logprobs for every third.
fn draws(n: usize, step: usize) -> Vec<RowDraw> {
    (0..n)
        .map(|r| {
            let mut d = RowDraw::plain(RowSampling {
                temperature: if r % 5 == 0 {
                    0.0
                } else {
                    0.6 + (r % 4) as f32 * 0.2
                },
                top_k: if r % 2 == 0 { 0 } else { 50 },
                top_p: 0.95,
                min_p: 0.0,
                uniform: ((r * 13 + step * 29) % 101) as f64 / 101.0,
            });
            d.top_logprobs = if r % 3 == 0 { 1 + r % 7 } else { 0 };
            if r % 4 == 1 {
                d.processing = penalties(r);
            }
            d
        })
        .collect()
}

/// Penalties of every kind over a few tokens (an empty list for every eighth row): a
/// carried row's penalties count its carried token once more.
fn penalties(r: usize) -> LogitProcessing {
    let seen = |id: u32, count: u32| TokenAdjustment {
        id,
        bias: 0.0,
        count,
        seen: true,
        suppressed: false,
    };
    let mut tokens = vec![seen((r % 50) as u32, 1), seen(100 + r as u32, 0)];
    if r % 8 == 1 {
        tokens.clear();
    }
    LogitProcessing {
        repetition_penalty: 1.3,
        presence_penalty: 0.4,
        frequency_penalty: 0.2,
        tokens,
    }
}

/// A decode step of the sequences on `tables` at position `pos`, sequence `i` with
/// `tokens[i]`.
fn step_batch(tables: &[Vec<BlockId>], tokens: &[TokenId], pos: usize) -> ForwardBatch {
    let mut b = decode_batch(tables, TokenId(0), pos);
    b.tokens = tokens.to_vec();
    b
}

/// Rows of two pick lists that are not bitwise the same.
fn differing(a: &[Option<TokenPick>], b: &[Option<TokenPick>]) -> usize {
    let same = |x: &Option<TokenPick>, y: &Option<TokenPick>| match (x, y) {
        (Some(x), Some(y)) => {
            x.token == y.token
                && x.logprob.to_bits() == y.logprob.to_bits()
                && x.top_logprobs.len() == y.top_logprobs.len()
                && x.top_logprobs
                    .iter()
                    .zip(&y.top_logprobs)
                    .all(|(p, q)| p.0 == q.0 && p.1.to_bits() == q.1.to_bits())
        }
        (None, None) => true,
        _ => false,
    };
    a.len().abs_diff(b.len()) + a.iter().zip(b).filter(|(x, y)| !same(x, y)).count()
}

fn tokens_of(picks: &[Option<TokenPick>]) -> Vec<TokenId> {
    picks
        .iter()
        .map(|p| p.as_ref().map_or(TokenId(0), |p| p.token))
        .collect()
}

/// Two decode steps of `n` sequences both ways; the rows that differ. The reference runs
/// on blocks from `first`, the overlapped steps on as many blocks after them. The second
/// step lists the sequences in reverse order, so output row `i` of the first step feeds
/// row `n - 1 - i` (the same batches on both paths: only where the tokens come from
/// differs).
fn compare(runner: &mut CudaRunner, tokens: &[TokenId], n: usize, first: usize) -> Result<usize> {
    let per_seq = (PROMPT + 2).div_ceil(BLOCK);
    let tables = |base: usize| -> Vec<Vec<BlockId>> {
        (0..n)
            .map(|i| blocks(base + i * per_seq, per_seq))
            .collect()
    };
    let (reference, overlapped) = (tables(first), tables(first + n * per_seq));
    prefill(runner, tokens, &reference)?;
    prefill(runner, tokens, &overlapped)?;
    let start: Vec<TokenId> = (0..n).map(|i| tokens[(i * 3 + 1) % tokens.len()]).collect();
    let (d1, d2) = (draws(n, 1), draws(n, 2));

    // The second step lists the sequences in reverse order, on both paths.
    let reversed = |t: &[Vec<BlockId>]| -> Vec<Vec<BlockId>> { t.iter().rev().cloned().collect() };
    let d2: Vec<RowDraw> = d2.into_iter().rev().collect();

    let r1 = runner.forward_sample(&step_batch(&reference, &start, PROMPT), &d1)?;
    let fed: Vec<TokenId> = tokens_of(&r1).into_iter().rev().collect();
    // The host's second step counts each carried row's token for its penalties itself.
    let d2_host: Vec<RowDraw> = d2
        .iter()
        .enumerate()
        .map(|(row, d)| match row {
            0 => d.clone(),
            _ => RowDraw {
                processing: d.processing.with_output(fed[row].0),
                ..d.clone()
            },
        })
        .collect();
    let second_host = step_batch(&reversed(&reference), &fed, PROMPT + 1);
    let r2 = runner.forward_sample(&second_host, &d2_host)?;

    // Row 0 is not carried: it holds the host's token, as the reference's does.
    let mut placeholders = vec![TokenId(0); n];
    placeholders[0] = fed[0];
    let carried: Vec<CarriedToken> = (1..n)
        .map(|row| CarriedToken {
            row,
            from_output: n - 1 - row,
        })
        .collect();
    runner.launch_sample(&step_batch(&overlapped, &start, PROMPT), &d1, &[])?;
    let second = step_batch(&reversed(&overlapped), &placeholders, PROMPT + 1);
    runner.launch_sample(&second, &d2, &carried)?;
    let o1 = runner.collect_picks()?;
    let o2 = runner.collect_picks()?;
    ensure!(
        runner.collect_picks().is_err(),
        "a third collect found a step"
    );
    Ok(differing(&r1, &o1) + differing(&r2, &o2))
}

/// Decode steps per second of `n` sequences, each step's tokens the step before's picks:
/// sequentially (`forward_sample`, the picks through the host) or overlapped (each step
/// launched before the one before it is collected).
fn decode_rate(
    runner: &mut CudaRunner,
    tokens: &[TokenId],
    n: usize,
    first: usize,
    overlap: bool,
) -> Result<f64> {
    let steps = 64;
    let per_seq = (PROMPT + steps).div_ceil(BLOCK);
    let tables: Vec<Vec<BlockId>> = (0..n)
        .map(|i| blocks(first + i * per_seq, per_seq))
        .collect();
    prefill(runner, tokens, &tables)?;
    let rows = draws(n, 0);
    let mut current: Vec<TokenId> = (0..n).map(|i| tokens[i % tokens.len()]).collect();
    let carried: Vec<CarriedToken> = (0..n)
        .map(|row| CarriedToken {
            row,
            from_output: row,
        })
        .collect();
    runner.synchronize()?;
    let t = Instant::now();
    if overlap {
        runner.launch_sample(&step_batch(&tables, &current, PROMPT), &rows, &[])?;
        for step in 1..steps {
            let b = step_batch(&tables, &vec![TokenId(0); n], PROMPT + step);
            runner.launch_sample(&b, &rows, &carried)?;
            runner.collect_picks()?;
        }
        runner.collect_picks()?;
    } else {
        for step in 0..steps {
            let picks =
                runner.forward_sample(&step_batch(&tables, &current, PROMPT + step), &rows)?;
            current = tokens_of(&picks);
        }
    }
    Ok((steps * n) as f64 / t.elapsed().as_secs_f64())
}

/// `overlap_differ` over decode batches of 16 (a graph) and 300 (eager, two row groups),
/// with graphs on and off, and decode rates with overlap on and off.
pub(crate) fn overlap(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<Value> {
    runner.set_overlap_steps(true);
    let mut differ = 0;
    let mut rows = 0;
    for graphs in [true, false] {
        runner.set_cuda_graphs(graphs);
        for n in [16, 300] {
            differ += compare(runner, tokens, n, 0)?;
            rows += 2 * n;
        }
    }
    runner.set_cuda_graphs(true);
    let mut out = json!({ "rows": rows, "overlap_differ": differ });
    for n in [1, 16, 64] {
        for on in [false, true] {
            let key = if on { "overlapped" } else { "sequential" };
            out[format!("decode_b{n}_{key}_tok_s")] = json!(decode_rate(runner, tokens, n, 0, on)?);
        }
    }
    Ok(out)
}
