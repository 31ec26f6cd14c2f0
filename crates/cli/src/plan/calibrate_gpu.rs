//! `tandem plan --calibrate --device cuda[:N]`: a GPU profile measured on tandem's CUDA
//! runner. It starts from the datasheet profile of the GPU found
//! ([`super::hardware::for_gpu`]), times the model's own steps ([`super::step_times`]) and
//! fits the profile to them ([`super::fit_gpu::fit`]).

use anyhow::{bail, Context, Result};
use tandem_cuda::{CudaDtype, CudaRunner, KvBudget};
use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, SeqSpan, TokenId};
use tandem_model::runner::ModelRunner;

use super::fit_gpu::{self, GpuSteps};
use super::hardware::{self, HardwareProfile};
use super::shape::ModelShape;
use super::step_times;
use crate::args::ModelArgs;
use crate::bench_cmd::measure;
use crate::runner_setup::PreparedModel;

/// Decode steps per timing.
pub(super) const STEPS: usize = 16;
/// Short prompts, and the batch whose decode steps at a short and a long context (2 GB of
/// K/V on a Llama-3.2-1B) give the bandwidth.
pub(super) const SHORT: usize = 16;
pub(super) const KV_BATCH: usize = 32;
pub(super) const KV_LONG: usize = 2048;
/// Sequences of the decode steps and tokens of the prefill chunks the product rates are
/// fitted to.
pub(super) const DECODE_BATCHES: [usize; 4] = [1, 4, 16, 64];
pub(super) const PREFILL_CHUNKS: [usize; 3] = [256, 1024, 4096];
/// The prompts the long prefill is split into.
pub(super) const SPLIT: usize = 256;

/// Measures GPU `ordinal` on `args`'s model and returns its fitted profile.
pub fn calibrate(args: &ModelArgs, ordinal: usize) -> Result<HardwareProfile> {
    let found = tandem_cuda::probe()
        .context("--calibrate --device cuda needs the NVIDIA driver and a GPU")?;
    let Some(gpu) = found.devices.get(ordinal) else {
        bail!(
            "--calibrate --device cuda:{ordinal}: {} CUDA devices found",
            found.device_count()
        );
    };
    if args.dtype != CudaDtype::Bf16 {
        bail!(
            "--calibrate --device cuda measures bf16 weights and KV (the roofline's GPU \
             profile); leave out --dtype f32"
        );
    }
    let (base, matched) = hardware::for_gpu(&gpu.name, gpu.total_memory_bytes as f64);
    match matched {
        Some(b) => eprintln!(
            "tandem: {}: starting from the {b} datasheet profile",
            gpu.name
        ),
        None => eprintln!(
            "tandem: {}: no datasheet profile matches; starting from a generic GPU profile \
             ({:.0} GB), every rate from measurements",
            gpu.name,
            gpu.total_memory_bytes as f64 / 1e9
        ),
    }
    let lm = args.load()?;
    let shape = ModelShape::of_host(&lm.host);
    let long = (lm.host.config.context_len / SPLIT * SPLIT).min(PREFILL_CHUNKS[2]);
    if long < 2 * SPLIT || lm.host.config.context_len < KV_LONG + STEPS {
        bail!(
            "--calibrate --device cuda needs a model with a context of at least {} tokens",
            (KV_LONG + STEPS).max(2 * SPLIT)
        );
    }
    let PreparedModel::Cuda { host, mut options } = PreparedModel::new(lm.host, args, None)? else {
        bail!("--device cuda:{ordinal} did not prepare a CUDA model");
    };
    let block = options.block_size;
    let per_seq = |tokens: usize| tokens.div_ceil(block);
    let blocks = [
        KV_BATCH * per_seq(KV_LONG + STEPS),
        DECODE_BATCHES[3] * per_seq(SHORT + STEPS),
        (long / SPLIT) * per_seq(SPLIT + 1),
        per_seq(long + 1),
    ];
    options.kv = KvBudget::Blocks(blocks.into_iter().max().unwrap_or(1));
    let mut runner = CudaRunner::new(&host, options).context("starting the CUDA runner")?;
    eprintln!(
        "tandem: calibrating {} on {}",
        host.config.architecture.gguf_name(),
        runner.describe()
    );
    let steps = time_steps(&mut runner, long, block)?;
    let kv_dtype = runner.kv_geometry().dtype;
    let fitted = fit_gpu::fit(&base, &shape, kv_dtype, &steps);
    for note in &fitted.notes {
        eprintln!("tandem: note: {note}");
    }
    let mut p = fitted.profile;
    p.name = gpu.name.clone();
    p.source = format!(
        "tandem plan --calibrate --device cuda:{ordinal} on {} ({} layers, bf16), from {}",
        gpu.name,
        shape.num_layers,
        match matched {
            Some(b) => format!("the {b} datasheet profile"),
            None => "a generic GPU profile".into(),
        }
    );
    p.check()?;
    eprintln!(
        "tandem: calibrated {}: {:.0} GB/s, {:.1} TFLOP/s at {} tokens, step overhead {:.3} ms",
        p.name,
        p.bandwidth / 1e9,
        p.matmul.last().map_or(0.0, |r| r.flops / 1e12),
        p.matmul.last().map_or(0, |r| r.tokens),
        p.overhead_s(shape.num_layers) * 1e3
    );
    Ok(p)
}

/// Times the steps [`fit_gpu::fit`] needs; prefills of `long` tokens.
fn time_steps(runner: &mut CudaRunner, long: usize, block: usize) -> Result<GpuSteps> {
    measure(runner, 1, SHORT, 4, 8192)?; // first touch: kernels, workspace, graphs
    let decode_one = step_times::decode(runner, 1, SHORT, STEPS)?;
    let kv_short = step_times::decode(runner, KV_BATCH, SHORT, STEPS)?;
    let kv_long = step_times::decode(runner, KV_BATCH, KV_LONG, STEPS)?;
    let prefill_long = step_times::prefill(runner, 1, long)?;
    let prefill_split = step_times::prefill(runner, long / SPLIT, SPLIT)?;
    let mut products = Vec::new();
    for b in DECODE_BATCHES {
        products.push(step_times::decode(runner, b, SHORT, STEPS)?);
    }
    for n in PREFILL_CHUNKS.into_iter().filter(|&n| n < long) {
        products.push(step_times::prefill(runner, 1, n)?);
    }
    products.push(prefill_long.clone());
    Ok(GpuSteps {
        decode_one,
        kv_short,
        kv_long,
        prefill_long,
        prefill_split,
        products,
        host_s: host_part(runner, block),
    })
}

/// The host's part of a one-sequence decode step that the device does not overlap: wall
/// time less device time of a profiled step (the best of five), on the blocks (of `block`
/// slots) that [`time_steps`]'s first measurement filled.
fn host_part(runner: &mut CudaRunner, block: usize) -> Option<f64> {
    let batch = ForwardBatch {
        tokens: vec![TokenId(1)],
        seqs: vec![SeqSpan {
            start: 0,
            len: 1,
            num_cached: SHORT,
            block_table: (0..(SHORT + 1).div_ceil(block) as u32)
                .map(BlockId)
                .collect(),
            adapter: None,
        }],
        output: OutputSelection::Last,
    };
    (0..5)
        .map(|_| {
            runner
                .profile_forward(&batch)
                .ok()
                .map(|p| (p.wall_ms - p.device_ms).max(0.0) / 1e3)
        })
        .collect::<Option<Vec<f64>>>()
        .and_then(|v| v.into_iter().reduce(f64::min))
}
