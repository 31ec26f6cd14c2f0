//! `cuda_score check`'s comparisons of what the runner computes where the logits are
//! (log-probabilities, greedy picks, draws) with the host's computation from the same
//! logits, and of the tensor-core prefill attention with the tiled kernel.

use std::time::Instant;

use anyhow::Result;
use serde_json::{json, Value};
use tandem_cuda::CudaRunner;
use tandem_model::batch::TokenId;
use tandem_model::logit_processing::{LogitProcessing, TokenAdjustment};
use tandem_model::row_sampling::{RowDraw, RowSampling};
use tandem_model::runner::ModelRunner;
use tandem_model::token_pick::TokenPick;

use crate::{
    blocks, chunk_batch, decode_batch, decode_vs_forward, long_prefill, score, BLOCK, CHUNK,
};

/// Teacher-forced logprobs of `tokens[1..]` computed on the device
/// (`ModelRunner::forward_logprobs`) against the host's log-softmax of the same forward
/// pass's logits: they must be bitwise equal. Also times both.
pub(crate) fn device_logprobs(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<Value> {
    let t = Instant::now();
    let (host, _) = score(runner, tokens, 0)?;
    let host_ms = t.elapsed().as_secs_f64() * 1e3;
    let table = blocks(0, tokens.len().div_ceil(BLOCK));
    let t = Instant::now();
    let mut device = Vec::new();
    let mut done = 0;
    while done < tokens.len() {
        let n = CHUNK.min(tokens.len() - done);
        let batch = chunk_batch(tokens, &table, done, n);
        let targets: Vec<Option<TokenId>> = (0..n)
            .map(|row| tokens.get(done + row + 1).copied())
            .collect();
        device.extend(
            runner
                .forward_logprobs(&batch, &targets)?
                .into_iter()
                .flatten(),
        );
        done += n;
    }
    let device_ms = t.elapsed().as_secs_f64() * 1e3;
    let differ = host
        .iter()
        .zip(&device)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let max_abs = host
        .iter()
        .zip(&device)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    Ok(json!({
        "positions": host.len(), "device_positions": device.len(), "differ": differ,
        "max_abs_diff": max_abs, "host_ms": host_ms, "device_ms": device_ms,
    }))
}

/// Greedy picks made on the device (`ModelRunner::forward_greedy`) against the host's pick
/// from the same pass's logits, for a prefill chunk (eager) and a decode step (its CUDA
/// graph): they must be equal, logprobs bitwise. Also times the decode step both ways.
pub(crate) fn device_greedy(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<Value> {
    let n = 256.min(tokens.len() - 1);
    let table = blocks(0, (n + 1).div_ceil(BLOCK));
    let prefill = chunk_batch(tokens, &table, 0, n);
    let decode = decode_batch(std::slice::from_ref(&table), tokens[n], n);
    let mut differ = 0;
    let mut rows = 0;
    let mut times = Vec::new();
    for batch in [&prefill, &decode] {
        let t = Instant::now();
        let logits = runner.forward(batch)?;
        let host_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let device = runner.forward_greedy(batch)?;
        let device_ms = t.elapsed().as_secs_f64() * 1e3;
        times.push((host_ms, device_ms));
        for (r, pick) in device.iter().enumerate() {
            rows += 1;
            differ += usize::from(TokenPick::greedy(logits.row(r)) != *pick);
        }
    }
    Ok(json!({
        "rows": rows, "differ": differ,
        "decode_logits_ms": times[1].0, "decode_greedy_ms": times[1].1,
    }))
}

/// Tokens drawn on the device (`ModelRunner::forward_sample`: processing.cu, `sample_rows`,
/// `top_logits`) against the host reference ([`RowDraw::pick`]) on the same pass's logits,
/// for a prefill chunk with every row output, several truncation settings and uniform
/// numbers, with and without processors (bias, repetition, presence and frequency
/// penalties, a suppressed token) and top logprobs. Equal up to rounding at a boundary
/// (sums in another order, an ulp of `exp`: a probability of order 1e-15 per draw), so
/// `differ` should be 0; logprobs and top logprobs must match the host's bitwise where the
/// tokens do.
pub(crate) fn device_sample(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<Value> {
    let n = 256.min(tokens.len());
    let table = blocks(0, n.div_ceil(BLOCK));
    let batch = chunk_batch(tokens, &table, 0, n);
    let logits = runner.forward(&batch)?;
    let settings = [
        (0.7f32, 0, 1.0f32, 0.0f32, false),
        (1.0, 40, 0.9, 0.0, false),
        (1.2, 0, 0.5, 0.05, false),
        (0.0, 0, 1.0, 0.0, true),
        (0.9, 50, 0.95, 0.0, true),
    ];
    let (mut differ, mut logprob_differ, mut top_differ, mut rows) = (0, 0, 0, 0);
    for (k, &(temperature, top_k, top_p, min_p, processed)) in settings.iter().enumerate() {
        let draws: Vec<RowDraw> = (0..n)
            .map(|r| {
                let sampling = RowSampling {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    uniform: ((r * 7 + k * 3) % 97) as f64 / 97.0,
                };
                let mut d = RowDraw::plain(sampling);
                if processed {
                    d.processing = processing_of(&tokens[..=r], runner.config().vocab_size);
                    d.top_logprobs = 1 + r % 20;
                }
                d
            })
            .collect();
        let device = runner.forward_sample(&batch, &draws)?;
        for (r, (pick, d)) in device.iter().zip(&draws).enumerate() {
            rows += 1;
            match (d.pick(logits.row(r)), pick) {
                (Some(h), Some(p)) if h.token == p.token => {
                    logprob_differ += usize::from(h.logprob.to_bits() != p.logprob.to_bits());
                    top_differ += usize::from(h.top_logprobs != p.top_logprobs);
                }
                _ => differ += 1,
            }
        }
    }
    Ok(json!({
        "rows": rows, "differ": differ, "logprob_differ": logprob_differ,
        "top_logprobs_differ": top_differ,
    }))
}

/// Processors as a request with `history` behind it would have them: every token of the
/// history seen, counted and biased, the first one suppressed.
fn processing_of(history: &[TokenId], vocab: usize) -> LogitProcessing {
    let mut counts = std::collections::BTreeMap::new();
    for t in history {
        *counts.entry(t.0).or_insert(0u32) += 1;
    }
    let first = history[0].0;
    LogitProcessing {
        repetition_penalty: 1.3,
        presence_penalty: 0.4,
        frequency_penalty: 0.2,
        tokens: counts
            .into_iter()
            .filter(|&(id, _)| (id as usize) < vocab)
            .map(|(id, count)| TokenAdjustment {
                id,
                bias: (id % 7) as f64 * 0.5 - 1.5,
                count,
                seen: true,
                suppressed: id == first,
            })
            .collect(),
    }
}

/// The tensor-core attention against the tiled kernel: the largest difference of the
/// teacher-forced logprobs of `tokens`, and the rate of a prefill of 8 x 2,048 tokens with
/// each (the same in f32 mode, where it does not apply); and with tensor cores, greedy
/// decode one token at a time against scoring (bitwise equal: 0), and over three
/// partitions with the scoring's blocks folding their partitions (as long prompts run) and
/// a block per partition (as short ones do).
pub(crate) fn tensor_cores(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<Value> {
    let (tiled, _) = score(runner, tokens, 0)?;
    let tiled_rate = long_prefill(runner, tokens)?;
    runner.set_tensor_core_attention(true);
    let measured = (|| {
        let scored = score(runner, tokens, 0)?;
        let rate = long_prefill(runner, tokens)?;
        let prompt = &tokens[..64.min(tokens.len())];
        let decode = decode_vs_forward(runner, prompt, 32)?;
        // Over three partitions, so that the scoring's blocks fold several while each
        // decode step's partitions are merged by attention_tc_merge.
        let long = &tokens[..300.min(tokens.len())];
        runner.set_tensor_core_fold_min_blocks(Some(0));
        let folded = decode_vs_forward(runner, long, 32);
        runner.set_tensor_core_fold_min_blocks(Some(usize::MAX));
        let per_partition = decode_vs_forward(runner, long, 32);
        anyhow::Ok((scored, rate, decode, folded?, per_partition?))
    })();
    runner.set_tensor_core_attention(false);
    runner.set_tensor_core_fold_min_blocks(None);
    let ((tc, _), tc_rate, decode, folded, per_partition) = measured?;
    let max_abs = tiled
        .iter()
        .zip(&tc)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    Ok(json!({
        "positions": tc.len(), "max_abs_logprob_diff": max_abs,
        "prefill_8x2048_tok_s_tiled": tiled_rate, "prefill_8x2048_tok_s_tensor_cores": tc_rate,
        "decode_vs_forward": decode, "decode_vs_forward_folded": folded,
        "decode_vs_forward_per_partition": per_partition,
    }))
}
