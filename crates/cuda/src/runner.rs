//! [`CudaRunner`]: the [`ModelRunner`] whose weights, KV pool and workspace live on a GPU.

use std::ops::Range;

use cudarc::driver::CudaSlice;
use sha2::{Digest, Sha256};
use tandem_kernels::thread_pool::ThreadPool;
use tandem_model::batch::{BlockId, CarriedToken, ForwardBatch, TokenId};
use tandem_model::host_model::HostModel;
use tandem_model::logits::{Logits, SpareLogits};
use tandem_model::row_sampling::RowDraw;
use tandem_model::runner::{KvGeometry, ModelRunner};
use tandem_model::token_pick::TokenPick;
use tandem_model::{ModelConfig, Result as ModelResult};

use crate::attention_tiles::shared_bytes;
use crate::batch_layout::{slots_of_positions, BatchLayout, RopeFreqs};
use crate::decode_graphs::DecodeGraphs;
use crate::device::Device;
use crate::draw_buffers::DrawBuffers;
use crate::error::{catch_binding_panic, CudaError};
use crate::forward::Workspace;
use crate::gemm::Gemm;
use crate::host_staging::HostStaging;
use crate::kernels::{Kernels, MAX_GQA_GROUP, MAX_HEAD_DIM};
use crate::kv_pool::{blocks_for_fraction, bytes_per_token, KvPool};
use crate::launched_steps::LaunchedSteps;
use crate::layer_program::TC_FOLD_MIN_BLOCKS;
use crate::options::{CudaDtype, CudaOptions, CudaWeights, KvBudget};
use crate::program_buffers::{KvPtrs, WeightPtrs};
use crate::step_inputs::StepInputs;
use crate::step_profile::{EventLog, StepProfile};
use crate::weights::{upload, DeviceWeights};

/// A model prepared on one GPU. `Send`: every method first makes the device's context
/// current on the calling thread.
#[derive(Debug)]
pub struct CudaRunner {
    pub(crate) config: ModelConfig,
    pub(crate) dtype: CudaDtype,
    /// RoPE inverse frequencies (llama3 and linear scaling and rope_freqs applied).
    pub(crate) rope: RopeFreqs,
    // Field order is drop order: everything allocated on the device goes before `device`,
    // and the graphs, which read the buffers, before them.
    pub(crate) graphs: DecodeGraphs,
    pub(crate) weights: DeviceWeights,
    /// The addresses of `weights` and `pool`, which never move.
    pub(crate) weight_ptrs: WeightPtrs,
    pub(crate) kv_ptrs: KvPtrs,
    /// The storage-type matrix a quantized matrix expands into for larger products (`None`
    /// with dense weights).
    pub(crate) quant_scratch: Option<CudaSlice<u8>>,
    pub(crate) pool: KvPool,
    pub(crate) ws: Workspace,
    pub(crate) draws: DrawBuffers,
    /// Launched steps not yet collected, and the latest step's picks on the device.
    pub(crate) steps: LaunchedSteps,
    pub(crate) inputs: StepInputs,
    /// Page-locked staging of a launched step's uploads.
    pub(crate) staging: HostStaging,
    pub(crate) kernels: Kernels,
    pub(crate) gemm: Gemm,
    /// Products by the fixed-order kernel rather than cuBLAS (`CudaOptions::batch_invariant`).
    pub(crate) batch_invariant: bool,
    /// `CudaOptions::tensor_core_attention`.
    pub(crate) tensor_core_attention: bool,
    /// `LayerProgram::tc_fold_min_blocks` (`TC_FOLD_MIN_BLOCKS` unless a check changes it).
    pub(crate) tc_fold_min_blocks: usize,
    /// `CudaOptions::overlap_steps`.
    overlap_steps: bool,
    /// Events of a profiled step (empty otherwise); dropped before the device.
    pub(crate) profile: EventLog,
    /// The logits buffer the engine handed back (`ModelRunner::recycle_logits`), which the
    /// next copy of logits to the host fills.
    pub(crate) spare_logits: SpareLogits,
    /// Host threads lent to the engine between steps (`ModelRunner::host_pool`): the plain
    /// rows it samples on the host (a grammar's, a forking group's) run side by side.
    host_pool: ThreadPool,
    pub(crate) device: Device,
    /// The identity of the weights, numeric mode and weight format; the switchable modes
    /// (products, attention) are mixed in by `model_identity`.
    identity: u64,
}

impl CudaRunner {
    /// Opens the GPU, compiles (or loads) the kernels, uploads the weights and allocates the
    /// workspace and the KV pool. Any failure, including a machine without CUDA, is an error.
    pub fn new(host: &HostModel, options: CudaOptions) -> Result<CudaRunner, CudaError> {
        options.validate()?;
        check_model(&host.config)?;
        catch_binding_panic(|| Self::build(host, &options))
    }

    fn build(host: &HostModel, o: &CudaOptions) -> Result<CudaRunner, CudaError> {
        let config = host.config.clone();
        let device = Device::open(o.device_ordinal)?;
        let stream = device.stream.clone();
        let kernels = Kernels::load(&stream, o.dtype, &o.kernel_cache_dir)?;
        check_shared_memory(&config, o.dtype, kernels.attention_shared_limit())?;
        let gemm = Gemm::new(stream.clone(), o.dtype)?;
        let weights = upload(host, o.dtype, o.weights, &stream)?;
        let quant_scratch = match weights.largest_quantized {
            0 => None,
            n => Some(stream.alloc_zeros::<u8>(n * o.dtype.size())?),
        };
        let ws = Workspace::new(&stream, &config, o.dtype, o.max_batch_tokens)?;
        let draws = DrawBuffers::new(&stream)?;
        let steps = LaunchedSteps::new(&stream, o.max_batch_tokens)?;
        let block_bytes = o.block_size * bytes_per_token(&config, o.dtype);
        let num_blocks = match o.kv {
            KvBudget::Blocks(n) => n,
            KvBudget::MemoryFraction(f) => {
                stream.synchronize()?;
                let (free, total) = device.memory()?;
                blocks_for_fraction(free, total, f, block_bytes)?
            }
        };
        let pool = KvPool::new(&stream, &config, o.dtype, o.block_size, num_blocks)?;
        let table_stride = (INITIAL_TABLE_TOKENS / o.block_size).next_power_of_two();
        let half = config.head_dim / 2;
        let inputs = StepInputs::new(&stream, o.max_batch_tokens, half, table_stride)?;
        stream.synchronize()?;
        Ok(CudaRunner {
            identity: identity(host, o.dtype, o.weights),
            rope: RopeFreqs {
                global: host.weights.inv_freqs.clone(),
                local: host.weights.local_inv_freqs.clone(),
            },
            dtype: o.dtype,
            config,
            weight_ptrs: weights.ptrs(&stream),
            kv_ptrs: pool.ptrs(),
            weights,
            quant_scratch,
            graphs: DecodeGraphs::new(o.cuda_graphs),
            pool,
            ws,
            draws,
            steps,
            staging: HostStaging::new(&device.ctx)?,
            inputs,
            kernels,
            gemm,
            batch_invariant: o.batch_invariant,
            tensor_core_attention: o.tensor_core_attention,
            tc_fold_min_blocks: TC_FOLD_MIN_BLOCKS,
            overlap_steps: o.overlap_steps,
            profile: EventLog::default(),
            spare_logits: SpareLogits::new(SPARE_LOGITS_BYTES),
            host_pool: ThreadPool::new(host_pool_threads()),
            device,
        })
    }

    /// Bytes of device memory the weights take.
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes
    }

    pub fn dtype(&self) -> CudaDtype {
        self.dtype
    }

    /// The GPU this runner uses.
    pub fn gpu(&self) -> &crate::GpuInfo {
        &self.device.info
    }

    /// Turns the replay of recorded decode graphs on or off (graphs already recorded are
    /// kept for when it is turned on again).
    pub fn set_cuda_graphs(&mut self, on: bool) {
        self.graphs.enabled = on;
    }

    /// Turns overlapped steps on or off (`CudaOptions::overlap_steps`; the engine asks
    /// [`ModelRunner::overlaps_steps`] when it starts).
    pub fn set_overlap_steps(&mut self, on: bool) {
        self.overlap_steps = on;
    }

    /// Switches between cuBLAS and the fixed-order products (`CudaOptions::batch_invariant`);
    /// recorded graphs, which hold the other kind, are dropped, and `model_identity`
    /// changes with it. For comparisons: a runner whose results an engine has cached should
    /// not switch.
    pub fn set_batch_invariant(&mut self, on: bool) {
        if on != self.batch_invariant {
            self.batch_invariant = on;
            self.graphs.clear();
        }
    }

    /// Turns the tensor-core attention on or off (`CudaOptions::tensor_core_attention`);
    /// decode graphs recorded with the other kernel are dropped. For comparisons, as
    /// [`CudaRunner::set_batch_invariant`].
    pub fn set_tensor_core_attention(&mut self, on: bool) {
        if on != self.tensor_core_attention {
            self.tensor_core_attention = on;
            self.graphs.clear();
        }
    }

    /// The fewest blocks with which the tensor-core attention folds a token's partitions
    /// within its block (see `LayerProgram::tc_fold_min_blocks`): for checks that both ways
    /// give the same bits on a device; `None` restores the default. Steps with a prompt's
    /// tiles only: decode steps never fold.
    pub fn set_tensor_core_fold_min_blocks(&mut self, blocks: Option<usize>) {
        self.tc_fold_min_blocks = blocks.unwrap_or(TC_FOLD_MIN_BLOCKS);
    }

    /// Decode graphs recorded so far.
    pub fn graphs_recorded(&self) -> usize {
        self.graphs.recorded
    }

    /// Runs `batch` eagerly (no graph) with CUDA events between its operations and
    /// returns where the time went. The KV cache is written as by `forward`.
    pub fn profile_forward(&mut self, batch: &ForwardBatch) -> Result<StepProfile, CudaError> {
        self.device.bind()?;
        self.device.stream.synchronize()?;
        let graphs = self.graphs.enabled;
        self.graphs.enabled = false;
        let t = std::time::Instant::now();
        let started = self.profile.start(&self.device.ctx, &self.device.stream);
        let ran = started.and_then(|()| self.forward_inner(batch));
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        self.graphs.enabled = graphs;
        let profile = self.profile.finish(wall_ms);
        ran?;
        profile
    }

    /// Waits for all queued device work (for timing).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.device.bind()?;
        Ok(self.device.stream.synchronize()?)
    }

    fn forward_inner(&mut self, batch: &ForwardBatch) -> Result<Logits, CudaError> {
        batch.validate(
            self.config.vocab_size,
            self.pool.block_size,
            self.pool.num_blocks,
        )?;
        let layout = BatchLayout::build(batch, self.pool.block_size, &self.rope)?;
        self.device.bind()?;
        catch_binding_panic(|| self.run_forward(layout))
    }

    fn cached_logits_inner(
        &mut self,
        block_table: &[BlockId],
        positions: Range<usize>,
    ) -> Result<Logits, CudaError> {
        let (bs, nb) = (self.pool.block_size, self.pool.num_blocks);
        let slots = slots_of_positions(block_table, positions.clone(), bs, nb)?;
        self.device.bind()?;
        catch_binding_panic(|| self.lm_head((0..positions.len()).collect(), &slots))
    }
}

/// Threads of the runner's host pool: the machine's, up to [`MAX_HOST_POOL_THREADS`].
fn host_pool_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_HOST_POOL_THREADS)
}

impl Drop for CudaRunner {
    /// Waits for queued work first: launched steps' copies may still read and write
    /// page-locked memory the runner is about to free.
    fn drop(&mut self) {
        // Not conditional on `bind`: it also reports (once, and clears) an error cudarc
        // recorded earlier in a drop, and `synchronize` binds the context itself.
        let _ = self.device.bind();
        let _ = self.device.stream.synchronize();
    }
}

/// Context length the block-table buffers are first sized for (they grow on demand).
const INITIAL_TABLE_TOKENS: usize = 2048;

/// The most threads the runner lends the engine for host sampling.
const MAX_HOST_POOL_THREADS: usize = 8;

/// The largest logits buffer the runner keeps for reuse: a decode step of 256 rows over a
/// 262,144-token vocabulary; a long prompt's logprob rows are let go.
const SPARE_LOGITS_BYTES: usize = 256 << 20;

/// Checks the shapes the kernels support.
fn check_model(c: &ModelConfig) -> Result<(), CudaError> {
    c.validate().map_err(CudaError::Unsupported)?;
    if !c.head_dim.is_multiple_of(32) || c.head_dim > MAX_HEAD_DIM {
        return Err(CudaError::Unsupported(format!(
            "head_dim {} must be a multiple of 32 and at most {MAX_HEAD_DIM}",
            c.head_dim
        )));
    }
    if c.num_heads / c.num_kv_heads > MAX_GQA_GROUP {
        return Err(CudaError::Unsupported(format!(
            "{} query heads per kv head; the attention kernel takes at most {MAX_GQA_GROUP}",
            c.num_heads / c.num_kv_heads
        )));
    }
    Ok(())
}

/// Checks that an attention block of one token fits the device's shared memory.
fn check_shared_memory(c: &ModelConfig, dtype: CudaDtype, limit: usize) -> Result<(), CudaError> {
    let group = c.num_heads / c.num_kv_heads;
    let need = shared_bytes(group, 1, c.head_dim, dtype.size());
    if need > limit {
        return Err(CudaError::Unsupported(format!(
            "the attention of head_dim {} in {} needs {need} bytes of shared memory per \
             block; this device allows {limit}",
            c.head_dim,
            dtype.name()
        )));
    }
    Ok(())
}

/// A hash of the configuration, the numeric mode and samples of the weights.
fn identity(host: &HostModel, dtype: CudaDtype, weights: CudaWeights) -> u64 {
    let mut h = Sha256::new();
    let mode = format!("{} {}", dtype.name(), weights.name());
    h.update(format!("cuda {mode} {:?}", host.config).as_bytes());
    for name in host.tensors.names() {
        if let Some(t) = host.tensors.get(name) {
            h.update(name.as_bytes());
            h.update(&t.data[..t.data.len().min(64)]);
        }
    }
    let d = h.finalize();
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

impl ModelRunner for CudaRunner {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_geometry(&self) -> KvGeometry {
        KvGeometry {
            block_size: self.pool.block_size,
            num_blocks: self.pool.num_blocks,
            dtype: self.dtype.kv_dtype(),
            bytes_per_token: bytes_per_token(&self.config, self.dtype),
        }
    }

    fn forward(&mut self, batch: &ForwardBatch) -> ModelResult<Logits> {
        Ok(self.forward_inner(batch)?)
    }

    fn forward_logprobs(
        &mut self,
        batch: &ForwardBatch,
        targets: &[Option<TokenId>],
    ) -> ModelResult<Vec<Option<f32>>> {
        Ok(self.forward_logprobs_inner(batch, targets)?)
    }

    fn forward_greedy(&mut self, batch: &ForwardBatch) -> ModelResult<Vec<Option<TokenPick>>> {
        Ok(self.forward_greedy_inner(batch)?)
    }

    fn samples_rows(&self) -> bool {
        true
    }

    fn forward_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
    ) -> ModelResult<Vec<Option<TokenPick>>> {
        Ok(self.forward_sample_inner(batch, rows)?)
    }

    fn overlaps_steps(&self) -> bool {
        self.overlap_steps
    }

    fn host_pool(&self) -> Option<&ThreadPool> {
        Some(&self.host_pool)
    }

    fn recycle_logits(&mut self, logits: Logits) {
        self.spare_logits.keep(logits);
    }

    fn launch_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
        carried: &[CarriedToken],
    ) -> ModelResult<()> {
        if !self.overlap_steps {
            return Err(tandem_model::ModelError::Batch(
                "overlapped steps are turned off on this CUDA runner".to_string(),
            ));
        }
        Ok(self.launch_sample_inner(batch, rows, carried)?)
    }

    fn collect_picks(&mut self) -> ModelResult<Vec<Option<TokenPick>>> {
        Ok(self.collect_launched()?)
    }

    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> ModelResult<()> {
        self.device.bind().map_err(tandem_model::ModelError::from)?;
        Ok(catch_binding_panic(|| self.pool.copy_blocks(copies))?)
    }

    fn cached_logits(
        &mut self,
        block_table: &[BlockId],
        positions: Range<usize>,
    ) -> ModelResult<Logits> {
        Ok(self.cached_logits_inner(block_table, positions)?)
    }

    fn model_identity(&self) -> u64 {
        // Both modes change the numbers a pass computes: results of one are not the other's.
        let fixed = u64::from(self.batch_invariant) * 0x9E37_79B9_7F4A_7C15;
        let tc = u64::from(self.tensor_core_attention()) * 0xC2B2_AE3D_27D4_EB4F;
        self.identity ^ fixed ^ tc
    }

    fn describe(&self) -> String {
        let (major, minor) = self.device.info.compute_capability;
        let weights = match self.weights.format {
            CudaWeights::Dense => self.dtype.name().to_string(),
            q => format!("{} (layers {})", self.dtype.name(), q.name()),
        };
        format!(
            "cuda:{} {} (sm_{major}{minor}), {weights} weights ({:.2} GiB), NVRTC kernels + \
             cuBLAS, KV {} x {} tokens {}, CUDA graphs {}, overlapped steps {}, attention on \
             {}{}",
            self.device.info.ordinal,
            self.device.info.name,
            self.weights.bytes as f64 / (1u64 << 30) as f64,
            self.pool.num_blocks,
            self.pool.block_size,
            self.dtype.kv_dtype().name(),
            match (self.graphs.enabled, &self.graphs.failure) {
                (true, _) => "on".to_string(),
                (false, Some(why)) => format!("off ({why})"),
                (false, None) => "off".to_string(),
            },
            if self.overlap_steps { "on" } else { "off" },
            match self.tensor_core_attention() {
                true => "tensor cores",
                false => "CUDA cores",
            },
            match self.batch_invariant {
                true => ", batch-invariant products",
                false => "",
            },
        )
    }
}
