//! `--trace FILE` for every subcommand: the engine's step timeline written as Chrome trace
//! JSON (see `tandem_engine::trace`). Commands that drive a runner without the engine
//! (`score`, `bench` without `--engine`) wrap it in a [`TracedRunner`], which records each
//! forward pass as a step and each sequence (named by its first KV block) as a request.

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tandem_engine::trace::{MarkKind, Part, SeqSlice, StepClock, StepCounters, StepTrace, Work};
use tandem_engine::SeqId;
use tandem_model::batch::{AdapterId, BlockId, ForwardBatch, TokenId};
use tandem_model::logits::Logits;
use tandem_model::lora::LoraAdapter;
use tandem_model::row_sampling::RowDraw;
use tandem_model::runner::{KvGeometry, ModelRunner};
use tandem_model::token_pick::TokenPick;
use tandem_model::ModelConfig;

/// Writes `trace` as Chrome trace JSON to `path`.
pub fn write(trace: Option<&StepTrace>, path: Option<&Path>) -> Result<()> {
    let (Some(trace), Some(path)) = (trace, path) else {
        return Ok(());
    };
    let json = trace.to_chrome_json().to_string();
    std::fs::write(path, json).with_context(|| format!("--trace {}", path.display()))?;
    eprintln!("tandem: step trace written to {}", path.display());
    Ok(())
}

/// A runner that records every forward pass in a [`StepTrace`] and writes it to its file
/// when dropped.
#[derive(Debug)]
pub struct TracedRunner {
    inner: Box<dyn ModelRunner>,
    trace: StepTrace,
    path: PathBuf,
    seen: std::collections::HashSet<u64>,
    step: u64,
}

impl TracedRunner {
    /// `inner` itself when `path` is `None`, else `inner` traced into `path`.
    pub fn wrap(
        inner: Box<dyn ModelRunner>,
        path: Option<&Path>,
        capacity: usize,
    ) -> Box<dyn ModelRunner> {
        match path {
            None => inner,
            Some(p) => Box::new(TracedRunner {
                inner,
                trace: StepTrace::new(capacity),
                path: p.to_path_buf(),
                seen: Default::default(),
                step: 0,
            }),
        }
    }
}

impl TracedRunner {
    /// Runs `pass` on the inner runner as one traced step of `batch`.
    fn traced<T>(
        &mut self,
        batch: &ForwardBatch,
        pass: impl FnOnce(&mut dyn ModelRunner) -> T,
    ) -> T {
        let seqs: Vec<SeqSlice> = batch
            .seqs
            .iter()
            .map(|s| SeqSlice {
                seq_id: SeqId(s.block_table.first().map_or(0, |b| u64::from(b.0))),
                // A runner does not know prompts: a single new token after a context decodes.
                work: if s.len == 1 && s.num_cached > 0 {
                    Work::Decode
                } else {
                    Work::Prefill
                },
                tokens: s.len,
            })
            .collect();
        for s in &seqs {
            if self.seen.insert(s.seq_id.0) {
                self.trace.mark(s.seq_id, MarkKind::Arrived);
            }
        }
        let mut clock = StepClock::start();
        clock.mark(Part::Schedule);
        let out = pass(self.inner.as_mut());
        clock.mark(Part::Forward);
        let counters = StepCounters {
            running: seqs.len(),
            ..StepCounters::default()
        };
        self.trace
            .record(self.step, &clock, seqs, counters, Vec::new());
        self.step += 1;
        out
    }
}

impl Drop for TracedRunner {
    fn drop(&mut self) {
        if let Err(e) = write(Some(&self.trace), Some(&self.path)) {
            eprintln!("tandem: error: {e:#}");
        }
    }
}

impl ModelRunner for TracedRunner {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn kv_geometry(&self) -> KvGeometry {
        self.inner.kv_geometry()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> tandem_model::Result<Logits> {
        self.traced(batch, |inner| inner.forward(batch))
    }
    fn forward_logprobs(
        &mut self,
        batch: &ForwardBatch,
        targets: &[Option<TokenId>],
    ) -> tandem_model::Result<Vec<Option<f32>>> {
        self.traced(batch, |inner| inner.forward_logprobs(batch, targets))
    }
    fn forward_greedy(
        &mut self,
        batch: &ForwardBatch,
    ) -> tandem_model::Result<Vec<Option<TokenPick>>> {
        self.traced(batch, |inner| inner.forward_greedy(batch))
    }
    fn forward_greedy_tokens(
        &mut self,
        batch: &ForwardBatch,
    ) -> tandem_model::Result<Vec<Option<TokenId>>> {
        self.traced(batch, |inner| inner.forward_greedy_tokens(batch))
    }
    fn has_adapter(&self, id: AdapterId) -> bool {
        self.inner.has_adapter(id)
    }

    fn add_adapter(&mut self, adapter: LoraAdapter) -> tandem_model::Result<AdapterId> {
        self.inner.add_adapter(adapter)
    }

    fn remove_adapter(&mut self, id: AdapterId) -> tandem_model::Result<()> {
        self.inner.remove_adapter(id)
    }

    fn recycle_logits(&mut self, logits: Logits) {
        self.inner.recycle_logits(logits)
    }
    fn host_pool(&self) -> Option<&tandem_kernels::thread_pool::ThreadPool> {
        self.inner.host_pool()
    }
    fn samples_rows(&self) -> bool {
        self.inner.samples_rows()
    }
    fn forward_sample(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowDraw],
    ) -> tandem_model::Result<Vec<Option<TokenPick>>> {
        self.traced(batch, |inner| inner.forward_sample(batch, rows))
    }
    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> tandem_model::Result<()> {
        self.inner.copy_blocks(copies)
    }
    fn cached_logits(
        &mut self,
        table: &[BlockId],
        positions: Range<usize>,
    ) -> tandem_model::Result<Logits> {
        self.inner.cached_logits(table, positions)
    }
    fn model_identity(&self) -> u64 {
        self.inner.model_identity()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}
