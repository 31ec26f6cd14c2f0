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
//! matrix product per position instead of a whole forward pass. It adds `hidden_size` f32 per
//! token to the `2 * num_layers * kv_dim` elements of the keys and values (about 5% of an
//! f32 cache for the default model, 10% of an f16 one).
//!
//! Keys and values are stored as f32, f16 or 8-bit codes with a scale per 32 elements
//! ([`KvDtype`]); the attention kernels widen f16 exactly and dequantize the codes the same
//! way in every variant as they load them, so the numeric contract of
//! `tandem_kernels::attention` holds for all three: a token's K/V are rounded once, when they
//! are written, and every later read (decode, scoring, a prefill chunk) sees the same values.

use half::f16;
use half::slice::HalfFloatSliceExt;
use tandem_kernels::attention::{KvRows, Q8Rows, Q8_GROUP};
use tandem_kernels::huge_pages::{zeroed_vec, ZeroBits};
use tandem_kernels::kv_quant::quantize_q8;

use crate::batch::BlockId;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
pub use crate::runner::KvDtype;

mod transfer;

/// Per layer: `[num_blocks * block_size, kv_dim]` keys, and values alike, of one element type.
#[derive(Debug)]
struct Planes<T> {
    keys: Vec<Vec<T>>,
    values: Vec<Vec<T>>,
}

impl<T: ZeroBits> Planes<T> {
    /// Zeroed untouched memory on huge pages: resident only once written, and a decode step's
    /// scattered block reads do not miss the TLB at every block.
    fn zeroed(num_layers: usize, per_layer: usize) -> Planes<T> {
        Planes {
            keys: (0..num_layers).map(|_| zeroed_vec(per_layer)).collect(),
            values: (0..num_layers).map(|_| zeroed_vec(per_layer)).collect(),
        }
    }

    /// Copies elements `src` to `dst..` in every layer's keys and values.
    fn copy_within(&mut self, src: std::ops::Range<usize>, dst: usize) {
        for layer in self.keys.iter_mut().chain(self.values.iter_mut()) {
            layer.copy_within(src.clone(), dst);
        }
    }
}

#[derive(Debug)]
enum Layers {
    F32(Planes<f32>),
    F16(Planes<f16>),
    /// 8-bit codes `[slots, kv_dim]` and their scales `[slots, kv_dim / Q8_GROUP]`.
    Q8 {
        codes: Planes<i8>,
        scales: Planes<f32>,
    },
}

/// Keys and values of every layer, in blocks of `block_size` token slots.
#[derive(Debug)]
pub struct KvStore {
    block_size: usize,
    num_blocks: usize,
    /// Elements per token slot in one layer: `num_kv_heads * head_dim`.
    kv_dim: usize,
    layers: Layers,
    /// Floats of one final hidden state.
    hidden_size: usize,
    /// `[num_blocks * block_size, hidden_size]` final (normed) hidden states (always f32:
    /// the LM head must see exactly what the forward pass saw).
    hidden: Vec<f32>,
}

impl KvStore {
    /// Allocates a zeroed store of `num_blocks` blocks for `config`'s layers, keys and values
    /// in f32 (see [`crate::transformer::Model::default_kv_dtype`] for a model's default).
    pub fn new(config: &ModelConfig, block_size: usize, num_blocks: usize) -> Result<KvStore> {
        KvStore::with_dtype(config, block_size, num_blocks, KvDtype::F32)
    }

    /// [`KvStore::new`] with keys and values stored as `dtype`.
    pub fn with_dtype(
        config: &ModelConfig,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Result<KvStore> {
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
        let hidden_size = config.hidden_size;
        let hidden_len = (num_blocks * block_size)
            .checked_mul(hidden_size)
            .ok_or_else(|| ModelError::Batch("KV store size overflows".into()))?;
        let n = config.num_layers;
        let layers = match dtype {
            KvDtype::F32 => Layers::F32(Planes::zeroed(n, per_layer)),
            KvDtype::F16 => Layers::F16(Planes::zeroed(n, per_layer)),
            KvDtype::Q8 => {
                let fits = |x: usize| x.is_multiple_of(Q8_GROUP);
                if !fits(config.head_dim) || !fits(kv_dim) {
                    return Err(ModelError::Batch(format!(
                        "an 8-bit (q8) KV cache needs a head dimension that is a multiple of \
                         {Q8_GROUP}; this model's is {}",
                        config.head_dim
                    )));
                }
                Layers::Q8 {
                    codes: Planes::zeroed(n, per_layer),
                    scales: Planes::zeroed(n, per_layer / Q8_GROUP),
                }
            }
            KvDtype::Bf16 => {
                return Err(ModelError::Batch(
                    "the CPU KV store holds f32, f16 or q8, not bf16".into(),
                ))
            }
        };
        Ok(KvStore {
            block_size,
            num_blocks,
            kv_dim,
            hidden_size,
            hidden: zeroed_vec(hidden_len),
            layers,
        })
    }

    /// Bytes one token occupies with keys and values as `dtype`: keys and values of all
    /// layers, and its final hidden state (f32).
    pub fn bytes_per_token(config: &ModelConfig, dtype: KvDtype) -> usize {
        2 * config.num_layers * dtype.row_bytes(config.kv_dim())
            + config.hidden_size * std::mem::size_of::<f32>()
    }

    /// How keys and values are stored.
    pub fn dtype(&self) -> KvDtype {
        match self.layers {
            Layers::F32(_) => KvDtype::F32,
            Layers::F16(_) => KvDtype::F16,
            Layers::Q8 { .. } => KvDtype::Q8,
        }
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
        crate::runner::slot_of(block_table, self.block_size, pos)
    }

    /// Stores one token's key and value rows (`[kv_dim]` each) of `layer` at `slot`.
    /// f16 stores round to nearest, ties to even; q8 stores quantize each group of
    /// [`Q8_GROUP`] elements ([`quantize_q8`]).
    pub fn write(&mut self, layer: usize, slot: usize, key: &[f32], value: &[f32]) {
        let r = slot * self.kv_dim..(slot + 1) * self.kv_dim;
        match &mut self.layers {
            Layers::F32(p) => {
                p.keys[layer][r.clone()].copy_from_slice(key);
                p.values[layer][r].copy_from_slice(value);
            }
            Layers::F16(p) => {
                p.keys[layer][r.clone()].convert_from_f32_slice(key);
                p.values[layer][r].convert_from_f32_slice(value);
            }
            Layers::Q8 { codes, scales } => {
                let g = r.start / Q8_GROUP..r.end / Q8_GROUP;
                quantize_q8(
                    key,
                    &mut codes.keys[layer][r.clone()],
                    &mut scales.keys[layer][g.clone()],
                );
                quantize_q8(
                    value,
                    &mut codes.values[layer][r],
                    &mut scales.values[layer][g],
                );
            }
        }
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

    /// Keys and values of `layer`: `[num_slots, kv_dim]` each.
    pub fn layer(&self, layer: usize) -> KvRows<'_> {
        match &self.layers {
            Layers::F32(p) => KvRows::F32 {
                keys: &p.keys[layer],
                values: &p.values[layer],
            },
            Layers::F16(p) => KvRows::F16 {
                keys: &p.keys[layer],
                values: &p.values[layer],
            },
            Layers::Q8 { codes, scales } => KvRows::Q8 {
                keys: Q8Rows {
                    codes: &codes.keys[layer],
                    scales: &scales.keys[layer],
                },
                values: Q8Rows {
                    codes: &codes.values[layer],
                    scales: &scales.values[layer],
                },
            },
        }
    }

    /// Elements per slot in one layer.
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
        let len = self.block_size * self.kv_dim; // elements per block per layer
        let (src, dst) = (s * len..(s + 1) * len, d * len);
        match &mut self.layers {
            Layers::F32(p) => p.copy_within(src, dst),
            Layers::F16(p) => p.copy_within(src, dst),
            Layers::Q8 { codes, scales } => {
                let g = |x: usize| x / Q8_GROUP;
                scales.copy_within(g(src.start)..g(src.end), g(dst));
                codes.copy_within(src, dst);
            }
        }
        let len = self.block_size * self.hidden_size;
        self.hidden.copy_within(s * len..(s + 1) * len, d * len);
    }
}
