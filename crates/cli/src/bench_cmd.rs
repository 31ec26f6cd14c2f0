//! `tandem bench`: prefill and decode throughput of the forward pass (README.md § generate, chat,
//! bench).
//!
//! For every (batch B, prompt length P): B sequences of P random tokens are prefilled together
//! (in steps of at most `--max-num-batched-tokens` tokens), then G decode steps run all B
//! sequences at once, each feeding back its greedy token (EOS ignored). One JSON line per
//! configuration. `--engine` (or `--speculative`) measures through the engine instead
//! (`bench_engine.rs`), with the speculative decoding counters; `--prefix-cache` measures
//! what the prefix cache saves (`bench_prefix.rs`).

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use tandem_engine::sampler::SamplingParams;
use tandem_kernels::row_max;
use tandem_model::batch::{AdapterId, BlockId, ForwardBatch, OutputSelection, SeqSpan, TokenId};
use tandem_model::runner::ModelRunner;

use crate::args::{EngineArgs, ModelArgs};
use crate::bench_engine::{self, PromptKind};
use crate::engine_setup::build_engine;
use crate::plan::shape::ModelShape;
use crate::runner_setup::PreparedModel;
use crate::structured_args::StructuredArgs;
use crate::trace_out::TracedRunner;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Sequences decoded together (repeatable).
    #[arg(long = "batch", value_name = "B", default_values_t = [1usize])]
    batches: Vec<usize>,
    /// Prompt length in tokens (repeatable).
    #[arg(long = "prompt-len", value_name = "P", default_values_t = [512usize])]
    prompt_lens: Vec<usize>,
    /// Decode steps after the prefill.
    #[arg(long, value_name = "G", default_value_t = 128)]
    gen_len: usize,
    /// Print JSON lines (the only format; accepted for the documented command line).
    #[arg(long)]
    json: bool,
    /// Measure decode through the whole engine (implied by `--speculative`, `--temperature`,
    /// a structured-output flag, `--prompt-kind copy` and `--prompt-file`); the JSON line
    /// then carries the speculative decoding counters.
    #[arg(long = "engine")]
    through_engine: bool,
    /// Prompts in engine mode (`copy` implies it): random tokens, or a random half written
    /// twice (to copy).
    #[arg(long, value_enum, default_value_t = PromptKind::Random)]
    prompt_kind: PromptKind,
    /// Engine mode (implied): every prompt is this file's text (instead of --prompt-len
    /// tokens).
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<std::path::PathBuf>,
    /// Measure the prefix cache instead: time to first token with a cached vs a cold
    /// --prompt-len prefix, and scoring 4 continuations of a context of half that length
    /// with vs without the cache (see `bench_prefix.rs`).
    #[arg(long)]
    prefix_cache: bool,
    /// Rounds per measurement in --prefix-cache mode (medians are reported).
    #[arg(long, value_name = "N", default_value_t = 5)]
    repeat: usize,
    /// Engine mode: sample with this temperature instead of taking the greedy token (0);
    /// request `s` is seeded with `s`, so a run draws the same tokens every time.
    #[arg(
        long,
        value_name = "T",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    temperature: f32,
    /// Engine mode, with --temperature: nucleus sampling's probability mass.
    #[arg(
        long,
        value_name = "P",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    top_p: f32,
    /// Engine mode, with --temperature: keep the K most likely tokens (-1 or 0: all).
    #[arg(long, value_name = "K", default_value_t = -1, allow_negative_numbers = true)]
    top_k: i32,
    /// Engine mode, with --temperature: drop tokens less likely than this fraction of the
    /// most likely one's probability (0: none).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    min_p: f32,
    /// Engine mode with structured output: every request constrained (mask time reported).
    #[command(flatten)]
    structured: StructuredArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Timings of one configuration.
pub(crate) struct Measured {
    pub prefill_s: f64,
    /// Rows of logits the prefill computed: each sequence's last token in each of its steps.
    pub prefill_rows: usize,
    pub decode_s: f64,
}

pub fn run(a: BenchArgs) -> Result<()> {
    let truncates = a.top_p != 1.0 || a.top_k > 0 || a.min_p != 0.0;
    anyhow::ensure!(
        a.temperature != 0.0 || !truncates,
        "--top-p, --top-k and --min-p shape a temperature draw: give --temperature too"
    );
    anyhow::ensure!(
        !(a.prefix_cache && a.temperature != 0.0),
        "--prefix-cache measures greedy requests: --temperature does not apply"
    );
    anyhow::ensure!(
        !(a.prefix_cache && a.model.lora.is_some()),
        "--prefix-cache measures the base model: --lora does not apply"
    );
    if a.prefix_cache {
        let (lm, target) = PreparedModel::load(&a.model, a.engine.kv_cache_dtype)?;
        let mut engine = build_engine(target, lm.eos_token_ids.clone(), &a.model, &a.engine, 0)?;
        crate::bench_prefix::run(&mut engine, &a.prompt_lens, a.repeat)?;
        return crate::trace_out::write(engine.trace(), a.engine.trace.as_deref());
    }
    // Prompts of a kind or from a file are engine-mode prompts: they imply it, as sampling
    // and speculation do.
    if a.through_engine
        || a.engine.speculative.is_some()
        || a.structured.is_set()
        || a.temperature != 0.0
        || a.prompt_kind != PromptKind::Random
        || a.prompt_file.is_some()
    {
        return run_engine(a);
    }
    let lm = a.model.load()?;
    let config = lm.host.config.clone();
    // FLOPs: the layers' products for every prompt token, the LM head for the rows of logits
    // computed (each sequence's last token in each step), and the causal attention.
    let shape = ModelShape::of_host(&lm.host);
    // Weights a decode step reads: a mixture of experts reads only the experts its tokens pick.
    let read_gb: Vec<f64> = a
        .batches
        .iter()
        .map(|&b| lm.host.weight_bytes_read(b) / 1e9)
        .collect();
    let step_tokens = a.engine.max_num_batched_tokens.unwrap_or(8192).max(1);
    let block_size = a.engine.block_size as usize;
    let mut pool_blocks = 1;
    for &b in &a.batches {
        for &p in &a.prompt_lens {
            anyhow::ensure!(b > 0 && p > 0, "--batch and --prompt-len must be positive");
            anyhow::ensure!(
                p + a.gen_len <= config.context_len,
                "prompt length {p} + gen length {} exceeds the context length {}",
                a.gen_len,
                config.context_len
            );
            pool_blocks = pool_blocks.max(b * (p + a.gen_len).div_ceil(block_size));
        }
    }
    // One runner whose pool holds the largest configuration; each uses blocks `0..`.
    let mut prepared = PreparedModel::new(lm.host, &a.model, a.engine.kv_cache_dtype)?;
    prepared.add_adapters(&a.model)?;
    let adapter = a.model.adapter()?;
    let kv_dtype = prepared.kv_dtype();
    let kernels = prepared.kernels_name();
    let runner = prepared.into_runner(block_size, Some(pool_blocks))?;
    let mut runner = TracedRunner::wrap(runner, a.engine.trace.as_deref(), a.engine.trace_steps);
    for (&b, &weights_gb) in a.batches.iter().zip(&read_gb) {
        for &p in &a.prompt_lens {
            let m = measure_with(runner.as_mut(), (b, p, a.gen_len), step_tokens, adapter)?;
            // Every decode step reads each sequence's keys and values over its context
            // (`p + step + 1` positions): on average `p + (g + 1) / 2`.
            let c = &config;
            let kv_bytes_per_pos = (2 * c.num_layers * kv_dtype.row_bytes(c.kv_dim())) as f64;
            let kv_gb =
                b as f64 * (p as f64 + (a.gen_len as f64 + 1.0) / 2.0) * kv_bytes_per_pos / 1e9;
            let steps_per_s = a.gen_len as f64 / m.decode_s;
            let (bf, pf) = (b as f64, p as f64);
            let prefill_flops = shape.matmul_flops(bf * pf, m.prefill_rows as f64)
                + bf * shape.attention_flops(0.0, pf);
            println!(
                "{}",
                json!({
                    "batch": b, "prompt_len": p, "gen_len": a.gen_len, "threads": a.model.threads(),
                    "prefill_tok_per_s": (b * p) as f64 / m.prefill_s,
                    "decode_tok_per_s": (b * a.gen_len) as f64 / m.decode_s,
                    "prefill_s": m.prefill_s, "decode_s": m.decode_s,
                    "prefill_gflop_per_s": prefill_flops / m.prefill_s / 1e9,
                    "decode_weight_gb_per_s": weights_gb * steps_per_s,
                    "decode_kv_gb_per_s": kv_gb * steps_per_s,
                    "decode_total_gb_per_s": (weights_gb + kv_gb) * steps_per_s,
                    "kv_dtype": kv_dtype.name(), "kernels": kernels,
                    "device": runner.describe(),
                })
            );
        }
    }
    drop(runner); // a traced runner writes its trace
    Ok(())
}

/// Engine mode: one JSON line per (B, P) through [`bench_engine::run`].
fn run_engine(a: BenchArgs) -> Result<()> {
    let (lm, target) = PreparedModel::load(&a.model, a.engine.kv_cache_dtype)?;
    let text = match &a.prompt_file {
        Some(f) => Some(std::fs::read_to_string(f).with_context(|| format!("{}", f.display()))?),
        None => None,
    };
    let file_prompt: Option<Vec<TokenId>> = match &text {
        Some(t) => Some(
            lm.tokenizer
                .encode(t, true)?
                .into_iter()
                .map(TokenId)
                .collect(),
        ),
        None => None,
    };
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        min_p: a.min_p,
        constraint: a.structured.compile(&lm.tokenizer)?,
        ..SamplingParams::greedy()
    };
    let mut engine = build_engine(target, lm.eos_token_ids.clone(), &a.model, &a.engine, 0)?;
    let adapter = a.model.adapter()?;
    let vocab = engine.model_config().vocab_size;
    sampling
        .validate(vocab)
        .map_err(|e| anyhow::anyhow!("sampling settings: {e}"))?;
    for &b in &a.batches {
        for &p in &a.prompt_lens {
            anyhow::ensure!(b > 0 && p > 0, "--batch and --prompt-len must be positive");
            let prompts: Vec<Vec<TokenId>> = (0..b)
                .map(|s| match &file_prompt {
                    Some(fp) => fp.clone(),
                    None => bench_engine::prompt(a.prompt_kind, s, p, vocab),
                })
                .collect();
            let prompt_len = prompts[0].len();
            let r = bench_engine::run(&mut engine, prompts, a.gen_len, (&sampling, adapter))?;
            let mut line = json!({
                "mode": "engine", "batch": b, "prompt_len": prompt_len, "gen_len": a.gen_len,
                "threads": a.model.threads(),
                "prompt_kind": if a.prompt_file.is_some() { "file" } else { a.prompt_kind.name() },
                "speculative": a.engine.speculative,
                "constrained": sampling.constraint.is_some(),
                "temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k,
                "min_p": a.min_p,
                "num_speculative_tokens": engine.speculation().map(|s| s.config().num_tokens),
            });
            if let (Some(o), Some(extra)) =
                (line.as_object_mut(), bench_engine::report(&r).as_object())
            {
                o.extend(extra.clone());
            }
            println!("{line}");
        }
    }
    crate::trace_out::write(engine.trace(), a.engine.trace.as_deref())?;
    Ok(())
}

/// Deterministic pseudo-random prompt tokens (SplitMix64).
pub(crate) fn prompt_tokens(seq: usize, len: usize, vocab: usize) -> Vec<TokenId> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(seq as u64 + 1);
    (0..len)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            TokenId(((z ^ (z >> 31)) % vocab as u64) as u32)
        })
        .collect()
}

/// Prefill of `b` random prompts of `p` tokens, then `g` decode steps of all `b`, on blocks
/// `0..` of `runner`'s pool.
pub(crate) fn measure(
    runner: &mut dyn ModelRunner,
    b: usize,
    p: usize,
    g: usize,
    step_tokens: usize,
) -> Result<Measured> {
    measure_with(runner, (b, p, g), step_tokens, None)
}

/// [`measure`] of `(b, p, g)` with every sequence running with LoRA `adapter`.
fn measure_with(
    runner: &mut dyn ModelRunner,
    (b, p, g): (usize, usize, usize),
    step_tokens: usize,
    adapter: Option<AdapterId>,
) -> Result<Measured> {
    let blocks_per_seq = (p + g).div_ceil(runner.kv_geometry().block_size);
    let vocab = runner.config().vocab_size;
    let tables: Vec<Vec<BlockId>> = (0..b)
        .map(|s| {
            (s * blocks_per_seq..(s + 1) * blocks_per_seq)
                .map(|i| BlockId(i as u32))
                .collect()
        })
        .collect();
    let prompts: Vec<Vec<TokenId>> = (0..b).map(|s| prompt_tokens(s, p, vocab)).collect();
    // Prefill: pack (sequence, range) pieces into steps of at most `step_tokens` tokens.
    let started = Instant::now();
    let mut next = vec![TokenId(0); b];
    let mut done = vec![0usize; b];
    let mut prefill_rows = 0;
    while done.iter().any(|&d| d < p) {
        let mut batch = ForwardBatch {
            tokens: Vec::new(),
            seqs: Vec::new(),
            output: OutputSelection::Last,
        };
        let mut finishing = Vec::new();
        for s in 0..b {
            let room = step_tokens - batch.tokens.len();
            if done[s] == p || room == 0 {
                continue;
            }
            let n = room.min(p - done[s]);
            batch.seqs.push(SeqSpan {
                start: batch.tokens.len(),
                len: n,
                num_cached: done[s],
                block_table: tables[s].clone(),
                adapter,
            });
            batch
                .tokens
                .extend_from_slice(&prompts[s][done[s]..done[s] + n]);
            done[s] += n;
            finishing.push((s, done[s] == p));
        }
        prefill_rows += batch.seqs.len();
        let picks = greedy_step(runner, &batch)?;
        for (row, &(s, finished)) in finishing.iter().enumerate() {
            if finished {
                next[s] = picks[row];
            }
        }
    }
    let prefill_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    for step in 0..g {
        let batch = ForwardBatch {
            tokens: next.clone(),
            seqs: (0..b)
                .map(|s| SeqSpan {
                    start: s,
                    len: 1,
                    num_cached: p + step,
                    block_table: tables[s].clone(),
                    adapter,
                })
                .collect(),
            output: OutputSelection::Last,
        };
        next = greedy_step(runner, &batch)?;
    }
    Ok(Measured {
        prefill_s,
        prefill_rows,
        decode_s: started.elapsed().as_secs_f64(),
    })
}

/// The greedy token of every output row of one step. A runner that reduces rows where its
/// logits are (a GPU) returns the picks, as an engine step of greedy requests asks it to;
/// otherwise the logits' argmax (the engine's vectorized greedy pick), so that a CPU step costs
/// what llama.cpp's benchmark measures: the forward pass alone.
fn greedy_step(runner: &mut dyn ModelRunner, batch: &ForwardBatch) -> Result<Vec<TokenId>> {
    if runner.samples_rows() {
        return runner
            .forward_greedy_tokens(batch)?
            .into_iter()
            .map(|t| t.context("non-finite logits"))
            .collect();
    }
    let logits = runner.forward(batch)?;
    let picks = (0..logits.num_rows())
        .map(|r| {
            let (token, _) = row_max::greedy(logits.row(r)).context("non-finite logits")?;
            Ok(TokenId(token as u32))
        })
        .collect();
    runner.recycle_logits(logits);
    picks
}
