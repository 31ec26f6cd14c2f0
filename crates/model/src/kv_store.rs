//! The physical KV store: fixed-size blocks of token slots, per layer, for keys and values.
//!
//! Which block belongs to which sequence is decided elsewhere (the engine's block
//! allocator); here a block is just storage. A token at position `p` of a sequence with
//! block table `t` lives in slot `t[p / block_size] * block_size + p % block_size`.
//!
//! Beside the keys and values, each slot keeps the token's final hidden state (after the
//! final norm: the LM head's input), so that the logits of a position whose K/V were reused
//! from the prefix cache can be produced again, bitwise equal, by the LM head alone
//! ([`crate::transformer::Model::logits_at_slots`]) — scoring a cached prompt costs one
//! matrix product per position instead of a whole forward pass. It adds `hidden_size` floats
//! per token to the `2 * num_layers * kv_dim` of the keys and values (about 5% for the
//! default model).

use crate::batch::BlockId;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// Keys and values of every layer, in blocks of `block_size` token slots.
#[derive(Debug)]
pub struct KvStore {
    block_size: usize,
    num_blocks: usize,
    /// Floats per token slot in one layer: `num_kv_heads * head_dim`.
    kv_dim: usize,
    /// Per layer: `[num_blocks * block_size, kv_dim]`.
    keys: Vec<Vec<f32>>,
    /// Per layer: `[num_blocks * block_size, kv_dim]`.
    values: Vec<Vec<f32>>,
    /// Floats of one final hidden state.
    hidden_size: usize,
    /// `[num_blocks * block_size, hidden_size]` final (normed) hidden states.
    hidden: Vec<f32>,
}

impl KvStore {
    /// Allocates a zeroed store of `num_blocks` blocks for `config`'s layers.
    pub fn new(config: &ModelConfig, block_size: usize, num_blocks: usize) -> Result<KvStore> {
        if block_size == 0 || num_blocks == 0 {
            return Err(ModelError::Batch(
                "KV store needs a positive block size and count".into(),
            ));
        }
        let kv_dim = config.kv_dim();
        let per_layer = num_blocks
            .checked_mul(block_size)
            .and_then(|s| s.checked_mul(kv_dim))
            .ok_or_else(|| ModelError::Batch("KV store size overflows".into()))?;
        let layer = || vec![0.0f32; per_layer];
        let hidden_size = config.hidden_size;
        let hidden_len = (num_blocks * block_size)
            .checked_mul(hidden_size)
            .ok_or_else(|| ModelError::Batch("KV store size overflows".into()))?;
        Ok(KvStore {
            block_size,
            num_blocks,
            kv_dim,
            hidden_size,
            hidden: vec![0.0f32; hidden_len],
            keys: (0..config.num_layers).map(|_| layer()).collect(),
            values: (0..config.num_layers).map(|_| layer()).collect(),
        })
    }

    /// Bytes one token occupies: keys and values of all layers, and its final hidden state.
    pub fn bytes_per_token(config: &ModelConfig) -> usize {
        (2 * config.num_layers * config.kv_dim() + config.hidden_size) * std::mem::size_of::<f32>()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Total token slots.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// The slot of position `pos` for a sequence with `block_table`.
    pub fn slot(&self, block_table: &[BlockId], pos: usize) -> usize {
        block_table[pos / self.block_size].0 as usize * self.block_size + pos % self.block_size
    }

    /// Stores one token's key and value rows (`[kv_dim]` each) of `layer` at `slot`.
    pub fn write(&mut self, layer: usize, slot: usize, key: &[f32], value: &[f32]) {
        let r = slot * self.kv_dim..(slot + 1) * self.kv_dim;
        self.keys[layer][r.clone()].copy_from_slice(key);
        self.values[layer][r].copy_from_slice(value);
    }

    /// Stores one token's final hidden state (`[hidden_size]`) at `slot`.
    pub fn write_hidden(&mut self, slot: usize, row: &[f32]) {
        let h = self.hidden_size;
        self.hidden[slot * h..(slot + 1) * h].copy_from_slice(row);
    }

    /// The final hidden state stored at `slot`.
    pub fn hidden_row(&self, slot: usize) -> &[f32] {
        let h = self.hidden_size;
        &self.hidden[slot * h..(slot + 1) * h]
    }

    /// Keys of `layer`: `[num_slots, kv_dim]`.
    pub fn layer_keys(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }

    /// Values of `layer`: `[num_slots, kv_dim]`.
    pub fn layer_values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }

    /// Floats per slot in one layer.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Copies every slot of block `src` into block `dst`, keys and values of every layer
    /// (copy-on-write of a shared block before one of its holders writes into it).
    /// `src == dst` is a no-op. Panics on a block outside the store (the engine's allocator
    /// only hands out ids below `num_blocks`).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) {
        let (s, d) = (src.0 as usize, dst.0 as usize);
        assert!(
            s < self.num_blocks && d < self.num_blocks,
            "block ids {s} and {d} must be below {}",
            self.num_blocks
        );
        if s == d {
            return;
        }
        let len = self.block_size * self.kv_dim; // floats per block per layer
        for layer in self.keys.iter_mut().chain(self.values.iter_mut()) {
            layer.copy_within(s * len..(s + 1) * len, d * len);
        }
        let len = self.block_size * self.hidden_size;
        self.hidden.copy_within(s * len..(s + 1) * len, d * len);
    }
}
