//! [`QueuedRunner`]: any runner behind the overlapping API
//! ([`ModelRunner::launch_sample`], [`ModelRunner::collect_picks`]), each step run when it
//! is launched.
//!
//! It is the reference of what an overlapping runner returns (the picks `forward_sample`
//! gives for the batch with its carried tokens filled in) and lets the engine's overlapped
//! loop run, and be tested, over any runner. It gains no time: the step has run by the time
//! `launch_sample` returns.

use std::collections::VecDeque;
use std::ops::Range;

use crate::batch::{AdapterId, BlockId, CarriedToken, ForwardBatch, TokenId};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::logits::Logits;
use crate::lora::LoraAdapter;
use crate::row_sampling::RowDraw;
use crate::runner::{KvBlockFormat, KvGeometry, ModelRunner};
use crate::token_pick::TokenPick;

/// Launched steps not collected at a time, at most.
const MAX_LAUNCHED: usize = 2;

/// A runner that overlaps steps in name: launches run at once and queue their picks.
#[derive(Debug)]
pub struct QueuedRunner {
    inner: Box<dyn ModelRunner>,
    /// Picks of launched steps not collected yet, oldest first.
    queue: VecDeque<Vec<Option<TokenPick>>>,
    /// The tokens the step launched last picked (what the next launch's carried rows read).
    last: Vec<Option<TokenId>>,
}

impl QueuedRunner {
    pub fn new(inner: Box<dyn ModelRunner>) -> QueuedRunner {
        QueuedRunner {
            inner,
            queue: VecDeque::new(),
            last: Vec::new(),
        }
    }

    /// Launched steps not yet collected.
    pub fn num_launched(&self) -> usize {
        self.queue.len()
    }

    fn launch(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
        carried: &[CarriedToken],
    ) -> Result<()> {
        if self.queue.len() >= MAX_LAUNCHED {
            return Err(ModelError::Batch(format!(
                "{MAX_LAUNCHED} launched steps are not collected yet"
            )));
        }
        let mut batch = batch.clone();
        let mut rows = rows.to_vec();
        let outputs = batch.output_rows();
        for c in carried {
            let from = self.last.get(c.from_output).ok_or_else(|| {
                ModelError::Batch(format!(
                    "carried token from output row {} of a step with {}",
                    c.from_output,
                    self.last.len()
                ))
            })?;
            let slot = batch.tokens.get_mut(c.row).ok_or_else(|| {
                ModelError::Batch(format!(
                    "carried token for row {} of a smaller batch",
                    c.row
                ))
            })?;
            *slot = from.unwrap_or(TokenId(0));
            // The carried token is output the row's penalties count (a failed pick is no
            // token: its row is discarded, and nothing is counted, as on a device).
            let out = outputs.binary_search(&c.row).map_err(|_| {
                ModelError::Batch(format!("carried row {} is not an output row", c.row))
            })?;
            if let (Some(draw), Some(token)) = (rows.get_mut(out), from) {
                draw.processing = draw.processing.with_output(token.0);
            }
        }
        let picks = self.inner.forward_sample(&batch, &rows)?;
        self.last = picks.iter().map(|p| p.as_ref().map(|p| p.token)).collect();
        self.queue.push_back(picks);
        Ok(())
    }

    /// Forgets every launched step (after an error, as the contract says).
    fn drop_launched(&mut self) {
        self.queue.clear();
        self.last.clear();
    }
}

impl ModelRunner for QueuedRunner {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }

    fn kv_geometry(&self) -> KvGeometry {
        self.inner.kv_geometry()
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits> {
        self.inner.forward(batch)
    }

    fn forward_logprobs(
        &mut self,
        batch: &ForwardBatch,
        targets: &[Option<TokenId>],
    ) -> Result<Vec<Option<f32>>> {
        self.inner.forward_logprobs(batch, targets)
    }

    fn forward_greedy(&mut self, batch: &ForwardBatch) -> Result<Vec<Option<TokenPick>>> {
        self.inner.forward_greedy(batch)
    }

    fn forward_greedy_tokens(&mut self, batch: &ForwardBatch) -> Result<Vec<Option<TokenId>>> {
        self.inner.forward_greedy_tokens(batch)
    }

    fn recycle_logits(&mut self, logits: Logits) {
        self.inner.recycle_logits(logits)
    }

    fn has_adapter(&self, id: AdapterId) -> bool {
        self.inner.has_adapter(id)
    }

    fn add_adapter(&mut self, adapter: LoraAdapter) -> Result<AdapterId> {
        self.inner.add_adapter(adapter)
    }

    fn remove_adapter(&mut self, id: AdapterId) -> Result<()> {
        self.inner.remove_adapter(id)
    }

    fn host_pool(&self) -> Option<&tandem_kernels::thread_pool::ThreadPool> {
        self.inner.host_pool()
    }

    /// Yes: launched steps choose their rows (the inner runner's `forward_sample`).
    fn samples_rows(&self) -> bool {
        true
    }

    fn forward_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
    ) -> Result<Vec<Option<TokenPick>>> {
        self.inner.forward_sample(batch, rows)
    }

    fn overlaps_steps(&self) -> bool {
        true
    }

    fn launch_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
        carried: &[CarriedToken],
    ) -> Result<()> {
        let launched = self.launch(batch, rows, carried);
        if launched.is_err() {
            self.drop_launched();
        }
        launched
    }

    fn collect_picks(&mut self) -> Result<Vec<Option<TokenPick>>> {
        self.queue
            .pop_front()
            .ok_or_else(|| ModelError::Batch("no launched step to collect".to_string()))
    }

    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> Result<()> {
        self.inner.copy_blocks(copies)
    }

    fn cached_logits(
        &mut self,
        block_table: &[BlockId],
        positions: Range<usize>,
    ) -> Result<Logits> {
        self.inner.cached_logits(block_table, positions)
    }

    fn kv_block_format(&self) -> Option<KvBlockFormat> {
        self.inner.kv_block_format()
    }

    fn adapter_digest(&self, id: AdapterId) -> Option<u64> {
        self.inner.adapter_digest(id)
    }

    fn read_blocks(&mut self, blocks: &[BlockId], out: &mut Vec<u8>) -> Result<()> {
        self.inner.read_blocks(blocks, out)
    }

    fn write_blocks(&mut self, blocks: &[BlockId], data: &[u8]) -> Result<()> {
        self.inner.write_blocks(blocks, data)
    }

    fn model_identity(&self) -> u64 {
        self.inner.model_identity()
    }

    fn describe(&self) -> String {
        format!("{} (steps queued at launch)", self.inner.describe())
    }
}
