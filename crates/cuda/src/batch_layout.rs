//! The host-side description of a forward batch that the kernels read: token ids,
//! positions, each token's sequence and KV slot, the sequences' block tables, RoPE angles
//! and the slots of the rows that need logits. Built and checked on the host, then uploaded.

use std::ops::Range;

use tandem_model::batch::{BlockId, ForwardBatch};
use tandem_model::runner::slot_of;

use crate::error::CudaError;

/// A model's RoPE inverse frequencies (`[head_dim / 2]`): the model's, with its scaling and
/// frequency factors applied, and those of its sliding-window layers when they differ
/// (Gemma 3's local base).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RopeFreqs {
    pub global: Vec<f32>,
    pub local: Option<Vec<f32>>,
}

/// Index arrays of one batch, in the layouts the kernels take.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BatchLayout {
    /// `[n]` token ids.
    pub tokens: Vec<i32>,
    /// `[n]` position of each token in its sequence.
    pub positions: Vec<i32>,
    /// `[n]` index of each token's sequence.
    pub token_seq: Vec<i32>,
    /// `[n]` KV slot each token's K/V and hidden state are written to.
    pub write_slots: Vec<i64>,
    /// `[num_seqs, max_blocks]` block ids, rows padded with 0 past a sequence's blocks.
    pub block_tables: Vec<i32>,
    pub max_blocks: usize,
    /// `[n, head_dim / 2]` cos and sin of each token's RoPE angles.
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    /// The same at the sliding-window layers' frequencies, when they differ (else empty).
    pub cos_local: Vec<f32>,
    pub sin_local: Vec<f32>,
    /// The flat rows that need logits, and `[rows]` their slots.
    pub output_rows: Vec<usize>,
    pub output_slots: Vec<i64>,
    /// Tokens of the batch itself: rows from here on pad it ([`BatchLayout::pad_decode`]).
    pub live_rows: usize,
}

impl BatchLayout {
    /// Lays out a batch that already passed `ForwardBatch::validate`.
    pub fn build(
        batch: &ForwardBatch,
        block_size: usize,
        rope: &RopeFreqs,
    ) -> Result<BatchLayout, CudaError> {
        if batch.seqs.iter().any(|s| s.adapter.is_some()) {
            let msg = "LoRA adapters run on the CPU; this CUDA runner has none";
            return Err(CudaError::Unsupported(msg.into()));
        }
        let half = rope.global.len();
        let n = batch.num_tokens();
        let max_blocks = batch
            .seqs
            .iter()
            .map(|s| s.context_len().div_ceil(block_size))
            .max()
            .unwrap_or(0)
            .max(1);
        let mut l = BatchLayout {
            tokens: batch.tokens.iter().map(|t| t.0 as i32).collect(),
            positions: Vec::with_capacity(n),
            token_seq: Vec::with_capacity(n),
            write_slots: Vec::with_capacity(n),
            block_tables: vec![0; batch.seqs.len() * max_blocks],
            max_blocks,
            cos: Vec::with_capacity(n * half),
            sin: Vec::with_capacity(n * half),
            cos_local: Vec::new(),
            sin_local: Vec::new(),
            output_rows: batch.output_rows(),
            output_slots: Vec::new(),
            live_rows: n,
        };
        for (i, s) in batch.seqs.iter().enumerate() {
            let used = s.context_len().div_ceil(block_size);
            for (dst, b) in l.block_tables[i * max_blocks..]
                .iter_mut()
                .zip(&s.block_table[..used])
            {
                *dst = to_i32(b.0 as usize, "block id")?;
            }
            for p in s.num_cached..s.context_len() {
                l.positions.push(to_i32(p, "position")?);
                l.token_seq.push(i as i32);
                l.write_slots
                    .push(slot_of(&s.block_table, block_size, p) as i64);
            }
        }
        l.output_slots = l.output_rows.iter().map(|&r| l.write_slots[r]).collect();
        rope_angles(&l.positions, &rope.global, &mut l.cos, &mut l.sin);
        if let Some(local) = &rope.local {
            rope_angles(&l.positions, local, &mut l.cos_local, &mut l.sin_local);
        }
        Ok(l)
    }
}

impl BatchLayout {
    /// Rewrites the block tables with rows of `stride` entries (at least `max_blocks`).
    pub fn widen_tables(&mut self, stride: usize) {
        if stride == self.max_blocks {
            return;
        }
        let seqs = self.block_tables.len() / self.max_blocks.max(1);
        let mut wide = vec![0; seqs * stride];
        for (dst, src) in wide
            .chunks_mut(stride)
            .zip(self.block_tables.chunks(self.max_blocks))
        {
            dst[..src.len()].copy_from_slice(src);
        }
        self.block_tables = wide;
        self.max_blocks = stride;
    }

    /// Whether every sequence brings exactly one new token and needs its logits: a decode
    /// step, the shape CUDA graphs replay.
    pub fn is_decode(&self) -> bool {
        let n = self.tokens.len();
        self.output_rows.len() == n
            && self.block_tables.len() == n * self.max_blocks
            && self
                .token_seq
                .iter()
                .enumerate()
                .all(|(i, &s)| s as usize == i)
    }

    /// Pads a decode layout to `rows` sequences. A padding row is token 0 at position 0 of a
    /// sequence of its own whose one block is `scratch_block`; it writes its K/V and hidden
    /// state to slot `scratch_block * block_size` and its logits are never read.
    pub fn pad_decode(&mut self, rows: usize, scratch_block: usize, block_size: usize) {
        let half = self.cos.len() / self.tokens.len().max(1);
        let scratch_slot = (scratch_block * block_size) as i64;
        for i in self.tokens.len()..rows {
            self.tokens.push(0);
            self.positions.push(0);
            self.token_seq.push(i as i32);
            self.write_slots.push(scratch_slot);
            self.output_slots.push(scratch_slot);
            self.cos.extend(std::iter::repeat_n(1.0, half));
            self.sin.extend(std::iter::repeat_n(0.0, half));
            if !self.cos_local.is_empty() {
                self.cos_local.extend(std::iter::repeat_n(1.0, half));
                self.sin_local.extend(std::iter::repeat_n(0.0, half));
            }
            let mut table = vec![0; self.max_blocks];
            table[0] = scratch_block as i32;
            self.block_tables.extend(table);
        }
    }

    /// The longest context of the batch, in tokens.
    pub fn max_context(&self) -> usize {
        self.positions
            .iter()
            .map(|&p| p as usize + 1)
            .max()
            .unwrap_or(0)
    }
}

fn to_i32(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::Unsupported(format!("{what} {v} exceeds i32")))
}

/// Appends cos and sin of `p * f` for every position `p` and inverse frequency `f`,
/// computed in f64 and rounded to f32 (as the CPU runner computes its RoPE table).
fn rope_angles(positions: &[i32], inv_freqs: &[f32], cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
    for &p in positions {
        for &f in inv_freqs {
            let angle = p as f64 * f as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
}

/// The slots of `positions` of a sequence whose blocks are `block_table`, checked against
/// the pool (`num_blocks` blocks of `block_size`).
pub(crate) fn slots_of_positions(
    block_table: &[BlockId],
    positions: Range<usize>,
    block_size: usize,
    num_blocks: usize,
) -> Result<Vec<i64>, CudaError> {
    let bad = |m: String| Err(CudaError::Model(tandem_model::ModelError::Batch(m)));
    if positions.end > block_table.len() * block_size {
        return bad(format!(
            "positions up to {} need more than the {} blocks given",
            positions.end,
            block_table.len()
        ));
    }
    if let Some(b) = block_table.iter().find(|b| b.0 as usize >= num_blocks) {
        return bad(format!("block {} is outside the pool of {num_blocks}", b.0));
    }
    Ok(positions
        .map(|p| slot_of(block_table, block_size, p) as i64)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_model::batch::{OutputSelection, SeqSpan, TokenId};

    fn freqs(global: &[f32]) -> RopeFreqs {
        RopeFreqs {
            global: global.to_vec(),
            local: None,
        }
    }

    fn two_sequence_batch() -> ForwardBatch {
        ForwardBatch {
            tokens: [5, 6, 7, 8].map(TokenId).to_vec(),
            seqs: vec![
                SeqSpan {
                    start: 0,
                    len: 3,
                    num_cached: 2,
                    block_table: vec![BlockId(7), BlockId(3)],
                    adapter: None,
                },
                SeqSpan {
                    start: 3,
                    len: 1,
                    num_cached: 0,
                    block_table: vec![BlockId(1)],
                    adapter: None,
                },
            ],
            output: OutputSelection::Last,
        }
    }

    #[test]
    fn layout_maps_positions_to_slots_through_block_tables() {
        let l = BatchLayout::build(&two_sequence_batch(), 4, &freqs(&[1.0, 0.5])).expect("valid");
        assert_eq!(l.positions, vec![2, 3, 4, 0]);
        assert_eq!(l.token_seq, vec![0, 0, 0, 1]);
        // block 7 holds positions 0..4 (slots 28..32), block 3 positions 4..8 (slots 12..).
        assert_eq!(l.write_slots, vec![30, 31, 12, 4]);
        assert_eq!(l.max_blocks, 2);
        assert_eq!(l.block_tables, vec![7, 3, 1, 0]);
        assert_eq!(l.output_rows, vec![2, 3]);
        assert_eq!(l.output_slots, vec![12, 4]);
        assert_eq!(l.cos.len(), 8);
        assert_eq!(l.cos[1], (2.0f64 * 0.5).cos() as f32);
        assert_eq!(l.sin[2], (3.0f64).sin() as f32);
    }

    #[test]
    fn widened_and_padded_decode_layout_keeps_every_real_row() {
        let batch = ForwardBatch {
            tokens: [5, 6].map(TokenId).to_vec(),
            seqs: vec![
                SeqSpan {
                    start: 0,
                    len: 1,
                    num_cached: 4,
                    block_table: vec![BlockId(7), BlockId(3)],
                    adapter: None,
                },
                SeqSpan {
                    start: 1,
                    len: 1,
                    num_cached: 0,
                    block_table: vec![BlockId(1)],
                    adapter: None,
                },
            ],
            output: OutputSelection::Last,
        };
        let mut l = BatchLayout::build(&batch, 4, &freqs(&[1.0, 0.5])).expect("valid");
        assert!(l.is_decode());
        l.widen_tables(4);
        assert_eq!(l.block_tables, vec![7, 3, 0, 0, 1, 0, 0, 0]);
        l.pad_decode(4, 9, 4);
        assert_eq!(l.tokens, vec![5, 6, 0, 0]);
        assert_eq!(l.live_rows, 2);
        assert_eq!(l.positions, vec![4, 0, 0, 0]);
        assert_eq!(l.token_seq, vec![0, 1, 2, 3]);
        assert_eq!(l.write_slots, vec![12, 4, 36, 36]);
        assert_eq!(l.output_slots, vec![12, 4, 36, 36]);
        assert_eq!(&l.block_tables[8..], &[9, 0, 0, 0, 9, 0, 0, 0]);
        assert_eq!(l.cos.len(), 8);
        assert_eq!((l.cos[6], l.sin[7]), (1.0, 0.0));
        assert_eq!(l.max_context(), 5);
        assert!(
            !BatchLayout::build(&two_sequence_batch(), 4, &freqs(&[1.0]))
                .expect("valid")
                .is_decode()
        );
    }

    #[test]
    fn cached_slots_are_checked_against_table_and_pool() {
        let table = [BlockId(2), BlockId(0)];
        assert_eq!(
            slots_of_positions(&table, 2..6, 4, 3).expect("fits"),
            vec![10, 11, 0, 1]
        );
        assert!(slots_of_positions(&table, 0..9, 4, 3).is_err());
        assert!(slots_of_positions(&table, 0..1, 4, 2).is_err());
    }
}
