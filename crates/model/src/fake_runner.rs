//! A runner without weights, for testing what sits above the seam (scheduler, block
//! allocator, prefix cache, preemption, speculation, the server) in microseconds.
//!
//! It behaves like a model in the one way those layers can get wrong: a row's logits are a
//! deterministic function of the whole token history *as read back from the KV pool*. Each
//! slot stores its token, its position and a hash chained from the previous position's slot,
//! and every new token checks the chain of its entire context through its block table. So a
//! wrong block table, a block copied or freed too early, or a prefix-cache hit on the wrong
//! tokens changes the logits or fails the forward pass — exactly as it would corrupt a real
//! model's attention.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tandem_kernels::thread_pool::ThreadPool;

use crate::batch::{BlockId, ForwardBatch, TokenId};
use crate::config::{Architecture, ModelConfig, RopeConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::kv_store::KvDtype;
use crate::logits::Logits;
use crate::runner::{check_block_copies, slot_of, KvGeometry, ModelRunner};

/// What one KV slot holds in the fake: the token, its position and the history hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FakeSlot {
    token: TokenId,
    pos: usize,
    /// Hash of tokens `0..=pos` of the sequence that wrote this slot.
    history: u64,
}

/// A weightless runner whose logits depend on the full token history in its KV pool.
#[derive(Debug)]
pub struct FakeRunner {
    config: ModelConfig,
    block_size: usize,
    /// `[num_blocks * block_size]` slots; `None` until written.
    slots: Vec<Option<FakeSlot>>,
    /// Model identity (two fakes with different salts are different models).
    salt: u64,
    forward_calls: usize,
    /// Threads lent to the engine ([`FakeRunner::lending_threads`]), and how often the
    /// engine asked for them.
    host_pool: Option<ThreadPool>,
    host_pool_asked: Arc<AtomicUsize>,
}

impl FakeRunner {
    /// A fake model of `vocab_size` tokens and `context_len` positions over a pool of
    /// `num_blocks` blocks of `block_size` slots; `salt` selects the function (a draft model
    /// with a different salt disagrees with the target).
    pub fn new(
        vocab_size: usize,
        context_len: usize,
        num_blocks: usize,
        block_size: usize,
        salt: u64,
    ) -> FakeRunner {
        assert!(vocab_size > 0 && block_size > 0 && num_blocks > 0);
        let config = ModelConfig {
            architecture: Architecture::Llama,
            vocab_size,
            hidden_size: 8,
            intermediate_size: 8,
            num_layers: 1,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope: RopeConfig {
                theta: 10000.0,
                style: RopeStyle::Neox,
                llama3_scaling: None,
            },
            context_len,
            tie_word_embeddings: true,
            qkv_bias: false,
            qk_norm: false,
            features: Default::default(),
        };
        FakeRunner {
            config,
            block_size,
            slots: vec![None; num_blocks * block_size],
            salt,
            forward_calls: 0,
            host_pool: None,
            host_pool_asked: Arc::default(),
        }
    }

    /// The same fake, lending the engine a pool of `threads` for its host work
    /// ([`ModelRunner::host_pool`]) as the CPU runner lends its kernel threads.
    pub fn lending_threads(mut self, threads: usize) -> FakeRunner {
        self.host_pool = Some(ThreadPool::new(threads));
        self
    }

    /// Forward passes run so far.
    pub fn forward_calls(&self) -> usize {
        self.forward_calls
    }

    /// A counter of the engine's requests for the runner's host pool (readable once the
    /// runner is the engine's).
    pub fn host_pool_asked(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.host_pool_asked)
    }

    /// The logits the fake gives after the history `tokens` (`[vocab_size]`): what a row
    /// whose context is exactly `tokens` returns.
    pub fn logits_after(&self, tokens: &[TokenId]) -> Vec<f32> {
        let mut h = self.salt;
        for &t in tokens {
            h = chain(h, t);
        }
        self.logits_of(h)
    }

    fn logits_of(&self, history: u64) -> Vec<f32> {
        (0..self.config.vocab_size as u64)
            .map(|v| {
                let bits = splitmix64(history ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                // 24 bits -> [-4, 4): distinct values, a clear winner per row.
                (bits >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
            })
            .collect()
    }

    /// The history hash at position `pos` of a sequence, checking the chain of every slot
    /// `0..=pos` of its block table.
    fn history_at(&self, table: &[BlockId], pos: usize) -> Result<u64> {
        let mut h = self.salt;
        for p in 0..=pos {
            let slot = self.slot(table, p)?;
            match self.slots[slot] {
                Some(s) if s.pos == p && s.history == chain(h, s.token) => h = s.history,
                Some(s) => {
                    return Err(ModelError::Batch(format!(
                        "fake KV slot {slot} for position {p} holds position {} of another history",
                        s.pos
                    )))
                }
                None => {
                    return Err(ModelError::Batch(format!(
                        "fake KV slot {slot} for position {p} was never written"
                    )))
                }
            }
        }
        Ok(h)
    }

    fn slot(&self, table: &[BlockId], pos: usize) -> Result<usize> {
        let slot = table
            .get(pos / self.block_size)
            .map(|_| slot_of(table, self.block_size, pos))
            .filter(|&s| s < self.slots.len());
        slot.ok_or_else(|| ModelError::Batch(format!("position {pos} has no block in the pool")))
    }
}

impl ModelRunner for FakeRunner {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_geometry(&self) -> KvGeometry {
        KvGeometry {
            block_size: self.block_size,
            num_blocks: self.slots.len() / self.block_size,
            dtype: KvDtype::F32,
            bytes_per_token: std::mem::size_of::<FakeSlot>(),
        }
    }

    fn host_pool(&self) -> Option<&ThreadPool> {
        self.host_pool_asked.fetch_add(1, Ordering::Relaxed);
        self.host_pool.as_ref()
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits> {
        let num_blocks = self.slots.len() / self.block_size;
        batch.validate(self.config.vocab_size, self.block_size, num_blocks)?;
        self.forward_calls += 1;
        let mut histories = Vec::with_capacity(batch.num_tokens()); // [num_tokens]
        for s in &batch.seqs {
            let mut h = match s.num_cached {
                0 => self.salt,
                n => self.history_at(&s.block_table, n - 1)?,
            };
            for (i, &token) in batch.tokens[s.start..s.start + s.len].iter().enumerate() {
                let pos = s.num_cached + i;
                h = chain(h, token);
                let slot = self.slot(&s.block_table, pos)?;
                self.slots[slot] = Some(FakeSlot {
                    token,
                    pos,
                    history: h,
                });
                histories.push(h);
            }
        }
        let rows = batch.output_rows();
        let mut data = Vec::with_capacity(rows.len() * self.config.vocab_size);
        for &r in &rows {
            data.extend(self.logits_of(histories[r]));
        }
        Ok(Logits::new(rows, self.config.vocab_size, data))
    }

    fn copy_blocks(&mut self, copies: &[(BlockId, BlockId)]) -> Result<()> {
        let bs = self.block_size;
        check_block_copies(copies, self.slots.len() / bs)?;
        for &(src, dst) in copies {
            let (s, d) = (src.0 as usize, dst.0 as usize);
            self.slots.copy_within(s * bs..(s + 1) * bs, d * bs);
        }
        Ok(())
    }

    fn cached_logits(
        &mut self,
        block_table: &[BlockId],
        positions: Range<usize>,
    ) -> Result<Logits> {
        let rows: Vec<usize> = (0..positions.len()).collect();
        let mut data = Vec::with_capacity(rows.len() * self.config.vocab_size);
        for pos in positions {
            let h = self.history_at(block_table, pos)?;
            data.extend(self.logits_of(h));
        }
        Ok(Logits::new(rows, self.config.vocab_size, data))
    }

    fn model_identity(&self) -> u64 {
        splitmix64(self.salt ^ self.config.vocab_size as u64)
    }

    fn describe(&self) -> String {
        format!("fake (vocab {}, no weights)", self.config.vocab_size)
    }
}

/// The history hash after appending `token` to history `h`.
fn chain(h: u64, token: TokenId) -> u64 {
    splitmix64(h ^ splitmix64(u64::from(token.0) + 1))
}

/// One round of the SplitMix64 mixer.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::OutputSelection;

    fn ids(v: &[u32]) -> Vec<TokenId> {
        v.iter().map(|&t| TokenId(t)).collect()
    }

    #[test]
    fn chunked_forward_equals_whole_and_logits_after() {
        let tokens = ids(&[3, 1, 4, 1, 5, 9, 2, 6]);
        let table = vec![BlockId(2), BlockId(0)];
        let mut whole = FakeRunner::new(32, 64, 4, 4, 7);
        let all = whole
            .forward(&ForwardBatch::single(
                tokens.clone(),
                0,
                table.clone(),
                OutputSelection::All,
            ))
            .expect("whole");
        let mut chunked = FakeRunner::new(32, 64, 4, 4, 7);
        let first =
            ForwardBatch::single(tokens[..5].to_vec(), 0, table.clone(), OutputSelection::All);
        chunked.forward(&first).expect("first chunk");
        let rest = ForwardBatch::single(
            tokens[5..].to_vec(),
            5,
            table.clone(),
            OutputSelection::Last,
        );
        let last = chunked.forward(&rest).expect("second chunk");
        assert_eq!(last.row(0), all.row(7));
        assert_eq!(all.row(7), &whole.logits_after(&tokens)[..]);
        let cached = chunked.cached_logits(&table, 2..5).expect("cached");
        assert_eq!(cached.row(0), all.row(2));
    }

    #[test]
    fn a_wrong_block_table_is_caught() {
        let mut fake = FakeRunner::new(32, 64, 4, 4, 7);
        let table = vec![BlockId(1), BlockId(3)];
        let batch = ForwardBatch::single(ids(&[1, 2, 3, 4, 5]), 0, table, OutputSelection::Last);
        fake.forward(&batch).expect("prefill");
        let wrong = vec![BlockId(1), BlockId(2)];
        let next = ForwardBatch::single(ids(&[6]), 5, wrong, OutputSelection::Last);
        assert!(fake.forward(&next).is_err());
    }
}
