//! The CPU backend of the model-runner seam: the transformer ([`Model`]: packed weights,
//! thread pool, scratch) and the host KV store its forward passes read and write.

use std::ops::Range;

use tandem_kernels::thread_pool::ThreadPool;

use crate::batch::{AdapterId, BlockId, ForwardBatch, TokenId};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_store::{KvDtype, KvStore};
use crate::logits::Logits;
use crate::lora::LoraAdapter;
use crate::runner::{
    check_block_copies, check_targets, slot_of, KvBlockFormat, KvGeometry, ModelRunner,
};
use crate::token_pick::TokenPick;
use crate::transformer::Model;

/// The size of a runner's KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSpec {
    /// Token slots per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// How keys and values are stored (`None`: the model's default, see
    /// [`Model::default_kv_dtype`]).
    pub dtype: Option<KvDtype>,
}

/// A model on the CPU with its KV store.
#[derive(Debug)]
pub struct CpuRunner {
    model: Model,
    kv: KvStore,
    /// [`Model::weights_digest`], computed on first use (only KV transfer needs it).
    weights_digest: std::sync::OnceLock<u64>,
}

impl CpuRunner {
    /// A runner over `model` with a zeroed KV pool of `kv`'s size.
    pub fn new(model: Model, kv: KvSpec) -> Result<CpuRunner> {
        let dtype = kv.dtype.unwrap_or_else(|| model.default_kv_dtype());
        let kv = KvStore::with_dtype(&model.config, kv.block_size, kv.num_blocks, dtype)?;
        Ok(CpuRunner {
            model,
            kv,
            weights_digest: std::sync::OnceLock::new(),
        })
    }

    /// The model this runner runs.
    pub fn model(&self) -> &Model {
        &self.model
    }
}

impl ModelRunner for CpuRunner {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn kv_geometry(&self) -> KvGeometry {
        KvGeometry {
            block_size: self.kv.block_size(),
            num_blocks: self.kv.num_blocks(),
            dtype: self.kv.dtype(),
            bytes_per_token: KvStore::bytes_per_token(&self.model.config, self.kv.dtype()),
        }
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits> {
        self.model.forward(batch, &mut self.kv)
    }

    fn forward_logprobs(
        &mut self,
        batch: &ForwardBatch,
        targets: &[Option<TokenId>],
    ) -> Result<Vec<Option<f32>>> {
        let vocab = self.model.config.vocab_size;
        if let Some(t) = targets.iter().flatten().find(|t| t.0 as usize >= vocab) {
            return Err(ModelError::Batch(format!(
                "target token {} is outside the vocabulary of {vocab}",
                t.0
            )));
        }
        let logits = self.model.forward(batch, &mut self.kv)?;
        check_targets(targets, &logits)?;
        let scores = self
            .model
            .target_logprobs(&logits, targets)
            .map_err(|row| ModelError::Batch(format!("non-finite logits at row {row}")));
        self.model.recycle_logits(logits);
        scores
    }

    fn forward_greedy(&mut self, batch: &ForwardBatch) -> Result<Vec<Option<TokenPick>>> {
        let logits = self.model.forward(batch, &mut self.kv)?;
        let picks = self.model.greedy_picks(&logits);
        self.model.recycle_logits(logits);
        Ok(picks)
    }

    fn forward_greedy_tokens(&mut self, batch: &ForwardBatch) -> Result<Vec<Option<TokenId>>> {
        let logits = self.model.forward(batch, &mut self.kv)?;
        let tokens = self.model.greedy_tokens(&logits);
        self.model.recycle_logits(logits);
        Ok(tokens)
    }

    fn recycle_logits(&mut self, logits: Logits) {
        self.model.recycle_logits(logits);
    }

    fn host_pool(&self) -> Option<&ThreadPool> {
        Some(self.model.pool())
    }

    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> Result<()> {
        check_block_copies(copies, self.kv.num_blocks())?;
        for &(src, dst) in copies {
            self.kv.copy_block(src, dst);
        }
        Ok(())
    }

    fn cached_logits(
        &mut self,
        block_table: &[BlockId],
        positions: Range<usize>,
    ) -> Result<Logits> {
        let bs = self.kv.block_size();
        let (n, end) = (self.kv.num_blocks(), positions.end);
        if end.div_ceil(bs) > block_table.len() || block_table.iter().any(|b| b.0 as usize >= n) {
            return Err(ModelError::Batch(format!(
                "cached positions up to {end} are not all in the given {} blocks of the pool",
                block_table.len()
            )));
        }
        let slots: Vec<usize> = positions.map(|p| slot_of(block_table, bs, p)).collect();
        Ok(self.model.logits_at_slots(&self.kv, &slots))
    }

    fn model_identity(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        format!("{:?}", self.model.config).hash(&mut h);
        self.model.weight_bytes().hash(&mut h);
        h.finish()
    }

    fn has_adapter(&self, id: AdapterId) -> bool {
        self.model.has_adapter(id)
    }

    fn add_adapter(&mut self, adapter: LoraAdapter) -> Result<AdapterId> {
        self.model.add_adapter(adapter)
    }

    fn remove_adapter(&mut self, id: AdapterId) -> Result<()> {
        self.model.remove_adapter(id)
    }

    fn adapter_digest(&self, id: AdapterId) -> Option<u64> {
        self.model.adapter_digest(id)
    }

    fn kv_block_format(&self) -> Option<KvBlockFormat> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let (dtype, block_size) = (self.kv.dtype(), self.kv.block_size());
        let weights = *self
            .weights_digest
            .get_or_init(|| self.model.weights_digest());
        (
            self.model_identity(),
            weights,
            self.model.kernels().is_exact(),
        )
            .hash(&mut h);
        (format!("{dtype:?}"), block_size, self.kv.block_bytes()).hash(&mut h);
        Some(KvBlockFormat {
            compatibility: h.finish(),
            dtype,
            block_size,
            bytes_per_block: self.kv.block_bytes(),
        })
    }

    fn read_blocks(&mut self, blocks: &[BlockId], out: &mut Vec<u8>) -> Result<()> {
        out.reserve(blocks.len() * self.kv.block_bytes());
        blocks.iter().try_for_each(|&b| self.kv.read_block(b, out))
    }

    fn write_blocks(&mut self, blocks: &[BlockId], data: &[u8]) -> Result<()> {
        let size = self.kv.block_bytes();
        if data.len() != blocks.len() * size {
            return Err(ModelError::Batch(format!(
                "{} bytes for {} blocks of {size} bytes",
                data.len(),
                blocks.len()
            )));
        }
        let n = self.kv.num_blocks();
        if let Some(b) = blocks.iter().find(|b| b.0 as usize >= n) {
            return Err(ModelError::Batch(format!(
                "block {} is outside the pool of {n} blocks",
                b.0
            )));
        }
        for (&b, bytes) in blocks.iter().zip(data.chunks_exact(size)) {
            self.kv.write_block(b, bytes)?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "cpu ({} kernels, {} threads)",
            self.model.kernels().name(),
            self.model.threads()
        )
    }
}
