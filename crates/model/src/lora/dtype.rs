//! How an adapter's matrices are held: as loaded (`A` in the file's dtype, `Bᵀ` in f32, the
//! default: bitwise PEFT's arithmetic), or both rounded once to bf16 when the adapter is
//! registered (vLLM's `--lora-dtype bfloat16`), which halves the bytes a decode step reads
//! per adapter. bf16 widens to f32 exactly: `A`'s product goes through the kernels' bf16
//! rows, `Bᵀ`'s rows through [`add_scaled_bf16_inplace_with`], on the rounded values.

use half::bf16;
use tandem_kernels::ops::{add_scaled_bf16_inplace_with, add_scaled_inplace_with};
use tandem_kernels::{DType, Isa};

use super::{LoraAdapter, LoraPair};

/// The dtype adapters are held in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoraDtype {
    /// `A` as stored in the file, `Bᵀ` in f32.
    #[default]
    Auto,
    /// Both rounded to bf16 (to nearest, ties to even) and stored in bf16.
    Bf16,
}

/// `Bᵀ` (`[rank, out]`).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum BRows {
    F32(Vec<f32>),
    /// bf16 bit patterns.
    Bf16(Vec<u16>),
}

impl BRows {
    pub(super) fn len(&self) -> usize {
        match self {
            BRows::F32(v) => v.len(),
            BRows::Bf16(v) => v.len(),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            BRows::F32(v) => 4 * v.len(),
            BRows::Bf16(v) => 2 * v.len(),
        }
    }

    /// Feeds the values (as bits, with their type) to `h`.
    pub(super) fn hash_into(&self, h: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        match self {
            BRows::F32(v) => (0u8, v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).hash(h),
            BRows::Bf16(v) => (1u8, v).hash(h),
        }
    }

    /// `y += t · Bᵀ[k]` (`y` is one row of `out` values).
    pub(super) fn add_row(&self, isa: Isa, y: &mut [f32], t: f32, k: usize) {
        let r = k * y.len()..(k + 1) * y.len();
        match self {
            BRows::F32(b) => add_scaled_inplace_with(isa, y, t, &b[r]),
            BRows::Bf16(b) => add_scaled_bf16_inplace_with(isa, y, t, &b[r]),
        }
    }
}

impl LoraPair {
    /// Rounds `A` and `Bᵀ` to bf16 (`A` already in bf16 is kept as it is).
    fn round_to_bf16(&mut self) {
        let a: Option<Vec<f32>> = match self.dtype {
            DType::F32 => Some(
                (self.a.chunks_exact(4))
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            DType::F16 => Some(
                (self.a.chunks_exact(2))
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            ),
            _ => None,
        };
        if let Some(a) = a {
            let bits = a.iter().map(|&x| bf16::from_f32(x).to_bits());
            self.a = bits.flat_map(u16::to_le_bytes).collect();
            self.dtype = DType::BF16;
        }
        if let BRows::F32(b) = &self.b_t {
            self.b_t = BRows::Bf16(b.iter().map(|&x| bf16::from_f32(x).to_bits()).collect());
        }
    }
}

impl LoraAdapter {
    /// The adapter held as `dtype`.
    pub fn with_dtype(mut self, dtype: LoraDtype) -> LoraAdapter {
        if dtype == LoraDtype::Bf16 {
            for pair in self.layers.iter_mut().flatten().flatten() {
                pair.round_to_bf16();
            }
        }
        self
    }
}
