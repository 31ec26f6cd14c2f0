//! The flattened, variable-length batch that every forward pass takes (ARCHITECTURE.md § The
//! forward pass).
//!
//! Scoring, prefill, decode and speculative verification are all the same thing here: some
//! new tokens per sequence, written into the KV store at given slots, attending to the
//! sequence's cached past through its block table, with logits for a chosen set of rows.

use crate::error::{ModelError, Result};
pub use crate::lora::AdapterId;
use crate::lora::AdapterRows;

/// A token id of the model's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenId(pub u32);

/// Index of a physical KV block in the [`crate::kv_store::KvStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// Which rows of the flat batch need logits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputSelection {
    /// Every row (scoring, prompt logprobs, speculative verification).
    All,
    /// The last row of each sequence (ordinary generation).
    Last,
    /// Explicit flat row indices, strictly increasing.
    Rows(Vec<usize>),
}

/// One sequence's part of a [`ForwardBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSpan {
    /// First row of this sequence in the flat token array.
    pub start: usize,
    /// Number of new tokens (rows) of this sequence.
    pub len: usize,
    /// Tokens already in the KV store before this step; the new tokens sit at positions
    /// `num_cached..num_cached + len`.
    pub num_cached: usize,
    /// Physical blocks holding positions `0..num_cached + len`, in order.
    pub block_table: Vec<BlockId>,
    /// The LoRA adapter this sequence runs with, if any (registered with the model).
    pub adapter: Option<AdapterId>,
}

impl SeqSpan {
    /// Context length after this step: cached plus new tokens.
    pub fn context_len(&self) -> usize {
        self.num_cached + self.len
    }
}

/// A token of a batch that an earlier step chose and that has not crossed to the host: the
/// runner takes it from that step's picks where they are (see
/// [`crate::runner::ModelRunner::launch_sample`]). The batch holds a placeholder id there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CarriedToken {
    /// The flat row of the batch whose token this is.
    pub row: usize,
    /// The output row of the step launched before whose pick it is.
    pub from_output: usize,
}

/// A flattened batch: the new tokens of all scheduled sequences, concatenated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardBatch {
    /// `[num_tokens]` new token ids of all sequences, concatenated.
    pub tokens: Vec<TokenId>,
    /// The sequences, in flat order; spans tile `0..tokens.len()` without gaps.
    pub seqs: Vec<SeqSpan>,
    /// Which rows get logits.
    pub output: OutputSelection,
}

impl ForwardBatch {
    /// A batch holding one sequence's new tokens.
    pub fn single(
        tokens: Vec<TokenId>,
        num_cached: usize,
        block_table: Vec<BlockId>,
        output: OutputSelection,
    ) -> ForwardBatch {
        let len = tokens.len();
        ForwardBatch {
            tokens,
            seqs: vec![SeqSpan {
                start: 0,
                len,
                num_cached,
                block_table,
                adapter: None,
            }],
            output,
        }
    }

    /// Number of new tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Position of every new token: `[num_tokens]`.
    pub fn positions(&self) -> Vec<usize> {
        let mut pos = Vec::with_capacity(self.tokens.len());
        for s in &self.seqs {
            pos.extend(s.num_cached..s.num_cached + s.len);
        }
        pos
    }

    /// The flat rows that need logits, in increasing order.
    pub fn output_rows(&self) -> Vec<usize> {
        match &self.output {
            OutputSelection::All => (0..self.tokens.len()).collect(),
            OutputSelection::Last => self.seqs.iter().map(|s| s.start + s.len - 1).collect(),
            OutputSelection::Rows(r) => r.clone(),
        }
    }

    /// Which rows run with which adapter: a run per sequence that names one.
    pub fn adapter_rows(&self) -> AdapterRows {
        let runs = self
            .seqs
            .iter()
            .filter_map(|s| Some((s.start..s.start + s.len, s.adapter?)));
        AdapterRows::new(runs)
    }

    /// Checks the batch's internal consistency against the store's geometry.
    pub fn validate(&self, vocab_size: usize, block_size: usize, num_blocks: usize) -> Result<()> {
        let err = |m: String| Err(ModelError::Batch(m));
        let mut next = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            if s.start != next || s.len == 0 {
                return err(format!(
                    "sequence {i} span must start at {next} and be non-empty"
                ));
            }
            next = s.start + s.len;
            let needed = s.context_len().div_ceil(block_size);
            if s.block_table.len() < needed {
                return err(format!(
                    "sequence {i} needs {needed} blocks for {} tokens, has {}",
                    s.context_len(),
                    s.block_table.len()
                ));
            }
            if let Some(b) = s.block_table.iter().find(|b| b.0 as usize >= num_blocks) {
                return err(format!(
                    "sequence {i} references block {} of {num_blocks}",
                    b.0
                ));
            }
        }
        if next != self.tokens.len() {
            return err(format!(
                "spans cover {next} of {} tokens",
                self.tokens.len()
            ));
        }
        if let Some(t) = self.tokens.iter().find(|t| t.0 as usize >= vocab_size) {
            return err(format!(
                "token id {} is outside the vocabulary of {vocab_size}",
                t.0
            ));
        }
        if let OutputSelection::Rows(rows) = &self.output {
            if rows.windows(2).any(|w| w[0] >= w[1]) || rows.last().is_some_and(|&r| r >= next) {
                return err("output rows must be increasing and inside the batch".into());
            }
        }
        Ok(())
    }
}
