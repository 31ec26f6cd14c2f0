//! GPU checks of `CudaRunner`, driven by `scripts/gpu_check.sh`.
//!
//! ```text
//! cuda_score score MODEL_DIR DTYPE REF_JSON OUT_JSON   # teacher-forced logprobs
//! cuda_score check MODEL_DIR DTYPE REF_JSON OUT_JSON   # decode = forward, prefix, overlap, timing
//! cuda_score profile MODEL_DIR DTYPE REF_JSON OUT_JSON # device time per operation
//! ```
//! `DTYPE` is bf16, f32, or q8_0 / q4_1 (bf16 with the layers' matrices in that format).
//! `REF_JSON` holds `{"tokens": [[id, ...], ...]}` (the reference file of
//! `scripts/make_gpu_models.py`). Kernels are cached under `$TANDEM_KERNEL_CACHE` (default
//! `/tmp/tandem-kernels`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tandem_cuda::{CudaDtype, CudaOptions, CudaRunner, CudaWeights, KvBudget};
use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, SeqSpan, TokenId};
use tandem_model::logits::Logits;
use tandem_model::row_sampling::{RowDraw, RowSampling};
use tandem_model::runner::ModelRunner;

mod device_checks;
mod overlap_check;

use device_checks::{device_greedy, device_logprobs, device_sample, tensor_cores};

const BLOCK: usize = 16;
const CHUNK: usize = 256;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, cmd, model, dtype, reference, out] = &args[..] else {
        bail!(
            "usage: cuda_score score|check|profile MODEL_DIR bf16|f32|q8_0|q4_1 REF_JSON OUT_JSON"
        );
    };
    // q8_0, q4_1: bf16 storage with the layers' matrices in Q8_0 or Q4_1.
    let (dtype, weights) = match dtype.as_str() {
        "bf16" => (CudaDtype::Bf16, CudaWeights::Dense),
        "f32" => (CudaDtype::F32, CudaWeights::Dense),
        "q8_0" => (CudaDtype::Bf16, CudaWeights::Q8_0),
        "q4_1" => (CudaDtype::Bf16, CudaWeights::Q4_1),
        other => bail!("unknown dtype {other}"),
    };
    let seqs = read_sequences(Path::new(reference))?;
    let loaded = tandem_model::loader::load_model(Path::new(model))?;
    let cache = std::env::var_os("TANDEM_KERNEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/tandem-kernels"));
    let options = CudaOptions {
        dtype,
        weights,
        block_size: BLOCK,
        kv: KvBudget::Blocks(12_000),
        ..CudaOptions::new(cache)
    };
    let t0 = Instant::now();
    let mut runner = CudaRunner::new(&loaded.host, options)?;
    eprintln!(
        "{} (ready in {:.1}s)",
        runner.describe(),
        t0.elapsed().as_secs_f64()
    );
    let result = match cmd.as_str() {
        "score" => score_all(&mut runner, &seqs)?,
        "check" => checks(&mut runner, &seqs)?,
        "profile" => profiles(&mut runner, &seqs[0])?,
        other => bail!("unknown command {other}"),
    };
    std::fs::write(out, serde_json::to_string(&result)?).with_context(|| out.clone())?;
    Ok(())
}

fn read_sequences(path: &Path) -> Result<Vec<Vec<TokenId>>> {
    let v: Value =
        serde_json::from_slice(&std::fs::read(path).with_context(|| path.display().to_string())?)?;
    let seqs = v["tokens"].as_array().context("reference has no tokens")?;
    seqs.iter()
        .map(|s| {
            let ids = s.as_array().context("a sequence is not a list")?;
            ids.iter()
                .map(|t| Ok(TokenId(t.as_u64().context("token id")? as u32)))
                .collect()
        })
        .collect()
}

/// Block ids `first..first + n`.
fn blocks(first: usize, n: usize) -> Vec<BlockId> {
    (first..first + n).map(|b| BlockId(b as u32)).collect()
}

fn logprob(logits: &Logits, row: usize, token: TokenId) -> Result<f32> {
    let lp = logits.log_probs(row).context("non-finite logits")?;
    Ok(lp[token.0 as usize])
}

/// Tokens `done..done + n` of a sequence on blocks `table`, every row's logits wanted.
fn chunk_batch(tokens: &[TokenId], table: &[BlockId], done: usize, n: usize) -> ForwardBatch {
    ForwardBatch::single(
        tokens[done..done + n].to_vec(),
        done,
        table[..(done + n).div_ceil(BLOCK)].to_vec(),
        OutputSelection::All,
    )
}

/// Teacher-forced logprobs of `tokens[1..]`, in chunks of `CHUNK`, in blocks from `first`.
fn score(
    runner: &mut CudaRunner,
    tokens: &[TokenId],
    first: usize,
) -> Result<(Vec<f32>, Vec<Logits>)> {
    let table = blocks(first, tokens.len().div_ceil(BLOCK));
    let (mut lps, mut all) = (Vec::new(), Vec::new());
    let mut done = 0;
    while done < tokens.len() {
        let n = CHUNK.min(tokens.len() - done);
        let batch = chunk_batch(tokens, &table, done, n);
        let logits = runner.forward(&batch)?;
        for row in 0..n {
            if let Some(&next) = tokens.get(done + row + 1) {
                lps.push(logprob(&logits, row, next)?);
            }
        }
        all.push(logits);
        done += n;
    }
    Ok((lps, all))
}

fn score_all(runner: &mut CudaRunner, seqs: &[Vec<TokenId>]) -> Result<Value> {
    let mut out = Vec::new();
    for s in seqs {
        out.push(score(runner, s, 0)?.0);
    }
    Ok(json!({ "logprobs": out }))
}

fn argmax(row: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    TokenId(best as u32)
}

/// Greedy decode of `steps` tokens one at a time after `prompt`, then the same tokens
/// scored in one pass: the logprobs of the generated tokens must agree.
fn decode_vs_forward(runner: &mut CudaRunner, prompt: &[TokenId], steps: usize) -> Result<Value> {
    let table = blocks(0, (prompt.len() + steps).div_ceil(BLOCK));
    let first = ForwardBatch::single(
        prompt.to_vec(),
        0,
        table[..prompt.len().div_ceil(BLOCK)].to_vec(),
        OutputSelection::Last,
    );
    let mut logits = runner.forward(&first)?;
    let (mut tokens, mut decode_lps) = (prompt.to_vec(), Vec::new());
    for _ in 0..steps {
        let next = argmax(logits.row(0));
        decode_lps.push(logprob(&logits, 0, next)?);
        tokens.push(next);
        let pos = tokens.len() - 1;
        let batch = ForwardBatch::single(
            vec![next],
            pos,
            table[..(pos + 1).div_ceil(BLOCK)].to_vec(),
            OutputSelection::Last,
        );
        logits = runner.forward(&batch)?;
    }
    let (one_pass, _) = score(runner, &tokens, table.len() + 8)?;
    let scored = &one_pass[prompt.len() - 1..];
    let max_diff = decode_lps
        .iter()
        .zip(scored)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    Ok(
        json!({ "steps": steps, "max_abs_diff": max_diff, "generated": tokens[prompt.len()..].iter().map(|t| t.0).collect::<Vec<_>>() }),
    )
}

/// Prefix reuse: the first half forwarded into blocks A, copied to blocks B with
/// `copy_blocks`, the second half forwarded on B. Compared with one pass: the second half's
/// logits; `cached_logits` of the first half through B against the first half's own forward
/// (bitwise), and of the one pass's blocks against the one pass (bitwise).
fn prefix_and_copy(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<Value> {
    let n = tokens.len();
    let half = (n / 2) / BLOCK * BLOCK;
    let nb = n.div_ceil(BLOCK);
    let (_, one_pass) = score(runner, tokens, 0)?;
    let full = one_pass
        .iter()
        .flat_map(|l| l.as_slice().iter().copied())
        .collect::<Vec<f32>>();
    let vocab = runner.config().vocab_size;
    let a = blocks(nb + 8, half / BLOCK);
    let b = blocks(2 * nb + 16, nb);
    // The first half's own logits: what its blocks' stored hidden states must give back
    // after the copy (bitwise; the one-pass logits may differ in the last bits, as cuBLAS
    // picks its algorithm by shape).
    let first_half = runner.forward(&ForwardBatch::single(
        tokens[..half].to_vec(),
        0,
        a.clone(),
        OutputSelection::All,
    ))?;
    let copies: Vec<(BlockId, BlockId)> = a.iter().copied().zip(b.iter().copied()).collect();
    runner.copy_blocks(&copies)?;
    let rest = runner.forward(&ForwardBatch {
        tokens: tokens[half..].to_vec(),
        seqs: vec![SeqSpan {
            start: 0,
            len: n - half,
            num_cached: half,
            block_table: b.clone(),
            adapter: None,
        }],
        output: OutputSelection::All,
    })?;
    let rest_diff = rest
        .as_slice()
        .iter()
        .zip(&full[half * vocab..])
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    let cached = runner.cached_logits(&b, 0..half)?;
    let cached_mismatch = cached
        .as_slice()
        .iter()
        .zip(first_half.as_slice())
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    let same_blocks = runner.cached_logits(&blocks(0, nb), 0..n)?;
    let self_mismatch = same_blocks
        .as_slice()
        .iter()
        .zip(&full)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    Ok(json!({
        "prefix_tokens": half,
        "suffix_max_abs_logit_diff": rest_diff,
        "cached_logits_after_copy_mismatches": cached_mismatch,
        "cached_logits_mismatches": self_mismatch,
    }))
}

/// Prefill and decode throughput with simple loops: prefill of one `n`-token prompt and of
/// 8 prompts of 2,048 tokens; decode steps at several batch sizes after `n` tokens, with
/// and without CUDA graphs, and with each row's token picked on the device (greedy, or
/// drawn with top-p).
fn timing(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<Value> {
    let n = tokens.len();
    let table = blocks(0, n.div_ceil(BLOCK) + 16);
    let prefill = ForwardBatch::single(tokens.to_vec(), 0, table.clone(), OutputSelection::Last);
    runner.forward(&prefill)?;
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        runner.forward(&prefill)?;
    }
    let prefill_tps = (reps * n) as f64 / t.elapsed().as_secs_f64();
    let mut out = json!({ "prefill_tokens": n, "prefill_tok_s": prefill_tps });
    out["prefill_8x2048_tok_s"] = json!(long_prefill(runner, tokens)?);
    for batch_size in [1usize, 16, 64, 256] {
        let steps = 64;
        let per_seq = (n + steps).div_ceil(BLOCK);
        let seq_tables: Vec<Vec<BlockId>> = (0..batch_size)
            .map(|i| blocks(i * per_seq, per_seq))
            .collect();
        for t in &seq_tables {
            runner.forward(&ForwardBatch::single(
                tokens.to_vec(),
                0,
                t.clone(),
                OutputSelection::Last,
            ))?;
        }
        for graphs in [true, false] {
            runner.set_cuda_graphs(graphs);
            let t0 = Instant::now();
            for (step, &token) in tokens.iter().cycle().take(steps).enumerate() {
                runner.forward(&decode_batch(&seq_tables, token, n + step))?;
            }
            let tps = (steps * batch_size) as f64 / t0.elapsed().as_secs_f64();
            let key = if graphs { "graphs" } else { "eager" };
            out[format!("decode_b{batch_size}_{key}_tok_s")] = json!(tps);
        }
        runner.set_cuda_graphs(true);
        // The same graph steps, each row reduced to its greedy pick on the device instead
        // of copied to the host (what an engine step of greedy requests does).
        let t0 = Instant::now();
        for (step, &token) in tokens.iter().cycle().take(steps).enumerate() {
            runner.forward_greedy(&decode_batch(&seq_tables, token, n + step))?;
        }
        let tps = (steps * batch_size) as f64 / t0.elapsed().as_secs_f64();
        out[format!("decode_b{batch_size}_greedy_tok_s")] = json!(tps);
        // And each row drawn on the device with a temperature and nucleus (top-p) sampling,
        // as a chat client asks: the sampling kernel's costliest search.
        let draws: Vec<RowDraw> = (0..batch_size)
            .map(|i| {
                RowDraw::plain(RowSampling {
                    temperature: 0.8,
                    top_k: 0,
                    top_p: 0.95,
                    min_p: 0.0,
                    uniform: (i % 97) as f64 / 97.0,
                })
            })
            .collect();
        let t0 = Instant::now();
        for (step, &token) in tokens.iter().cycle().take(steps).enumerate() {
            runner.forward_sample(&decode_batch(&seq_tables, token, n + step), &draws)?;
        }
        let tps = (steps * batch_size) as f64 / t0.elapsed().as_secs_f64();
        out[format!("decode_b{batch_size}_top_p_tok_s")] = json!(tps);
    }
    out["graphs_recorded"] = json!(runner.graphs_recorded());
    Ok(out)
}

/// One decode step of every sequence in `tables`, each at position `pos` with `token`.
fn decode_batch(tables: &[Vec<BlockId>], token: TokenId, pos: usize) -> ForwardBatch {
    let seqs = tables
        .iter()
        .enumerate()
        .map(|(i, table)| SeqSpan {
            start: i,
            len: 1,
            num_cached: pos,
            block_table: table.clone(),
            adapter: None,
        })
        .collect();
    ForwardBatch {
        tokens: vec![token; tables.len()],
        seqs,
        output: OutputSelection::Last,
    }
}

/// `seqs` fresh sequences of 2,048 tokens (the prompt cycled, rotated by the sequence's
/// index) in one forward batch, on blocks `0..`.
fn long_prefill_batch(tokens: &[TokenId], seqs: usize) -> ForwardBatch {
    let len = 2048usize;
    let per_seq = len.div_ceil(BLOCK);
    let mut all = Vec::with_capacity(seqs * len);
    let mut spans = Vec::new();
    for i in 0..seqs {
        spans.push(SeqSpan {
            start: i * len,
            len,
            num_cached: 0,
            block_table: blocks(i * per_seq, per_seq),
            adapter: None,
        });
        all.extend(tokens.iter().cycle().skip(i).take(len).copied());
    }
    ForwardBatch {
        tokens: all,
        seqs: spans,
        output: OutputSelection::Last,
    }
}

/// Prefill of 8 x 2,048 tokens ([`long_prefill_batch`]) in one forward call (tokens/s,
/// best of 3).
fn long_prefill(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<f64> {
    let batch = long_prefill_batch(tokens, 8);
    runner.forward(&batch)?;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        runner.forward(&batch)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(batch.num_tokens() as f64 / best)
}

/// Teacher-forced scoring of 32 x 2,048 tokens ([`long_prefill_batch`]) in one forward
/// call: every position's log-probability of the next token, computed on the device
/// (tokens/s, best of 3).
fn long_scoring(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<f64> {
    let mut batch = long_prefill_batch(tokens, 32);
    batch.output = OutputSelection::All;
    let targets: Vec<Option<TokenId>> = batch
        .seqs
        .iter()
        .flat_map(|s| {
            let seq = &batch.tokens[s.start..s.start + s.len];
            (0..s.len).map(move |p| seq.get(p + 1).copied())
        })
        .collect();
    runner.forward_logprobs(&batch, &targets)?;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        runner.forward_logprobs(&batch, &targets)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(batch.num_tokens() as f64 / best)
}

/// Batch invariance on the device: 16 sequences (the prompt rotated by i) decode one step
/// together and each alone; how many logits differ, and by how much, with graphs and
/// without.
fn batch_invariance(runner: &mut CudaRunner, tokens: &[TokenId]) -> Result<Value> {
    let (b, n) = (16usize, tokens.len());
    let per_seq = (n + 1).div_ceil(BLOCK);
    let tables: Vec<Vec<BlockId>> = (0..b).map(|i| blocks(i * per_seq, per_seq)).collect();
    for (i, t) in tables.iter().enumerate() {
        let prompt: Vec<TokenId> = tokens.iter().cycle().skip(i).take(n).copied().collect();
        runner.forward(&ForwardBatch::single(
            prompt,
            0,
            t.clone(),
            OutputSelection::Last,
        ))?;
    }
    let mut out = json!({});
    // cuBLAS with and without graphs, then the fixed-order products (`--batch-invariant`),
    // which must give 0 mismatches, then both with the attention on tensor cores; each with
    // the time of the batched decode step.
    for (key, graphs, fixed, tensor_cores) in [
        ("graphs", true, false, false),
        ("eager", false, false, false),
        ("batch_invariant", true, true, false),
        ("tensor_cores", true, false, true),
        ("batch_invariant_tensor_cores", true, true, true),
    ] {
        runner.set_cuda_graphs(graphs);
        runner.set_batch_invariant(fixed);
        runner.set_tensor_core_attention(tensor_cores);
        let together = runner.forward(&decode_batch(&tables, tokens[0], n))?;
        let t = Instant::now();
        for _ in 0..10 {
            runner.forward(&decode_batch(&tables, tokens[0], n))?;
        }
        let step_ms = t.elapsed().as_secs_f64() * 1e2;
        let (mut mismatched, mut max_diff) = (0usize, 0.0f32);
        for (i, t) in tables.iter().enumerate() {
            let alone = runner.forward(&decode_batch(std::slice::from_ref(t), tokens[0], n))?;
            for (x, y) in together.row(i).iter().zip(alone.row(0)) {
                mismatched += (x.to_bits() != y.to_bits()) as usize;
                max_diff = max_diff.max((x - y).abs());
            }
        }
        out[key] = json!({
            "batch": b, "mismatched_logits": mismatched, "max_abs_diff": max_diff,
            "step_ms": step_ms,
        });
    }
    runner.set_cuda_graphs(true);
    runner.set_batch_invariant(false);
    runner.set_tensor_core_attention(false);
    Ok(out)
}

/// The device time per operation of `prefill` (after a warm-up: workspace growth, first
/// launches), and the rates of a prefill of 8 x 2,048 tokens and of scoring all its positions.
fn prefill_profile(
    runner: &mut CudaRunner,
    prefill: &ForwardBatch,
    prompt: &[TokenId],
) -> Result<(tandem_cuda::StepProfile, f64, f64)> {
    runner.profile_forward(prefill)?;
    let profile = runner.profile_forward(prefill)?;
    Ok((
        profile,
        long_prefill(runner, prompt)?,
        long_scoring(runner, prompt)?,
    ))
}

/// Device time per operation (CUDA events) of eager steps: a prefill of 8 x 2,048 tokens and
/// decode steps of 1, 16, 64 and 256 sequences after `prompt`; and the rates of that prefill
/// and of scoring all its positions; each with the attention on CUDA cores and on tensor
/// cores.
fn profiles(runner: &mut CudaRunner, prompt: &[TokenId]) -> Result<Value> {
    let to_json = |p: tandem_cuda::StepProfile| {
        let ops: serde_json::Map<String, Value> = p
            .ops
            .iter()
            .map(|(n, ms)| (n.to_string(), json!(ms)))
            .collect();
        json!({ "wall_ms": p.wall_ms, "device_ms": p.device_ms, "ops_ms": ops })
    };
    let mut out = json!({ "describe": runner.describe() });
    let prefill = long_prefill_batch(prompt, 8);
    // The prefill with the attention on CUDA cores (the default), then on tensor cores
    // (`--tensor-core-attention`), the blocks folding their partitions (as the runner has
    // a prefill this size) and, to weigh that choice, a block per partition.
    for (key, tensor_cores, fold_min_blocks) in [
        ("prefill_8x2048", false, None),
        ("prefill_8x2048_tensor_cores", true, None),
        (
            "prefill_8x2048_tensor_cores_per_partition",
            true,
            Some(usize::MAX),
        ),
    ] {
        runner.set_tensor_core_attention(tensor_cores);
        runner.set_tensor_core_fold_min_blocks(fold_min_blocks);
        let measured = prefill_profile(runner, &prefill, prompt);
        runner.set_tensor_core_attention(false);
        runner.set_tensor_core_fold_min_blocks(None);
        let (profile, prefill_rate, scoring_rate) = measured?;
        out[key] = to_json(profile);
        out[key]["prefill_tok_s"] = json!(prefill_rate);
        // The scoring goal: all positions' log-probabilities at the prefill's rate or near it.
        out[key]["scoring_tok_s"] = json!(scoring_rate);
    }
    let n = prompt.len();
    for b in [1usize, 16, 64, 256] {
        let per_seq = (n + 2).div_ceil(BLOCK);
        let tables: Vec<Vec<BlockId>> = (0..b).map(|i| blocks(i * per_seq, per_seq)).collect();
        for t in &tables {
            runner.forward(&ForwardBatch::single(
                prompt.to_vec(),
                0,
                t.clone(),
                OutputSelection::Last,
            ))?;
        }
        // The attention on CUDA cores (the default), then on tensor cores.
        for (key, tensor_cores) in [
            (format!("decode_b{b}"), false),
            (format!("decode_b{b}_tensor_cores"), true),
        ] {
            runner.set_tensor_core_attention(tensor_cores);
            let measured = decode_profile(runner, &tables, prompt);
            runner.set_tensor_core_attention(false);
            let (profile, graph_wall_ms) = measured?;
            out[&key] = to_json(profile);
            out[&key]["graph_wall_ms"] = json!(graph_wall_ms);
        }
    }
    Ok(out)
}

/// The device time per operation of a decode step of the sequences of `tables` after
/// `prompt` (after a warm-up), and the wall time of the same step through its graph.
fn decode_profile(
    runner: &mut CudaRunner,
    tables: &[Vec<BlockId>],
    prompt: &[TokenId],
) -> Result<(tandem_cuda::StepProfile, f64)> {
    let n = prompt.len();
    runner.profile_forward(&decode_batch(tables, prompt[0], n))?;
    let profile = runner.profile_forward(&decode_batch(tables, prompt[1], n + 1))?;
    runner.forward(&decode_batch(tables, prompt[2], n))?;
    let t = Instant::now();
    runner.forward(&decode_batch(tables, prompt[2], n))?;
    Ok((profile, t.elapsed().as_secs_f64() * 1e3))
}

fn checks(runner: &mut CudaRunner, seqs: &[Vec<TokenId>]) -> Result<Value> {
    let s = &seqs[0];
    let logprobs = device_logprobs(runner, s)?;
    let greedy = device_greedy(runner, s)?;
    let sampled = device_sample(runner, s)?;
    let tc = tensor_cores(runner, s)?;
    let decode = decode_vs_forward(runner, &s[..64.min(s.len())], 32)?;
    let prefix = prefix_and_copy(runner, s)?;
    let invariance = batch_invariance(runner, &s[..256.min(s.len())])?;
    let timing = timing(runner, &s[..512.min(s.len())])?;
    let overlap = overlap_check::overlap(runner, s)?;
    Ok(json!({
        "describe": runner.describe(), "weight_bytes": runner.weight_bytes(),
        "decode_vs_forward": decode, "prefix": prefix, "batch_invariance": invariance,
        "device_logprobs": logprobs, "device_greedy": greedy,
        "device_sample": sampled, "tensor_core_attention": tc,
        "timing": timing, "overlap": overlap,
    }))
}
