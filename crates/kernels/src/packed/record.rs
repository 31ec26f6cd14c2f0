//! The record kinds of the packed layout: how one record stores its 16 rows' weights and
//! scales. Every packed type maps onto one kind (several types share one, re-encoded at
//! packing time), so the kernels are written once per kind, not once per type.

use crate::DType;

/// The layout of a record (see the `packed` module docs for the byte positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordKind {
    /// 4-bit `q`, f16 `d`: `x = (q − 8)·d` (Q4_0).
    Nibbles,
    /// 4-bit `q`, f16 `d` and `m`: `x = q·d + m` (Q4_1).
    NibblesMin,
    /// 4-bit `q`, f32 `d` and `m` per 32 columns: `x = q·d + m` (Q4_K).
    NibblesMinWide,
    /// 8-bit `v + 128`, f16 `d`: `x = v·d` (Q8_0; Q5_0 with `v = q − 16`).
    Bytes,
    /// 5-bit `q` as Q4_0's nibbles plus a plane of fifth bits, f16 `d`: `x = (q − 16)·d`
    /// (Q5_0).
    Plane,
    /// 5-bit `q` (nibbles and a bit plane), f16 `d` and `m`: `x = q·d + m` (Q5_1).
    PlaneMin,
    /// 5-bit `q` (nibbles and a bit plane), f32 `d` and `m` per 32 columns: `x = q·d + m`
    /// (Q5_K).
    PlaneMinWide,
    /// 4-bit indices `q` into IQ4_NL's 16-level table `T`, f16 `d`: `x = T[q]·d` (IQ4_NL).
    /// The kernels look the levels up (`pshufb`) and go on as with 8-bit weights `T[q] + 128`.
    TableNibbles,
    /// As `TableNibbles` with an f32 `d` per 32 columns (IQ4_XS, `d·(ls − 32)`).
    TableNibblesWide,
    /// 8-bit `v + 32`, f32 `d` per 16 columns: `x = v·d` (Q6_K; Q3_K).
    Halves,
}

impl RecordKind {
    /// The kind `dtype` packs as, if it is packed at all.
    pub(crate) fn of(dtype: DType) -> Option<RecordKind> {
        Some(match dtype {
            DType::Q4_0 => RecordKind::Nibbles,
            DType::Q4_1 => RecordKind::NibblesMin,
            DType::Q4_K => RecordKind::NibblesMinWide,
            DType::Q8_0 => RecordKind::Bytes,
            DType::Q5_0 => RecordKind::Plane,
            DType::Q5_1 => RecordKind::PlaneMin,
            DType::IQ4_NL => RecordKind::TableNibbles,
            DType::IQ4_XS => RecordKind::TableNibblesWide,
            DType::Q5_K => RecordKind::PlaneMinWide,
            DType::Q6_K | DType::Q3_K => RecordKind::Halves,
            DType::F32 | DType::F16 | DType::BF16 | DType::Q2_K => return None,
        })
    }

    /// Whether the weights are stored as whole bytes (else nibbles).
    pub(crate) fn bytes8(self) -> bool {
        matches!(self, RecordKind::Bytes | RecordKind::Halves)
    }

    /// Whether a line of fifth bits follows the nibbles.
    pub(crate) fn plane(self) -> bool {
        matches!(
            self,
            RecordKind::Plane | RecordKind::PlaneMin | RecordKind::PlaneMinWide
        )
    }

    /// Whether the nibbles index the IQ4 table (else they are the weights).
    pub(crate) fn table(self) -> bool {
        matches!(
            self,
            RecordKind::TableNibbles | RecordKind::TableNibblesWide
        )
    }

    /// Whether there is a min table (`x = q·d + m`).
    pub(crate) fn has_min(self) -> bool {
        matches!(
            self,
            RecordKind::NibblesMin
                | RecordKind::NibblesMinWide
                | RecordKind::PlaneMin
                | RecordKind::PlaneMinWide
        )
    }

    /// Whether the scale tables are f32 (else f16).
    pub(crate) fn wide(self) -> bool {
        matches!(
            self,
            RecordKind::NibblesMinWide
                | RecordKind::TableNibblesWide
                | RecordKind::PlaneMinWide
                | RecordKind::Halves
        )
    }

    /// The offset subtracted from each stored weight: `c` in the module docs.
    pub(crate) fn weight_bias(self) -> i32 {
        match self {
            RecordKind::Nibbles => 8,
            RecordKind::NibblesMin
            | RecordKind::NibblesMinWide
            | RecordKind::PlaneMin
            | RecordKind::PlaneMinWide => 0,
            RecordKind::Plane => 16,
            RecordKind::Halves => 32,
            RecordKind::Bytes | RecordKind::TableNibbles | RecordKind::TableNibblesWide => 128,
        }
    }

    /// Bytes of quants at the start of a record (then the scales, then the mins): 8 lines
    /// of bytes, or 4 of nibbles (plus one of fifth bits).
    pub(crate) fn quant_bytes(self) -> usize {
        if self.bytes8() {
            512
        } else if self.plane() {
            256 + 64
        } else {
            256
        }
    }

    /// Bytes of one record: the quants, then the scale tables, 32 bytes each (f16) or 64
    /// (f32), so a record is whole half lines. A single f16 table (Q8_0, Q4_0, Q5_0,
    /// IQ4_NL) leaves its record ending on a half line; padding it to a whole line would
    /// stream 6–11 % more bytes for nothing in a memory-bound single-token product.
    pub(crate) fn record_bytes(self) -> usize {
        let tables = 1 + usize::from(self.has_min() || self == RecordKind::Halves);
        let table = if self.wide() { 64 } else { 32 };
        self.quant_bytes() + tables * table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_sizes_are_whole_half_lines_holding_their_tables() {
        let sizes = [
            (DType::Q4_0, 256 + 32),
            (DType::Q4_1, 256 + 64),
            (DType::Q4_K, 256 + 128),
            (DType::Q8_0, 512 + 32),
            (DType::Q5_0, 320 + 32),
            (DType::Q5_1, 320 + 64),
            (DType::IQ4_NL, 256 + 32),
            (DType::IQ4_XS, 256 + 64),
            (DType::Q5_K, 320 + 128),
            (DType::Q6_K, 512 + 128),
        ];
        for (dtype, bytes) in sizes {
            let kind = RecordKind::of(dtype).expect("a packed type");
            assert_eq!(kind.record_bytes(), bytes, "{dtype}");
        }
    }
}
