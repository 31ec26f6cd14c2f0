//! The model-runner seam: everything the engine asks of a device.
//!
//! The engine (scheduler, block allocator, prefix cache, sampler, speculation) speaks only of
//! token ids and block ids. A [`ModelRunner`] owns what lives on a device: the prepared
//! weights, the physical KV pool those block ids index, the working memory of a forward pass.
//! The split sits where vLLM puts it (scheduler output -> one runner per device), not at a
//! generic tensor-op layer: each runner keeps its fused kernels.
//!
//! Runners in this repository: [`crate::cpu_runner::CpuRunner`] (the CPU transformer and its
//! host KV store) and, in the `tandem-cuda` crate, `CudaRunner` (weights and paged KV in GPU
//! memory). Tests of the engine use a fake runner that needs no weights.

use std::ops::Range;

use tandem_kernels::thread_pool::ThreadPool;

use crate::batch::{AdapterId, BlockId, CarriedToken, ForwardBatch, TokenId};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::logits::Logits;
use crate::lora::LoraAdapter;
use crate::row_sampling::RowDraw;
use crate::scoring::score_row;
use crate::token_pick::TokenPick;

/// How a runner's KV pool stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 4 bytes per element: attention exactly as computed.
    F32,
    /// IEEE half, rounded to nearest on write (the CPU's compact format).
    F16,
    /// bfloat16, rounded to nearest on write (the GPU's format).
    Bf16,
    /// 8-bit codes with an f32 scale per 32 elements (`tandem_kernels::kv_quant`; the CPU's
    /// smallest format: 1.125 bytes an element).
    Q8,
}

impl KvDtype {
    /// Bytes `elements` stored elements take (for [`KvDtype::Q8`], with the scales of their
    /// groups, whole groups counted).
    pub fn row_bytes(self, elements: usize) -> usize {
        match self {
            KvDtype::F32 => 4 * elements,
            KvDtype::F16 | KvDtype::Bf16 => 2 * elements,
            KvDtype::Q8 => elements + std::mem::size_of::<f32>() * elements.div_ceil(KV_Q8_GROUP),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Q8 => "q8",
        }
    }
}

/// Elements sharing one scale in [`KvDtype::Q8`] rows.
const KV_Q8_GROUP: usize = tandem_kernels::attention::Q8_GROUP;

/// The shape of a runner's KV pool, fixed when the runner is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Token slots per block.
    pub block_size: usize,
    /// Blocks in the pool; block ids run `0..num_blocks`.
    pub num_blocks: usize,
    pub dtype: KvDtype,
    /// Bytes one token slot takes across all layers (keys, values and whatever else the
    /// runner keeps per slot, such as the final hidden state).
    pub bytes_per_token: usize,
}

impl KvGeometry {
    /// Token slots in the pool.
    pub fn capacity_tokens(&self) -> usize {
        self.block_size * self.num_blocks
    }

    /// Bytes of the whole pool.
    pub fn bytes(&self) -> usize {
        self.capacity_tokens() * self.bytes_per_token
    }
}

/// What a runner must do for the engine. Every method addresses the KV pool by block ids the
/// engine's allocator handed out; a runner never decides which block holds what.
pub trait ModelRunner: Send + std::fmt::Debug {
    /// The model's shapes and hyper-parameters.
    fn config(&self) -> &ModelConfig;

    /// The KV pool this runner holds.
    fn kv_geometry(&self) -> KvGeometry;

    /// Runs the transformer over `batch`: writes every new token's K/V (and final hidden
    /// state) into the slots its block tables name and returns logits for the rows
    /// `batch.output` selects. A batch that does not fit the pool is an error, never a panic.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits>;

    /// Teacher-forced log-probabilities: runs `batch` as [`ModelRunner::forward`] does and
    /// returns, for output row `i`, `log p(targets[i])` under its logits (`None` where
    /// `targets[i]` is `None`), bitwise what [`crate::scoring::score_row`] computes from
    /// them; a row that holds a NaN or an infinity, or a target outside the vocabulary, is
    /// an error. The default computes the
    /// logits and scores them on the host; a device runner computes each row's softmax sums
    /// where the logits are and copies back a few numbers per row instead of the rows.
    fn forward_logprobs(
        &mut self,
        batch: &ForwardBatch,
        targets: &[Option<TokenId>],
    ) -> Result<Vec<Option<f32>>> {
        let logits = self.forward(batch)?;
        check_targets(targets, &logits)?;
        let scores = targets
            .iter()
            .enumerate()
            .map(|(row, t)| {
                t.map(|t| score_row(&logits, row, t, 0, false).map(|s| s.logprob))
                    .transpose()
            })
            .collect();
        self.recycle_logits(logits);
        scores
    }

    /// The greedy token of every output row of `batch` with its raw log-probability, `None`
    /// for a row holding a NaN or an infinity: what the sampler chooses and reports for a
    /// request without processors, bit for bit ([`TokenPick`]). The default computes the
    /// logits and picks on the host; a device runner reduces each row where the logits are
    /// and copies back a few bytes per row instead of the vocabulary.
    fn forward_greedy(&mut self, batch: &ForwardBatch) -> Result<Vec<Option<TokenPick>>> {
        let logits = self.forward(batch)?;
        let picks = (0..logits.num_rows())
            .map(|r| TokenPick::greedy(logits.row(r)))
            .collect();
        self.recycle_logits(logits);
        Ok(picks)
    }

    /// The greedy token of every output row of `batch`, `None` for a row holding a NaN or an
    /// infinity: [`Self::forward_greedy`]'s tokens without their log-probabilities, for a
    /// step whose requests did not ask for them (the CPU runner then skips the pass over each
    /// row that a log-probability's normalizer costs). Default: [`Self::forward_greedy`]'s.
    fn forward_greedy_tokens(&mut self, batch: &ForwardBatch) -> Result<Vec<Option<TokenId>>> {
        let picks = self.forward_greedy(batch)?;
        Ok(picks.into_iter().map(|p| p.map(|p| p.token)).collect())
    }

    /// Threads the engine may borrow between this runner's steps for its own work on the
    /// host (sampling a step's rows side by side). The CPU runner lends the model's pool,
    /// idle while the engine samples, the CUDA runner a pool of its own; `None` (the
    /// default): the engine's thread does it all.
    fn host_pool(&self) -> Option<&ThreadPool> {
        None
    }

    /// Takes back logits this runner returned once the engine is done with them, so that a
    /// later step may write into their buffer instead of allocating one (the CPU and CUDA
    /// runners do). Default: they are dropped.
    fn recycle_logits(&mut self, logits: Logits) {
        drop(logits);
    }

    /// Whether the runner draws tokens where its logits are ([`Self::forward_sample`]), so
    /// that the engine should ask it to rather than take the logits. Default: no.
    fn samples_rows(&self) -> bool {
        false
    }

    /// One token per output row of `batch`, chosen as `rows[r]` says ([`RowDraw`]: the
    /// processors, then the draw of [`crate::row_sampling`]), with its raw log-probability
    /// and the requested most likely tokens; `None` for a row holding a NaN or an infinity
    /// or with no token left to choose. The default computes the logits and draws on the
    /// host.
    fn forward_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
    ) -> Result<Vec<Option<TokenPick>>> {
        let vocab = self.config().vocab_size;
        if let Some(e) = rows.iter().find_map(|r| r.validate(vocab).err()) {
            return Err(ModelError::Batch(e));
        }
        let logits = self.forward(batch)?;
        if rows.len() != logits.num_rows() {
            return Err(ModelError::Batch(format!(
                "{} row draws for {} rows of logits",
                rows.len(),
                logits.num_rows()
            )));
        }
        let picks = rows
            .iter()
            .enumerate()
            .map(|(r, d)| d.pick(logits.row(r)))
            .collect();
        self.recycle_logits(logits);
        Ok(picks)
    }

    /// Whether the runner overlaps steps: [`Self::launch_sample`] queues a step and returns
    /// before it has run, so that the engine plans the next step while the device runs this
    /// one. Default: no (the engine then runs each step to its end).
    fn overlaps_steps(&self) -> bool {
        false
    }

    /// Queues the step [`Self::forward_sample`] would run for `batch` and `rows` and returns
    /// without waiting for it; [`Self::collect_picks`] returns its picks. The rows `carried`
    /// names take their tokens from the picks of the step launched just before (possibly
    /// still running), where those picks are: such an id reaches the step that reads it
    /// without a round trip through the host (the batch holds a placeholder there; a
    /// carried pick that was `None` reads as token 0, and the engine discards that row).
    /// A carried row is its sequence's output row, and its `RowDraw` was made before the
    /// carried token was known: the runner draws it with
    /// [`crate::logit_processing::LogitProcessing::with_output`] of that token (the
    /// penalties count it). At most two launched steps are uncollected at a time; picks are
    /// collected in launch order. A runner that does not [`Self::overlaps_steps`] refuses.
    ///
    /// Launched steps, and [`Self::copy_blocks`] called while steps are launched, run in
    /// call order (a device runner queues them on one stream): a block the engine freed
    /// under a launched step (an abort, a stop token) may be the destination of the next
    /// plan's copy or writes, which must land after that step's stale writes into it.
    fn launch_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
        carried: &[CarriedToken],
    ) -> Result<()> {
        let _ = (batch, rows, carried);
        Err(ModelError::Batch(
            "this runner does not overlap steps".to_string(),
        ))
    }

    /// The picks of the oldest launched step not yet collected (one per output row, as
    /// [`Self::forward_sample`] returns them), once it has run. An error when no step is
    /// launched. A failed launch or collect drops every launched step: the next launch
    /// starts afresh and carries nothing.
    fn collect_picks(&mut self) -> Result<Vec<Option<TokenPick>>> {
        Err(ModelError::Batch(
            "this runner does not overlap steps".to_string(),
        ))
    }

    /// Copies whole blocks, `(src, dst)` in order (copy-on-write of a shared last block).
    /// With steps launched ([`Self::launch_sample`]) the copies run after them.
    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> Result<()>;

    /// Logits of positions `positions` of the sequence whose blocks are `block_table`, from
    /// the final hidden states an earlier forward pass stored there (rows numbered from 0):
    /// bitwise what that forward pass returned for them. Scoring reads the prefix cache this
    /// way without recomputing the cached positions.
    fn cached_logits(&mut self, block_table: &[BlockId], positions: Range<usize>)
        -> Result<Logits>;

    /// A number that differs between models (and numeric modes), so that prefix-cache keys of
    /// one model never match another's.
    fn model_identity(&self) -> u64;

    /// One line for start-up logs: the device, its kernels and numeric mode.
    fn describe(&self) -> String;

    /// Whether LoRA adapter `id` is registered with the model (a batch's sequences may name
    /// only those; none on a runner without adapter support).
    fn has_adapter(&self, _id: AdapterId) -> bool {
        false
    }

    /// Registers a LoRA adapter loaded for this runner's model; its id is never reused.
    fn add_adapter(&mut self, _adapter: LoraAdapter) -> Result<AdapterId> {
        Err(ModelError::Batch(format!(
            "{}: LoRA adapters run on the CPU",
            self.describe()
        )))
    }

    /// Forgets adapter `id` (the caller makes sure no sequence runs with it).
    fn remove_adapter(&mut self, id: AdapterId) -> Result<()> {
        Err(ModelError::Batch(format!(
            "adapter {} is not registered",
            id.0
        )))
    }

    /// A hash of registered adapter `id`'s weights (equal for the same adapter in another
    /// process of the same build), so that KV blocks computed under it are recognised
    /// elsewhere; `None` for an unknown id or a runner without adapters.
    fn adapter_digest(&self, _id: AdapterId) -> Option<u64> {
        None
    }

    /// How this runner's KV blocks travel to another instance ([`Self::read_blocks`]), or
    /// `None` when it cannot move them (the default).
    fn kv_block_format(&self) -> Option<KvBlockFormat> {
        None
    }

    /// Appends the contents of `blocks` (keys, values and whatever else a slot keeps, as
    /// [`Self::kv_block_format`]'s `bytes_per_block` bytes each) to `out`, after any launched
    /// step. An error on a runner without a format or for a block outside the pool.
    fn read_blocks(&mut self, blocks: &[BlockId], out: &mut Vec<u8>) -> Result<()> {
        let _ = (blocks, out);
        Err(ModelError::Batch(format!(
            "{}: KV blocks move between CPU runners only",
            self.describe()
        )))
    }

    /// Overwrites `blocks` with contents [`Self::read_blocks`] gave on a runner of the same
    /// [`KvBlockFormat`] (`data` holds exactly one block's bytes per block, in order), after
    /// any launched step (as [`Self::copy_blocks`]: a block freed under a launched step may
    /// still receive that step's stale writes, which must land first). Every block is checked
    /// before any is written.
    fn write_blocks(&mut self, blocks: &[BlockId], data: &[u8]) -> Result<()> {
        let _ = (blocks, data);
        Err(ModelError::Batch(format!(
            "{}: KV blocks move between CPU runners only",
            self.describe()
        )))
    }
}

/// What a block read from one runner needs to mean the same in another: the same model in
/// the same numeric mode (`compatibility`), the same element type and block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvBlockFormat {
    /// Equal on runners whose blocks are interchangeable: it hashes the model's identity
    /// (configuration and a sample of every tensor's bytes), its numeric mode and the block
    /// layout, with std's `DefaultHasher` (so two builds with different Rust releases may
    /// disagree and refuse each other's blocks: safe, never wrong).
    pub compatibility: u64,
    pub dtype: KvDtype,
    pub block_size: usize,
    /// Bytes of one block's contents.
    pub bytes_per_block: usize,
}

/// Checks that every `(src, dst)` of a [`ModelRunner::copy_blocks`] call names a block of a
/// pool of `num_blocks` (runners check all of them before copying any).
pub fn check_block_copies(copies: &[(BlockId, BlockId)], num_blocks: usize) -> Result<()> {
    match copies
        .iter()
        .find(|(s, d)| s.0 as usize >= num_blocks || d.0 as usize >= num_blocks)
    {
        Some((s, d)) => Err(crate::error::ModelError::Batch(format!(
            "block copy {} -> {} outside the pool of {num_blocks} blocks",
            s.0, d.0
        ))),
        None => Ok(()),
    }
}

/// Checks that [`ModelRunner::forward_logprobs`] got one target per row of `logits`.
pub fn check_targets(targets: &[Option<TokenId>], logits: &Logits) -> Result<()> {
    if targets.len() == logits.num_rows() {
        return Ok(());
    }
    Err(ModelError::Batch(format!(
        "{} targets for {} rows of logits",
        targets.len(),
        logits.num_rows()
    )))
}

/// The slot of position `pos` of a sequence whose blocks are `block_table`.
pub fn slot_of(block_table: &[BlockId], block_size: usize, pos: usize) -> usize {
    block_table[pos / block_size].0 as usize * block_size + pos % block_size
}
