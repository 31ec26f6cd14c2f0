//! Flags shared by the subcommands: which model, where to cache it, and the engine settings.

use std::path::PathBuf;

use clap::Args;
use tandem_model::kv_store::KvDtype;

/// Which model to run and on how many threads.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A GGUF file or a Hugging Face model directory; omitted: the default model
    /// (SmolLM2-135M-Instruct Q4_1), fetched once into the cache directory.
    #[arg(long, value_name = "M")]
    pub model: Option<PathBuf>,
    /// Where the default model is cached (default: $TANDEM_CACHE_DIR, else
    /// $XDG_CACHE_HOME/tandem, else ~/.cache/tandem).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Kernel threads (default: the number of physical cores).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
    /// Kernel variant: avx512-int8 / avx2-int8 (activations rounded to 8 bits, as llama.cpp
    /// does; the default where the CPU has them), or scalar, avx2, avx512 (the exact fp32
    /// path, bitwise equal to each other).
    #[arg(long, value_name = "ISA")]
    pub kernels: Option<tandem_kernels::isa::Isa>,
    /// Where the model runs: `auto` (a CUDA GPU when a driver and a device are found, else
    /// the CPU), `cpu`, `cuda` or `cuda:N`.
    #[arg(long, value_name = "DEVICE", default_value = "auto", value_parser = parse_device)]
    pub device: Device,
    /// Numbers on a CUDA device: bf16 weights and KV cache (fp32 accumulation), or f32 (TF32
    /// off: the exact mode for checks).
    #[arg(long, value_name = "DTYPE", default_value = "bf16", value_parser = parse_cuda_dtype)]
    pub dtype: tandem_cuda::CudaDtype,
    /// Fraction of the GPU's memory this process may use (weights, activations and the KV
    /// pool, which gets what is left), as in vLLM; used unless --kv-cache-memory is given.
    #[arg(long, value_name = "F", default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// On CUDA, launch every kernel of a decode step from the host instead of replaying the
    /// step's recorded CUDA graph (slower; for comparison and debugging).
    #[arg(long)]
    pub no_cuda_graphs: bool,
    /// On CUDA, compute matrix products with tandem's fixed-order kernel instead of cuBLAS,
    /// so that a request's logits are bitwise the same whatever else is in its batch (as
    /// they always are on the CPU); slower.
    #[arg(long)]
    pub batch_invariant: bool,
    /// How a CUDA device stores the layers' matrices: `dense` (in --dtype), `q8_0` (int8
    /// codes and a scale per 32 values, quantized on load: about half the bytes of bf16) or
    /// `q4_1` (4-bit codes with a scale and a minimum per 32 values, the CPU's Q4_1: under a
    /// third of bf16's bytes); decode steps read the codes straight.
    #[arg(long, value_name = "FORMAT", default_value = "dense", value_parser = parse_cuda_weights)]
    pub cuda_weights: tandem_cuda::CudaWeights,
    /// On CUDA with bf16, run the attention of every step on tensor cores (meant for faster
    /// prefill; decode stays bitwise equal to scoring; rounds differently from the default
    /// kernel). Off unless given.
    #[arg(long)]
    pub tensor_core_attention: bool,
    /// LoRA adapters (PEFT directories: adapter_config.json, adapter_model.safetensors) to
    /// load beside the model, as NAME=PATH, one or more; they run on the CPU. `serve`
    /// answers a request whose `model` is NAME with that adapter; the other commands run
    /// every request with the one `--lora` names.
    #[arg(long = "lora-modules", value_name = "NAME=PATH", num_args = 1.., value_parser = parse_lora_module)]
    pub lora_modules: Vec<(String, PathBuf)>,
    /// The adapter of `--lora-modules` every request of score, generate, chat and bench runs
    /// with (serve picks adapters by the request's `model`).
    #[arg(long, value_name = "NAME")]
    pub lora: Option<String>,
    /// How adapters are held: `auto` (as stored, `B` in f32: PEFT's arithmetic) or `bf16`
    /// (both matrices rounded once to bf16: half the bytes a step reads, vLLM's
    /// `--lora-dtype bfloat16`).
    #[arg(long, value_enum, default_value_t = LoraDtypeArg::Auto)]
    pub lora_dtype: LoraDtypeArg,
}

/// `--lora-dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoraDtypeArg {
    Auto,
    #[value(alias = "bfloat16")]
    Bf16,
}

impl From<LoraDtypeArg> for tandem_model::lora::LoraDtype {
    fn from(d: LoraDtypeArg) -> Self {
        match d {
            LoraDtypeArg::Auto => tandem_model::lora::LoraDtype::Auto,
            LoraDtypeArg::Bf16 => tandem_model::lora::LoraDtype::Bf16,
        }
    }
}

fn parse_lora_module(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("{s:?} is not NAME=PATH")),
    }
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Auto,
    Cpu,
    Cuda(usize),
}

fn parse_device(s: &str) -> Result<Device, String> {
    match s {
        "auto" => Ok(Device::Auto),
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| format!("unknown device {s:?} (auto, cpu, cuda or cuda:N)")),
    }
}

fn parse_cuda_dtype(s: &str) -> Result<tandem_cuda::CudaDtype, String> {
    match s {
        "bf16" => Ok(tandem_cuda::CudaDtype::Bf16),
        "f32" => Ok(tandem_cuda::CudaDtype::F32),
        other => Err(format!("unknown dtype {other:?} (bf16 or f32)")),
    }
}

fn parse_cuda_weights(s: &str) -> Result<tandem_cuda::CudaWeights, String> {
    match s {
        "dense" => Ok(tandem_cuda::CudaWeights::Dense),
        "q8_0" => Ok(tandem_cuda::CudaWeights::Q8_0),
        "q4_1" => Ok(tandem_cuda::CudaWeights::Q4_1),
        other => Err(format!(
            "unknown weight format {other:?} (dense, q8_0 or q4_1)"
        )),
    }
}

impl ModelArgs {
    pub fn threads(&self) -> usize {
        self.threads
            .map_or_else(tandem_kernels::cpu::physical_cores, |t| t as usize)
    }

    /// Checks `--kernels`, finds the model (fetching the default one if needed) and loads it.
    pub fn load(&self) -> anyhow::Result<tandem_model::loader::LoadedModel> {
        use anyhow::Context;
        let path = self.path()?;
        tandem_model::loader::load_model(&path)
            .with_context(|| format!("loading {}", path.display()))
    }

    /// The model file or directory `--model` names (the default model fetched once into
    /// the cache), after checking that this CPU runs the `--kernels` asked for.
    pub fn path(&self) -> anyhow::Result<std::path::PathBuf> {
        self.cpu_kernels()?;
        let cache = tandem_model::default_model::cache_dir(self.cache_dir.as_deref())?;
        Ok(tandem_model::default_model::resolve_model(
            self.model.as_deref(),
            &cache,
        )?)
    }

    /// The adapter `--lora` names: its index among `--lora-modules`.
    pub fn adapter(&self) -> anyhow::Result<Option<tandem_model::batch::AdapterId>> {
        let Some(name) = &self.lora else {
            return Ok(None);
        };
        match self.lora_modules.iter().position(|(n, _)| n == name) {
            Some(i) => Ok(Some(tandem_model::batch::AdapterId(i as u32))),
            None => anyhow::bail!("--lora {name}: no adapter of that name in --lora-modules"),
        }
    }

    /// The CPU kernel variant: `--kernels` if this CPU can run it, else the best it can.
    pub fn cpu_kernels(&self) -> anyhow::Result<tandem_kernels::Isa> {
        match self.kernels {
            Some(isa) if !isa.is_available() => {
                anyhow::bail!("--kernels {isa}: this CPU cannot run the {isa} kernels")
            }
            Some(isa) => Ok(isa),
            None => Ok(tandem_kernels::Isa::best()),
        }
    }
}

/// Engine settings, accepted by every subcommand with the same meaning as for `serve`.
/// A single scoring pass uses `--block-size` and `--max-model-len`; the batching,
/// caching and speculation settings matter once many requests share the engine.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// Most sequences in one engine step.
    #[arg(long, value_name = "N")]
    pub max_num_seqs: Option<usize>,
    /// Most tokens in one engine step.
    #[arg(long, value_name = "N")]
    pub max_num_batched_tokens: Option<usize>,
    /// Memory for the KV cache, e.g. 2GiB.
    #[arg(long, value_name = "SIZE")]
    pub kv_cache_memory: Option<String>,
    /// How the KV cache stores keys and values: f16 (half the memory and the bytes read per
    /// decode step), q8 (8-bit codes with a scale per 32 values: 1.125 bytes a value, the
    /// CPU only; needs a head dimension that is a multiple of 32) or f32. Default: f16 when
    /// the model's matrices run through the int8 kernels, f32 when it runs exactly.
    #[arg(long, value_name = "DTYPE", value_parser = parse_kv_dtype)]
    pub kv_cache_dtype: Option<KvDtype>,
    /// Token slots per KV block.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub block_size: u32,
    /// Disable prefix caching (reuse of the KV blocks of prompts already computed; on by
    /// default, it never changes results).
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Plan each step only once the previous step's tokens are on the host. By default, on a
    /// GPU, the engine plans and queues step n+1 while step n runs (overlapped steps; never
    /// a different result); this flag is for comparison.
    #[arg(long)]
    pub no_overlap: bool,
    /// Speculative decoding proposer: `ngram` (prompt lookup, matches of 1 to 3 tokens),
    /// `ngram:MIN:MAX`, or `draft:PATH` (a draft model with the same vocabulary).
    #[arg(long, value_name = "ngram|draft:PATH")]
    pub speculative: Option<String>,
    /// Draft tokens per step with speculative decoding (default 4).
    #[arg(long, value_name = "K")]
    pub num_speculative_tokens: Option<usize>,
    /// Speculate only while at most N sequences run (default 8).
    #[arg(long, value_name = "N")]
    pub speculative_max_batch: Option<usize>,
    /// Cost of one draft token as a fraction of a decode step, on top of 0.2 per verifying
    /// step (default: 0.2 for n-gram, 0.2 + draft/target weight size for a draft model);
    /// 0 always drafts K tokens.
    #[arg(long, value_name = "C")]
    pub speculative_draft_cost: Option<f64>,
    /// Longest sequence (prompt + output) allowed; at most the model's context length.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..))]
    pub max_model_len: Option<u32>,
    /// Record the step timeline and write it here as Chrome trace JSON (Perfetto,
    /// chrome://tracing) at exit; `serve` also answers it on `POST /debug/trace`.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    /// With --trace: keep the last N steps.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub trace_steps: usize,
}

/// How tokens are chosen and when generation stops (`generate` and `chat`).
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Most tokens to generate per answer.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_tokens: usize,
    /// Softmax temperature; 0 picks the most likely token (greedy).
    #[arg(
        long,
        value_name = "T",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probabilities add up to P.
    #[arg(
        long,
        value_name = "P",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub top_p: f32,
    /// Keep the K most likely tokens; -1 or 0 keeps all.
    #[arg(long, value_name = "K", default_value_t = -1, allow_negative_numbers = true)]
    pub top_k: i32,
    /// Drop tokens less likely than P times the most likely one.
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub min_p: f32,
    /// Seed for reproducible sampling (per request, whatever else runs).
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable); it is not part of the output.
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
    /// Answers per prompt.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub n: usize,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Beam search with W beams instead of sampling (sampling settings are ignored).
    #[arg(long, value_name = "W")]
    pub beam_width: Option<usize>,
    /// Beam scores are cum_logprob / length^L.
    #[arg(
        long,
        value_name = "L",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub length_penalty: f32,
}

/// `f32` or `f16`.
fn parse_kv_dtype(s: &str) -> Result<KvDtype, String> {
    match s {
        "f32" => Ok(KvDtype::F32),
        "f16" => Ok(KvDtype::F16),
        "q8" => Ok(KvDtype::Q8),
        other => Err(format!("unknown KV cache dtype {other:?} (f32, f16 or q8)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_cuda::CudaWeights;

    #[test]
    fn every_cuda_weight_format_parses_from_its_name() {
        for format in [CudaWeights::Dense, CudaWeights::Q8_0, CudaWeights::Q4_1] {
            assert_eq!(parse_cuda_weights(format.name()), Ok(format));
        }
        assert!(parse_cuda_weights("q4_0").is_err());
    }
}
