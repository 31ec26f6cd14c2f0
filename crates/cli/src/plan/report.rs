//! The numbers `tandem plan` prints: KV capacity, the cost of the workload's steps, latency
//! and throughput by batch size and context, the bandwidth/compute crossover, scoring vs
//! generating, and what prefix hits and speculation save. Text for people, JSON for scripts.

use anyhow::{bail, Result};
use serde::Serialize;

use super::cost::{Roofline, StepCost};
use super::hardware::HardwareProfile;
use super::rate::RateReport;
use super::shape::ModelShape;
use super::validate::Validation;
use super::PlanInputs;

/// Batch sizes of the throughput curves.
const BATCHES: [usize; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
/// Context lengths of the decode curves.
const CONTEXTS: [usize; 5] = [128, 512, 2048, 8192, 32768];
/// Lengths for scoring vs generating.
const SCORE_LENS: [usize; 5] = [16, 64, 256, 1024, 4096];

/// The KV pool and what fits in it.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    pub kv_dtype: String,
    /// Keys and values of one token, all layers.
    pub kv_bytes_per_token: usize,
    /// What one token slot of the pool takes (K/V and the final hidden state).
    pub slot_bytes: usize,
    pub block_size: usize,
    pub budget_bytes: u64,
    /// Blocks and tokens of the pool, as the engine reports them at start-up.
    pub num_blocks: usize,
    pub capacity_tokens: usize,
    /// Blocks the workload's longest request holds at its end.
    pub blocks_per_request: usize,
    pub bytes_per_request: u64,
    /// Requests of the workload the pool holds at once (and the sequence cap allows).
    pub max_concurrent_requests: usize,
    /// Concurrency from which requests can be preempted (None: never below the cap).
    pub preemption_from: Option<usize>,
}

/// One point of a curve over batch size or context.
#[derive(Debug, Clone, Serialize)]
pub struct CurvePoint {
    pub batch: usize,
    pub context: usize,
    pub step_ms: f64,
    pub tok_per_s: f64,
    pub compute_bound: bool,
}

/// The workload's latency and throughput.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadCost {
    /// Mean over the workload's prompt lengths, and the longest prompt's.
    pub ttft_ms: f64,
    pub ttft_ms_max: f64,
    pub itl_ms: f64,
    pub output_tok_per_s: f64,
    pub decode_step: StepCost,
    pub prefill_chunk: StepCost,
}

/// Scoring `tokens` known tokens in one teacher-forced pass vs generating them.
#[derive(Debug, Clone, Serialize)]
pub struct ScoreVsGenerate {
    pub tokens: usize,
    pub score_ms: f64,
    pub generate_ms: f64,
    pub ratio: f64,
}

/// The whole plan.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub model: String,
    pub shape: ModelShape,
    pub hardware: HardwareProfile,
    pub weight_bytes_per_step: f64,
    /// Mean prompt and output lengths (the curves use them), and the lengths given.
    pub prompt_len: usize,
    pub gen_len: usize,
    pub prompt_lens: Vec<usize>,
    pub gen_lens: Vec<usize>,
    pub concurrency: usize,
    pub max_num_batched_tokens: usize,
    pub capacity: Capacity,
    pub workload: WorkloadCost,
    /// With the prefix cache holding `prefix_hit` of every prompt.
    pub prefix_hit: f64,
    pub workload_with_prefix_hit: WorkloadCost,
    /// Decode speed-up from n-gram speculation at the given acceptance, at batch 1 and at
    /// the workload's concurrency.
    pub acceptance: f64,
    pub num_speculative_tokens: usize,
    pub speculation_speedup: (f64, f64),
    /// Decode at the workload's mean context, by batch size.
    pub decode_by_batch: Vec<CurvePoint>,
    /// Prefill throughput (tokens/s) by prompts prefilled together.
    pub prefill_by_batch: Vec<CurvePoint>,
    /// Decode at the workload's concurrency, by context length.
    pub decode_by_context: Vec<CurvePoint>,
    /// Smallest decode batch that is compute-bound at the workload's mean context.
    pub crossover_batch: Option<usize>,
    pub score_vs_generate: Vec<ScoreVsGenerate>,
    pub validation: Option<Validation>,
    /// With `--request-rate`: the steady state at that rate and the saturation point
    /// (`rate.rs`); `concurrency` is then the mean number of requests in the engine.
    pub rate: Option<RateReport>,
}

impl Plan {
    pub fn compute(i: &PlanInputs) -> Result<Plan> {
        let r = Roofline {
            shape: &i.shape,
            hw: &i.hw,
            kv_dtype: i.kv_dtype,
        };
        let capacity = capacity(i)?;
        let mean_ctx = (i.prompt_len + i.gen_len / 2) as f64;
        let conc = i.concurrency.min(capacity.max_concurrent_requests.max(1));
        let max_batch = capacity.max_concurrent_requests.max(1);
        let curves = Curves::compute(&r, i, max_batch, conc);
        let k = i.num_speculative_tokens;
        let speculation_speedup = (
            r.speculation_speedup(1, mean_ctx, k, i.acceptance),
            r.speculation_speedup(conc, mean_ctx, k, i.acceptance),
        );
        Ok(Plan {
            model: i.model_name.clone(),
            shape: i.shape.clone(),
            hardware: i.hw.clone(),
            weight_bytes_per_step: i.shape.weight_bytes_per_step(i.hw.bytes_per_weight(), 1.0),
            prompt_len: i.prompt_len,
            gen_len: i.gen_len,
            prompt_lens: i.prompt_lens.clone(),
            gen_lens: i.gen_lens.clone(),
            concurrency: i.concurrency,
            max_num_batched_tokens: i.max_num_batched_tokens,
            workload: workload(&r, i, conc, 0.0),
            workload_with_prefix_hit: workload(&r, i, conc, i.prefix_hit),
            capacity,
            prefix_hit: i.prefix_hit,
            acceptance: i.acceptance,
            num_speculative_tokens: k,
            speculation_speedup,
            decode_by_batch: curves.decode_by_batch,
            prefill_by_batch: curves.prefill_by_batch,
            decode_by_context: curves.decode_by_context,
            crossover_batch: r.crossover_batch(mean_ctx, 4096),
            score_vs_generate: curves.score_vs_generate,
            validation: None,
            rate: None,
        })
    }
}

/// The pool as the engine sizes it: `budget / (slot bytes x block size)` blocks.
pub fn capacity(i: &PlanInputs) -> Result<Capacity> {
    let slot_bytes = i.shape.kv_slot_bytes(i.kv_dtype);
    let per_block = (slot_bytes * i.block_size) as u64;
    if i.kv_budget_bytes < per_block {
        bail!(
            "--kv-cache-memory {} bytes holds no block of {per_block} bytes",
            i.kv_budget_bytes
        );
    }
    let num_blocks = (i.kv_budget_bytes / per_block) as usize;
    let longest = i.prompt_lens.iter().max().unwrap_or(&i.prompt_len)
        + i.gen_lens.iter().max().unwrap_or(&i.gen_len);
    let blocks_per_request = longest.div_ceil(i.block_size);
    let fits = num_blocks / blocks_per_request;
    let max_concurrent_requests = fits.min(i.max_num_seqs);
    Ok(Capacity {
        kv_dtype: i.kv_dtype.name().into(),
        kv_bytes_per_token: i.shape.kv_bytes_per_token(i.kv_dtype),
        slot_bytes,
        block_size: i.block_size,
        budget_bytes: i.kv_budget_bytes,
        num_blocks,
        capacity_tokens: num_blocks * i.block_size,
        blocks_per_request,
        bytes_per_request: blocks_per_request as u64 * per_block,
        max_concurrent_requests,
        preemption_from: (fits < i.max_num_seqs).then_some(fits + 1),
    })
}

/// TTFT, ITL and throughput of `conc` requests cycling through prefill and decode, with
/// `hit` of every prompt already cached, over every (prompt, output) length pair of the
/// workload: TTFT its mean (and worst), output tokens per second the mean output over the
/// mean time a request takes.
fn workload(r: &Roofline<'_>, i: &PlanInputs, conc: usize, hit: f64) -> WorkloadCost {
    let mean_ctx = (i.prompt_len + i.gen_len / 2) as f64;
    let decode_step = r.decode_step(conc, mean_ctx);
    let itl = decode_step.time_s;
    let (mut ttft_sum, mut ttft_max, mut cycle_sum, mut first) = (0.0, 0f64, 0.0, None);
    for &p in &i.prompt_lens {
        let (ttft, chunk) = time_to_first_token(r, i, conc, hit, p);
        first.get_or_insert(chunk);
        ttft_max = ttft_max.max(ttft);
        for &g in &i.gen_lens {
            ttft_sum += ttft;
            // The prompt's steps, then g - 1 decode steps.
            cycle_sum += ttft + g.saturating_sub(1) as f64 * itl;
        }
    }
    let pairs = (i.prompt_lens.len() * i.gen_lens.len()).max(1) as f64;
    let mean_gen = i.gen_lens.iter().sum::<usize>() as f64 / i.gen_lens.len().max(1) as f64;
    WorkloadCost {
        ttft_ms: ttft_sum / pairs * 1e3,
        ttft_ms_max: ttft_max * 1e3,
        itl_ms: itl * 1e3,
        output_tok_per_s: conc as f64 * mean_gen / (cycle_sum / pairs),
        decode_step,
        prefill_chunk: first.unwrap_or(decode_step),
    }
}

/// Seconds to the first token of a prompt of `prompt_len` tokens, `hit` of it cached, its
/// chunks beside the other `conc - 1` requests' decodes; and its first step's cost.
pub(super) fn time_to_first_token(
    r: &Roofline<'_>,
    i: &PlanInputs,
    conc: usize,
    hit: f64,
    prompt_len: usize,
) -> (f64, StepCost) {
    let cached = ((prompt_len as f64 * hit) as usize).min(prompt_len - 1);
    let new = prompt_len - cached;
    let mean_ctx = (i.prompt_len + i.gen_len / 2) as f64;
    let riding = (conc - 1, mean_ctx);
    // A prompt's chunks, each beside the other requests' decodes.
    let budget = i.max_num_batched_tokens.max(riding.0 + 1);
    let mut done = 0;
    let mut ttft = 0.0;
    let mut first_chunk = None;
    while done < new {
        let n = (budget - riding.0).min(new - done);
        let mut seqs = vec![
            super::cost::SeqWork {
                cached: mean_ctx,
                new: 1.0,
                rows: 1.0
            };
            riding.0
        ];
        seqs.push(super::cost::SeqWork {
            cached: (cached + done) as f64,
            new: n as f64,
            rows: if done + n == new { 1.0 } else { 0.0 },
        });
        let c = r.step(&seqs);
        first_chunk.get_or_insert(c);
        ttft += c.time_s;
        done += n;
    }
    let first = first_chunk.unwrap_or_else(|| r.decode_step(1, cached as f64));
    (ttft, first)
}

/// The plan's curves over batch size, context and length.
struct Curves {
    decode_by_batch: Vec<CurvePoint>,
    prefill_by_batch: Vec<CurvePoint>,
    decode_by_context: Vec<CurvePoint>,
    score_vs_generate: Vec<ScoreVsGenerate>,
}

impl Curves {
    fn compute(r: &Roofline<'_>, i: &PlanInputs, max_batch: usize, conc: usize) -> Curves {
        let mean_ctx = (i.prompt_len + i.gen_len / 2) as f64;
        let curve = |batch: usize, context: usize| {
            let c = r.decode_step(batch, context as f64);
            CurvePoint {
                batch,
                context,
                step_ms: c.time_s * 1e3,
                tok_per_s: batch as f64 / c.time_s,
                compute_bound: c.compute_bound,
            }
        };
        let decode_by_batch = BATCHES
            .iter()
            .filter(|&&b| b <= max_batch)
            .map(|&b| curve(b, mean_ctx as usize))
            .collect();
        let prefill_by_batch = BATCHES
            .iter()
            .filter(|&&b| b <= max_batch)
            .map(|&b| {
                let t = r.prefill(b, i.prompt_len, i.max_num_batched_tokens, (0, 0.0));
                let chunk = r.step(&[super::cost::SeqWork {
                    cached: 0.0,
                    new: (b * i.prompt_len).min(i.max_num_batched_tokens) as f64,
                    rows: 1.0,
                }]);
                CurvePoint {
                    batch: b,
                    context: i.prompt_len,
                    step_ms: t * 1e3,
                    tok_per_s: (b * i.prompt_len) as f64 / t,
                    compute_bound: chunk.compute_bound,
                }
            })
            .collect();
        let decode_by_context = CONTEXTS
            .iter()
            .filter(|&&c| c <= i.shape.context_len)
            .map(|&c| curve(conc, c))
            .collect();
        let score_vs_generate = SCORE_LENS
            .iter()
            .filter(|&&n| n <= i.shape.context_len)
            .map(|&n| {
                let score = r.score(n, i.max_num_batched_tokens);
                let generate = r.decode(1, 1, n);
                ScoreVsGenerate {
                    tokens: n,
                    score_ms: score * 1e3,
                    generate_ms: generate * 1e3,
                    ratio: generate / score,
                }
            })
            .collect();
        Curves {
            decode_by_batch,
            prefill_by_batch,
            decode_by_context,
            score_vs_generate,
        }
    }
}
