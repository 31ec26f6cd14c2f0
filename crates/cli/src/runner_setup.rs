//! The one place that turns a loaded model into a model runner with its KV pool: every
//! subcommand (score, generate, chat, serve, bench) and the draft model of speculative
//! decoding come through here, on the device `--device` names.

use anyhow::{bail, Context, Result};
use tandem_cuda::{CudaOptions, CudaRunner, KvBudget};
use tandem_model::config::ModelConfig;
use tandem_model::cpu_runner::{CpuRunner, KvSpec};
use tandem_model::host_model::HostModel;
use tandem_model::kv_store::{KvDtype, KvStore};
use tandem_model::loader::{load_model_beside, ModelText};
use tandem_model::lora::load_peft_adapter;
use tandem_model::runner::ModelRunner;
use tandem_model::transformer::Model;

use crate::args::{Device, ModelArgs};

/// A model prepared for its device whose KV pool is not yet sized: preparing first tells
/// what one token of KV costs, so that one memory budget can be split between a target
/// and a draft model.
#[derive(Debug)]
pub enum PreparedModel {
    /// Repacked for the CPU kernels.
    Cpu {
        model: Box<Model>,
        kv_dtype: KvDtype,
    },
    /// Uploaded when the runner is built (its pool is sized from what the weights leave).
    Cuda {
        host: Box<HostModel>,
        options: CudaOptions,
    },
}

impl PreparedModel {
    /// Prepares `host` for the device of `args` (`auto`: CUDA when a driver and a GPU are
    /// found, else the CPU, saying which and why on stderr). `kv_dtype`: `--kv-cache-dtype`.
    pub fn new(host: HostModel, args: &ModelArgs, kv_dtype: Option<KvDtype>) -> Result<Self> {
        let ordinal = match args.device {
            Device::Cpu => None,
            Device::Cuda(n) => {
                let info = tandem_cuda::probe().context("--device cuda")?;
                if n >= info.device_count() {
                    bail!(
                        "--device cuda:{n}: {} CUDA devices found",
                        info.device_count()
                    );
                }
                Some(n)
            }
            Device::Auto => match tandem_cuda::probe() {
                Ok(info) if info.device_count() > 0 => Some(0),
                Ok(_) => {
                    eprintln!("tandem: --device auto: a CUDA driver but no GPU; using the CPU");
                    None
                }
                Err(tandem_cuda::CudaError::LibraryNotFound { library, .. }) => {
                    eprintln!(
                        "tandem: --device auto: no CUDA ({library} not found); using the CPU"
                    );
                    None
                }
                Err(e) => {
                    eprintln!("tandem: --device auto: no CUDA ({e}); using the CPU");
                    None
                }
            },
        };
        let Some(device_ordinal) = ordinal else {
            let model = Box::new(Model::with_kernels(
                host,
                args.threads(),
                args.cpu_kernels()?,
            ));
            let kv_dtype = kv_dtype.unwrap_or_else(|| model.default_kv_dtype());
            return Ok(PreparedModel::Cpu { model, kv_dtype });
        };
        if kv_dtype == Some(KvDtype::Q8) {
            bail!("--kv-cache-dtype q8: only the CPU stores an 8-bit KV cache");
        }
        if kv_dtype.is_some_and(|d| d != args.dtype.kv_dtype()) {
            bail!(
                "--kv-cache-dtype: on CUDA the KV cache follows --dtype ({})",
                args.dtype.name()
            );
        }
        let cache = tandem_model::default_model::cache_dir(args.cache_dir.as_deref())?;
        let mut options = CudaOptions::new(cache.join("cuda-kernels"));
        options.device_ordinal = device_ordinal;
        options.dtype = args.dtype;
        options.kv = KvBudget::MemoryFraction(args.gpu_memory_utilization);
        options.cuda_graphs = !args.no_cuda_graphs;
        options.batch_invariant = args.batch_invariant;
        options.weights = args.cuda_weights;
        options.tensor_core_attention = args.tensor_core_attention;
        Ok(PreparedModel::Cuda {
            host: Box::new(host),
            options,
        })
    }

    /// Loads the model `args` name and prepares its weights for the device while its
    /// tokenizer is built on another thread (the two overlap; see `load_model_beside`).
    pub fn load(args: &ModelArgs, kv_dtype: Option<KvDtype>) -> Result<(ModelText, Self)> {
        let path = args.path()?;
        let (text, prepared) =
            load_model_beside(&path, |host| PreparedModel::new(host, args, kv_dtype))
                .with_context(|| format!("loading {}", path.display()))?;
        let mut prepared = prepared?;
        prepared.add_adapters(args)?;
        Ok((text, prepared))
    }

    /// Loads and registers the `--lora-modules` adapters, in order (adapter `i` is the
    /// `i`-th); the CPU runs them, a GPU does not yet.
    pub fn add_adapters(&mut self, args: &ModelArgs) -> Result<()> {
        if args.lora_modules.is_empty() {
            return Ok(());
        }
        let PreparedModel::Cpu { model, .. } = self else {
            bail!("--lora-modules: LoRA adapters run on the CPU (--device cpu)");
        };
        for (i, (name, path)) in args.lora_modules.iter().enumerate() {
            if args.lora_modules[..i].iter().any(|(n, _)| n == name) {
                bail!("--lora-modules {name}: the name is given twice");
            }
            let adapter = load_peft_adapter(path, &model.config)
                .with_context(|| format!("--lora-modules {name}"))?;
            model.add_adapter(adapter.with_dtype(args.lora_dtype.into()))?;
        }
        Ok(())
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        match self {
            PreparedModel::Cpu { model, .. } => &model.config,
            PreparedModel::Cuda { host, .. } => &host.config,
        }
    }

    /// Whether the model runs on a GPU (its pool can be sized from device memory).
    pub fn is_cuda(&self) -> bool {
        matches!(self, PreparedModel::Cuda { .. })
    }

    /// Bytes one token slot of this model's KV pool takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        match self {
            PreparedModel::Cpu { model, kv_dtype } => {
                KvStore::bytes_per_token(&model.config, *kv_dtype)
            }
            PreparedModel::Cuda { host, options } => {
                let c = &host.config;
                // Keys and values of every layer, and the final hidden state in f32.
                2 * c.num_layers * options.dtype.kv_dtype().row_bytes(c.kv_dim())
                    + 4 * c.hidden_size
            }
        }
    }

    pub fn kv_dtype(&self) -> KvDtype {
        match self {
            PreparedModel::Cpu { kv_dtype, .. } => *kv_dtype,
            PreparedModel::Cuda { options, .. } => options.dtype.kv_dtype(),
        }
    }

    /// The kernels the model runs with: the CPU variant (`avx512-int8`, ...) or `cuda-bf16`
    /// / `cuda-f32`.
    pub fn kernels_name(&self) -> String {
        match self {
            PreparedModel::Cpu { model, .. } => model.kernels().name().to_string(),
            PreparedModel::Cuda { options, .. } => format!("cuda-{}", options.dtype.name()),
        }
    }

    /// Bytes of the model's weights as loaded.
    pub fn weight_bytes(&self) -> usize {
        match self {
            PreparedModel::Cpu { model, .. } => model.weight_bytes(),
            PreparedModel::Cuda { host, .. } => host.weight_bytes(),
        }
    }

    /// The runner with a pool of `num_blocks` blocks of `block_size` slots (`None`: what the
    /// device's memory budget leaves after the weights; CUDA only).
    pub fn into_runner(
        self,
        block_size: usize,
        num_blocks: Option<usize>,
    ) -> Result<Box<dyn ModelRunner>> {
        if num_blocks == Some(0) {
            bail!("the KV pool must hold at least one block");
        }
        match self {
            PreparedModel::Cpu { model, kv_dtype } => {
                let num_blocks = num_blocks.context("a CPU KV pool needs a size")?;
                let spec = KvSpec {
                    block_size,
                    num_blocks,
                    dtype: Some(kv_dtype),
                };
                Ok(Box::new(CpuRunner::new(*model, spec)?))
            }
            PreparedModel::Cuda { host, mut options } => {
                options.block_size = block_size;
                if let Some(n) = num_blocks {
                    options.kv = KvBudget::Blocks(n);
                }
                let runner = CudaRunner::new(&host, options).context("starting the CUDA runner")?;
                Ok(Box::new(runner))
            }
        }
    }
}
