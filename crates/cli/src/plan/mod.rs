//! `tandem plan`: what a workload costs before it runs (README.md § What does my workload
//! cost?). From a model's shapes and bytes ([`shape`]), a hardware profile ([`hardware`],
//! measured by [`calibrate`] or a built-in datasheet one) and the roofline of an engine step
//! ([`cost`]), it predicts the KV capacity, each step's bytes, FLOPs and time, and from those
//! time to first token, inter-token latency and throughput by batch size and context
//! ([`report`]); given a request rate instead of a concurrency, the steady state the engine
//! reaches and the highest rate it sustains ([`rate`]); it draws them as SVG ([`svg`]) and
//! checks itself against `tandem bench` ([`validate`]).

pub mod calibrate;
pub mod calibrate_gpu;
pub mod cost;
pub mod fit_gpu;
pub mod hardware;
pub mod rate;
#[cfg(test)]
mod rate_sim;
pub mod report;
pub mod shape;
pub mod step_times;
pub mod svg;
pub mod text;
pub mod validate;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem_model::kv_store::KvDtype;

use crate::args::{Device, EngineArgs, ModelArgs};
use crate::engine_setup::parse_size;
use hardware::{DeviceKind, HardwareProfile};
use shape::ModelShape;

/// Default KV budget, as the engine's.
const DEFAULT_KV_BYTES: u64 = 2 << 30;
/// Profiles saved by `--calibrate`, in the cache directory.
const CALIBRATION_FILE: &str = "hardware-calibration.json";

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Plan a model known only by its Hugging Face config.json (no weights needed).
    #[arg(long, value_name = "FILE", conflicts_with = "model")]
    config: Option<PathBuf>,
    /// With --config: bits per stored weight on the CPU (16 bf16, 8.5 Q8_0, 5 Q4_1, 4.5 Q4_0).
    #[arg(long, value_name = "BITS", default_value_t = 16.0)]
    bits_per_weight: f64,
    /// Prompt tokens per request: a number, or several (`128,512,2048`), equally likely.
    #[arg(long, value_name = "P[,P..]", default_value = "512")]
    prompt_len: Lengths,
    /// Generated tokens per request: a number, or several, equally likely.
    #[arg(long, value_name = "G[,G..]", default_value = "128")]
    gen_len: Lengths,
    /// Requests running at once.
    #[arg(long, value_name = "C", default_value_t = 8)]
    concurrency: usize,
    /// Requests per second, arriving as a Poisson process (instead of --concurrency): the
    /// steady state the engine reaches and the highest rate it sustains.
    #[arg(long, value_name = "R", conflicts_with = "concurrency")]
    request_rate: Option<f64>,
    /// Share of each prompt found in the prefix cache (0 to 1).
    #[arg(long, value_name = "R", default_value_t = 0.0)]
    prefix_hit: f64,
    /// Probability that a speculative draft token is accepted (n-gram drafts, 0 to 1).
    #[arg(long, value_name = "A", default_value_t = 0.6)]
    acceptance: f64,
    /// A built-in profile (h100, h200, a100, l4, rtx4090) or a profile file; default: this
    /// machine's calibration (run --calibrate once first; with --device cuda, the GPU
    /// profile calibrated last).
    #[arg(long, value_name = "NAME|FILE")]
    hardware: Option<String>,
    /// Measure this machine (under a minute) and save its profiles in the cache directory
    /// (or --save FILE), then plan with them. With --device cuda[:N]: the GPU, fitted to the
    /// model's own steps on the CUDA runner, saved next to the CPU profiles.
    #[arg(long)]
    calibrate: bool,
    /// Where --calibrate writes its profiles.
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
    /// Print JSON instead of the text report.
    #[arg(long)]
    json: bool,
    /// Write the JSON report to this file as well.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Write SVG charts into this directory (throughput.svg, memory.svg, validate.svg).
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,
    /// Run `tandem bench` over a grid and print predicted vs measured throughput.
    #[arg(long)]
    validate: bool,
    /// With --validate: a small grid (about a minute) instead of the full one.
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Lengths of a workload's requests: one or several values, equally likely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lengths(pub Vec<usize>);

impl Lengths {
    /// The mean, rounded.
    pub fn mean(&self) -> usize {
        let sum: usize = self.0.iter().sum();
        (sum as f64 / self.0.len() as f64).round() as usize
    }
}

impl std::str::FromStr for Lengths {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Lengths, String> {
        let values: Vec<usize> = s
            .split(',')
            .map(|v| match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("`{v}` is not a positive number of tokens")),
            })
            .collect::<std::result::Result<_, _>>()?;
        if values.len() > 64 {
            return Err("at most 64 lengths".into());
        }
        Ok(Lengths(values))
    }
}

/// Everything a plan is computed from.
#[derive(Debug)]
pub struct PlanInputs {
    pub model_name: String,
    pub shape: ModelShape,
    pub hw: HardwareProfile,
    pub kv_dtype: KvDtype,
    pub kv_budget_bytes: u64,
    pub block_size: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// The workload's prompt and output lengths (equally likely), and their means.
    pub prompt_lens: Vec<usize>,
    pub gen_lens: Vec<usize>,
    pub prompt_len: usize,
    pub gen_len: usize,
    pub concurrency: usize,
    pub prefix_hit: f64,
    pub acceptance: f64,
    pub num_speculative_tokens: usize,
}

pub fn run(a: PlanArgs) -> Result<()> {
    check_ranges(&a)?;
    // A GPU's profile and the plan's prices are those of its default numbers; the other
    // formats are not modelled (rather than priced as bf16).
    let (weights, dtype) = (a.model.cuda_weights, a.model.dtype);
    if weights != tandem_cuda::CudaWeights::Dense {
        bail!(
            "--cuda-weights {}: tandem plan prices a CUDA device's dense bf16 weights only",
            weights.name()
        );
    }
    if dtype != tandem_cuda::CudaDtype::Bf16 {
        bail!(
            "--dtype {}: tandem plan prices a CUDA device's bf16 numbers only",
            dtype.name()
        );
    }
    let cache = tandem_model::default_model::cache_dir(a.model.cache_dir.as_deref())?;
    let threads = a.model.threads();
    let gpu = matches!(a.model.device, Device::Cuda(_));
    let calibration = a
        .save
        .clone()
        .filter(|_| a.calibrate)
        .unwrap_or_else(|| cache.join(CALIBRATION_FILE));
    if a.calibrate {
        let c = match a.model.device {
            Device::Cuda(n) => {
                if a.config.is_some() {
                    bail!(
                        "--calibrate --device cuda times the model's own steps: give --model, \
                         not --config"
                    );
                }
                // Next to the CPU profiles already saved there.
                let mut c = if calibration.exists() {
                    read_calibration(&calibration)?
                } else {
                    calibrate::Calibration {
                        profiles: Vec::new(),
                    }
                };
                c.put_gpu(calibrate_gpu::calibrate(&a.model, n)?);
                c
            }
            Device::Auto | Device::Cpu => {
                let mut c = calibrate::calibrate(threads);
                if a.config.is_none() {
                    overhead_from_model(&a, &mut c)?;
                }
                // GPU profiles saved there before stay.
                if let Ok(old) = read_calibration(&calibration) {
                    let gpus = old
                        .profiles
                        .into_iter()
                        .filter(|p| p.kind == DeviceKind::Gpu);
                    c.profiles.extend(gpus);
                }
                c
            }
        };
        let path = &calibration;
        std::fs::create_dir_all(path.parent().unwrap_or(std::path::Path::new(".")))?;
        std::fs::write(path, serde_json::to_string_pretty(&c)?)
            .with_context(|| path.display().to_string())?;
        eprintln!("tandem: hardware profiles saved to {}", path.display());
    }
    let hw = match &a.hardware {
        Some(h) => match hardware::builtin(h) {
            Some(p) => p,
            None => saved_profile(std::path::Path::new(h), threads, gpu)?,
        },
        None => saved_profile(&calibration, threads, gpu)?,
    };
    let (model_name, shape, packs, host) = load_shape(&a)?;
    if hw.kind == DeviceKind::Gpu && shape.experts > 0 {
        eprintln!(
            "tandem: note: this plan prices the experts' products at the dense products' \
             calibrated rate for as many rows as an expert sees; tandem's CUDA runner runs \
             them with its own tensor-core kernel, whose rate is not calibrated yet"
        );
    }
    let kv_dtype = match (a.engine.kv_cache_dtype, hw.kind) {
        (Some(KvDtype::Q8), DeviceKind::Gpu) => {
            bail!("--kv-cache-dtype q8: only the CPU stores an 8-bit KV cache")
        }
        (Some(KvDtype::Q8), DeviceKind::Cpu) => bail!(
            "--kv-cache-dtype q8: the plan does not price it yet (its cost model reads bytes, \
             and q8's decode attention is bound by dequantizing, not by its bytes; see \
             BENCHMARKS.md)"
        ),
        (Some(d), _) => d,
        (None, DeviceKind::Gpu) => KvDtype::Bf16,
        (None, DeviceKind::Cpu) if packs && !a.model.cpu_kernels()?.is_exact() => KvDtype::F16,
        (None, DeviceKind::Cpu) => KvDtype::F32,
    };
    let kv_budget_bytes = match &a.engine.kv_cache_memory {
        Some(s) => parse_size(s).context("--kv-cache-memory")?,
        None if hw.kind == DeviceKind::Gpu => gpu_kv_budget(&a, &hw, &shape)?,
        None => DEFAULT_KV_BYTES,
    };
    let mut inputs = PlanInputs {
        model_name,
        shape,
        hw,
        kv_dtype,
        kv_budget_bytes,
        block_size: a.engine.block_size as usize,
        max_num_seqs: a.engine.max_num_seqs.unwrap_or(256),
        max_num_batched_tokens: a.engine.max_num_batched_tokens.unwrap_or(2048),
        prompt_lens: a.prompt_len.0.clone(),
        gen_lens: a.gen_len.0.clone(),
        prompt_len: a.prompt_len.mean(),
        gen_len: a.gen_len.mean(),
        concurrency: a.concurrency,
        prefix_hit: a.prefix_hit,
        acceptance: a.acceptance,
        num_speculative_tokens: a.engine.num_speculative_tokens.unwrap_or(4),
    };
    let rate = match a.request_rate {
        Some(r) => {
            let capacity = report::capacity(&inputs)?;
            let rate = rate::RateReport::solve(&inputs, &capacity, r);
            inputs.concurrency = rate.concurrency(&capacity);
            if !rate.stable {
                eprintln!(
                    "tandem: {} is more than the engine sustains: the queue grows without \
                     bound: at most {}",
                    rate::req_per_s(r),
                    rate::req_per_s(rate.saturation.request_rate)
                );
            }
            Some(rate)
        }
        None => None,
    };
    let mut plan = report::Plan::compute(&inputs)?;
    plan.rate = rate;
    if a.validate {
        let host = host.context("--validate needs a model on disk (not --config)")?;
        plan.validation = Some(validate::run(host, &a.model, &inputs, a.quick)?);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", plan.text());
    }
    if let Some(path) = &a.output {
        std::fs::write(path, serde_json::to_string_pretty(&plan)?)
            .with_context(|| path.display().to_string())?;
    }
    if let Some(dir) = &a.svg {
        svg::write_all(dir, &plan)?;
    }
    Ok(())
}

/// The KV pool a GPU gives by default, as the CUDA runner sizes it: the share of its memory
/// `--gpu-memory-utilization` allows, less the bf16 weights.
fn gpu_kv_budget(a: &PlanArgs, hw: &HardwareProfile, shape: &ModelShape) -> Result<u64> {
    let weights = shape.resident_weight_bytes(hw.bytes_per_weight());
    let free = a.model.gpu_memory_utilization * hw.memory_bytes - weights;
    if free < 1.0 {
        bail!(
            "the weights ({:.1} GB) leave no KV cache in {:.0}% of the {}'s {:.0} GB",
            weights / 1e9,
            a.model.gpu_memory_utilization * 100.0,
            hw.name,
            hw.memory_bytes / 1e9
        );
    }
    Ok(free as u64)
}

/// Fits the profile for `--threads` to the model's own steps (see
/// [`calibrate::fit_to_model`]).
fn overhead_from_model(a: &PlanArgs, c: &mut calibrate::Calibration) -> Result<()> {
    let threads = a.model.threads();
    let Some(hw) = c.profiles.iter_mut().find(|p| p.threads == threads) else {
        return Ok(());
    };
    let lm = a.model.load()?;
    let shape = ModelShape::of_host(&lm.host);
    let prepared = crate::runner_setup::PreparedModel::new(lm.host, &a.model, None)?;
    let mut runner = prepared.into_runner(16, Some(64))?;
    calibrate::fit_to_model(runner.as_mut(), &shape, hw)?;
    hw.source.push_str(", fitted to the model's own steps");
    eprintln!(
        "tandem: step overhead {:.2} ms ({} layers)",
        hw.overhead_s(shape.num_layers) * 1e3,
        shape.num_layers
    );
    Ok(())
}

fn check_ranges(a: &PlanArgs) -> Result<()> {
    if a.concurrency == 0 {
        bail!("--concurrency must be positive");
    }
    if let Some(r) = a.request_rate {
        if !(r.is_finite() && r > 0.0) {
            bail!("--request-rate {r} must be a positive number of requests per second");
        }
    }
    for (name, v) in [
        ("--prefix-hit", a.prefix_hit),
        ("--acceptance", a.acceptance),
    ] {
        if !(0.0..=1.0).contains(&v) {
            bail!("{name} {v} must be between 0 and 1");
        }
    }
    if !(a.bits_per_weight > 0.0 && a.bits_per_weight <= 32.0) {
        bail!("--bits-per-weight {} must be in (0, 32]", a.bits_per_weight);
    }
    Ok(())
}

/// A saved profile: one profile, or a calibration (the CPU profile for `threads` threads,
/// or with `gpu` the GPU profile calibrated last).
fn saved_profile(path: &std::path::Path, threads: usize, gpu: bool) -> Result<HardwareProfile> {
    if path.exists() && HardwareProfile::load(&path.display().to_string()).is_ok() {
        return HardwareProfile::load(&path.display().to_string());
    }
    if !path.exists() {
        bail!(
            "no hardware profile: run `tandem plan --calibrate{}` once (saves {}), or pass \
             --hardware h100|h200|a100|l4|rtx4090|FILE",
            if gpu { " --device cuda" } else { "" },
            path.display()
        );
    }
    let c = read_calibration(path)?;
    let p = if gpu {
        c.gpu().with_context(|| {
            format!(
                "{} holds no GPU profile: run `tandem plan --calibrate --device cuda` on the GPU",
                path.display()
            )
        })?
    } else {
        c.for_threads(threads)
            .with_context(|| format!("{} holds no profile", path.display()))?
    };
    p.check()?;
    Ok(p.clone())
}

/// A calibration file.
fn read_calibration(path: &std::path::Path) -> Result<calibrate::Calibration> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a hardware profile or calibration",
            path.display()
        )
    })
}

/// The model's name and shape; whether its matrices pack for the int8 kernels; the loaded
/// model when one was loaded.
fn load_shape(
    a: &PlanArgs,
) -> Result<(
    String,
    ModelShape,
    bool,
    Option<tandem_model::host_model::HostModel>,
)> {
    if let Some(path) = &a.config {
        let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
        let info = tandem_model::hf_config::parse_hf_config(&text, None)
            .with_context(|| format!("{} is not a supported config.json", path.display()))?;
        let shape = ModelShape::of_config(&info.config, a.bits_per_weight);
        return Ok((
            path.display().to_string(),
            shape,
            a.bits_per_weight < 16.0,
            None,
        ));
    }
    let lm = a.model.load()?;
    let host = lm.host;
    let q = host.weights.layers.first().map(|l| l.q);
    let packs =
        q.is_some_and(|h| tandem_kernels::PackedMatrix::packs(host.tensors.by_handle(h).dtype));
    let name = lm.path.file_name().map_or_else(
        || lm.path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    Ok((name, ModelShape::of_host(&host), packs, Some(host)))
}

#[cfg(test)]
mod tests {
    use super::Lengths;

    #[test]
    fn lengths_parse_one_or_several_positive_values() {
        assert_eq!("512".parse::<Lengths>(), Ok(Lengths(vec![512])));
        let l: Lengths = "100, 300".parse().expect("two lengths");
        assert_eq!((l.0.clone(), l.mean()), (vec![100, 300], 200));
        for bad in ["", "0", "12,x", "-3"] {
            assert!(bad.parse::<Lengths>().is_err(), "{bad}");
        }
    }
}
