//! A block's contents as bytes, to move KV blocks between instances (disaggregated prefill,
//! see `ARCHITECTURE.md` § KV transfer).
//!
//! A block travels exactly as it is stored, so that the receiving store holds bitwise what
//! the sending one computed: for every layer in order, the block's key rows then its value
//! rows (for [`KvDtype::Q8`]: key codes, value codes, key scales, value scales), then the
//! final hidden states of its slots (f32). Every element is little-endian, whatever the
//! machine.

use half::f16;

use super::{KvStore, Layers, Planes};
use crate::batch::BlockId;
use crate::error::{ModelError, Result};

/// An element type of a store, with its little-endian byte form.
pub(super) trait WireElement: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

impl WireElement for f32 {
    const SIZE: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl WireElement for f16 {
    const SIZE: usize = 2;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> f16 {
        f16::from_le_bytes([b[0], b[1]])
    }
}

impl WireElement for i8 {
    const SIZE: usize = 1;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> i8 {
        i8::from_le_bytes([b[0]])
    }
}

fn put_all<T: WireElement>(rows: &[T], out: &mut Vec<u8>) {
    out.reserve(rows.len() * T::SIZE);
    for &x in rows {
        x.put(out);
    }
}

/// Fills `rows` from the front of `bytes`; returns the rest.
fn get_all<'a, T: WireElement>(rows: &mut [T], bytes: &'a [u8]) -> &'a [u8] {
    let (head, rest) = bytes.split_at(rows.len() * T::SIZE);
    for (x, b) in rows.iter_mut().zip(head.chunks_exact(T::SIZE)) {
        *x = T::get(b);
    }
    rest
}

impl<T: WireElement> Planes<T> {
    /// Elements `r` of layer `layer`'s keys, then of its values.
    fn put_layer(&self, layer: usize, r: std::ops::Range<usize>, out: &mut Vec<u8>) {
        put_all(&self.keys[layer][r.clone()], out);
        put_all(&self.values[layer][r], out);
    }

    fn get_layer<'a>(&mut self, layer: usize, r: std::ops::Range<usize>, b: &'a [u8]) -> &'a [u8] {
        let b = get_all(&mut self.keys[layer][r.clone()], b);
        get_all(&mut self.values[layer][r], b)
    }
}

impl KvStore {
    /// The bytes one block takes in transfer: [`KvStore::bytes_per_token`] per slot.
    pub fn block_bytes(&self) -> usize {
        let per_slot = match &self.layers {
            Layers::F32(_) => 2 * 4 * self.kv_dim,
            Layers::F16(_) => 2 * 2 * self.kv_dim,
            Layers::Q8 { .. } => 2 * (self.kv_dim + 4 * (self.kv_dim / super::Q8_GROUP)),
        };
        let layers = self.num_layers();
        self.block_size * (layers * per_slot + 4 * self.hidden_size)
    }

    fn num_layers(&self) -> usize {
        match &self.layers {
            Layers::F32(p) => p.keys.len(),
            Layers::F16(p) => p.keys.len(),
            Layers::Q8 { codes, .. } => codes.keys.len(),
        }
    }

    fn check_block(&self, block: BlockId) -> Result<usize> {
        let b = block.0 as usize;
        if b >= self.num_blocks {
            return Err(ModelError::Batch(format!(
                "block {b} is outside the pool of {} blocks",
                self.num_blocks
            )));
        }
        Ok(b)
    }

    /// Appends block `block`'s contents to `out` ([`KvStore::block_bytes`] bytes, in the
    /// order of the module doc).
    pub fn read_block(&self, block: BlockId, out: &mut Vec<u8>) -> Result<()> {
        let b = self.check_block(block)?;
        let r = b * self.block_size * self.kv_dim..(b + 1) * self.block_size * self.kv_dim;
        for layer in 0..self.num_layers() {
            match &self.layers {
                Layers::F32(p) => p.put_layer(layer, r.clone(), out),
                Layers::F16(p) => p.put_layer(layer, r.clone(), out),
                Layers::Q8 { codes, scales } => {
                    codes.put_layer(layer, r.clone(), out);
                    let g = r.start / super::Q8_GROUP..r.end / super::Q8_GROUP;
                    scales.put_layer(layer, g, out);
                }
            }
        }
        let h = self.block_size * self.hidden_size;
        put_all(&self.hidden[b * h..(b + 1) * h], out);
        Ok(())
    }

    /// Overwrites block `block` with contents [`KvStore::read_block`] wrote from a store of
    /// the same model, dtype and block size; `bytes` must be exactly one block's.
    pub fn write_block(&mut self, block: BlockId, bytes: &[u8]) -> Result<()> {
        let b = self.check_block(block)?;
        if bytes.len() != self.block_bytes() {
            return Err(ModelError::Batch(format!(
                "a block of this {:?} store takes {} bytes, not {}",
                self.dtype(),
                self.block_bytes(),
                bytes.len()
            )));
        }
        let r = b * self.block_size * self.kv_dim..(b + 1) * self.block_size * self.kv_dim;
        let mut rest = bytes;
        for layer in 0..self.num_layers() {
            rest = match &mut self.layers {
                Layers::F32(p) => p.get_layer(layer, r.clone(), rest),
                Layers::F16(p) => p.get_layer(layer, r.clone(), rest),
                Layers::Q8 { codes, scales } => {
                    let rest = codes.get_layer(layer, r.clone(), rest);
                    let g = r.start / super::Q8_GROUP..r.end / super::Q8_GROUP;
                    scales.get_layer(layer, g, rest)
                }
            };
        }
        let h = self.block_size * self.hidden_size;
        get_all(&mut self.hidden[b * h..(b + 1) * h], rest);
        Ok(())
    }
}
