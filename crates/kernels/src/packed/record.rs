//! The record kinds of the packed layout: how one record stores its 16 rows' weights and
//! scales. Every packed type maps onto one kind (several types share one, re-encoded at
//! packing time), so the kernels are written once per kind, not once per type.
//!
//! The super-scaled kinds (K-quants, IQ4_XS) store their scales as in the file, in two
//! factors: an f16 per row and super-block of 256 columns, in a header before the
//! super-block's 8 records, and an 8-bit integer per row and 32 (or 16) columns in each
//! record. The kernels multiply the two, exactly, as the file's decoder does.

use crate::DType;

/// The layout of a record (see the `packed` module docs for the byte positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordKind {
    /// 4-bit `q`, f16 `d`: `x = (q − 8)·d` (Q4_0).
    Nibbles,
    /// 4-bit `q`, f16 `d` and `m`: `x = q·d + m` (Q4_1).
    NibblesMin,
    /// 4-bit `q`; per super-block f16 `d` and `−dmin`, per 32 columns 8-bit `sc` and `m`:
    /// `x = q·(d·sc) + (−dmin)·m` (Q4_K).
    NibblesMinSuper,
    /// 8-bit `v + 128`, f16 `d`: `x = v·d` (Q8_0; Q5_0 with `v = q − 16`).
    Bytes,
    /// 5-bit `q` as Q4_0's nibbles plus a plane of fifth bits, f16 `d`: `x = (q − 16)·d`
    /// (Q5_0).
    Plane,
    /// 5-bit `q` (nibbles and a bit plane), f16 `d` and `m`: `x = q·d + m` (Q5_1).
    PlaneMin,
    /// 5-bit `q` (nibbles and a bit plane), scales and mins as `NibblesMinSuper` (Q5_K).
    PlaneMinSuper,
    /// 4-bit indices `q` into IQ4_NL's 16-level table `T`, f16 `d`: `x = T[q]·d` (IQ4_NL).
    /// The kernels look the levels up (`pshufb`) and go on as with 8-bit weights `T[q] + 128`.
    TableNibbles,
    /// As `TableNibbles` with an f16 `d` per super-block and an 8-bit `ls − 32` per 32
    /// columns: `x = T[q]·(d·(ls − 32))` (IQ4_XS).
    TableNibblesSuper,
    /// 8-bit `v + 32`, an f16 `d` per super-block and an 8-bit `sc` per 16 columns:
    /// `x = v·(d·sc)` (Q6_K; Q3_K with `sc − 32`).
    Halves,
}

impl RecordKind {
    /// The kind `dtype` packs as, if it is packed at all.
    pub(crate) fn of(dtype: DType) -> Option<RecordKind> {
        Some(match dtype {
            DType::Q4_0 => RecordKind::Nibbles,
            DType::Q4_1 => RecordKind::NibblesMin,
            DType::Q4_K => RecordKind::NibblesMinSuper,
            DType::Q8_0 => RecordKind::Bytes,
            DType::Q5_0 => RecordKind::Plane,
            DType::Q5_1 => RecordKind::PlaneMin,
            DType::IQ4_NL => RecordKind::TableNibbles,
            DType::IQ4_XS => RecordKind::TableNibblesSuper,
            DType::Q5_K => RecordKind::PlaneMinSuper,
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
            RecordKind::Plane | RecordKind::PlaneMin | RecordKind::PlaneMinSuper
        )
    }

    /// Whether the nibbles index the IQ4 table (else they are the weights).
    pub(crate) fn table(self) -> bool {
        matches!(
            self,
            RecordKind::TableNibbles | RecordKind::TableNibblesSuper
        )
    }

    /// Whether there is a min table (`x = q·d + m`).
    pub(crate) fn has_min(self) -> bool {
        matches!(
            self,
            RecordKind::NibblesMin
                | RecordKind::NibblesMinSuper
                | RecordKind::PlaneMin
                | RecordKind::PlaneMinSuper
        )
    }

    /// Whether the scales are super-scaled: 8-bit multipliers of a super-block's f16 (else
    /// one f16 per row and record).
    pub(crate) fn super_scaled(self) -> bool {
        matches!(
            self,
            RecordKind::NibblesMinSuper
                | RecordKind::TableNibblesSuper
                | RecordKind::PlaneMinSuper
                | RecordKind::Halves
        )
    }

    /// The offset subtracted from each stored weight: `c` in the module docs.
    pub(crate) fn weight_bias(self) -> i32 {
        match self {
            RecordKind::Nibbles => 8,
            RecordKind::NibblesMin
            | RecordKind::NibblesMinSuper
            | RecordKind::PlaneMin
            | RecordKind::PlaneMinSuper => 0,
            RecordKind::Plane => 16,
            RecordKind::Halves => 32,
            RecordKind::Bytes | RecordKind::TableNibbles | RecordKind::TableNibblesSuper => 128,
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

    /// Scale tables in a record: the scales, then the mins or Q6_K's second half's scales.
    pub(crate) fn tables(self) -> usize {
        1 + usize::from(self.has_min() || self == RecordKind::Halves)
    }

    /// Bytes of one record: the quants, then the scale tables (16 rows of f16, or of 8-bit
    /// multipliers), rounded up to a half line. A record that ends on a half line is not
    /// padded to a whole one: that would stream 6–11 % more bytes for nothing in a
    /// memory-bound single-token product.
    pub(crate) fn record_bytes(self) -> usize {
        let table = if self.super_scaled() { 16 } else { 32 };
        (self.quant_bytes() + self.tables() * table).next_multiple_of(32)
    }

    /// Bytes of a super-block's header: 16 rows of f16 `d` (and of `−dmin` with mins).
    fn header_bytes(self) -> usize {
        if self.super_scaled() {
            32 * (1 + usize::from(self.has_min()))
        } else {
            0
        }
    }

    /// Where a group's records and headers lie.
    pub(crate) fn layout(self) -> RecordLayout {
        RecordLayout {
            record: self.record_bytes(),
            header: self.header_bytes(),
            super_shift: if self.super_scaled() {
                SUPER_RECORDS.trailing_zeros()
            } else {
                0
            },
        }
    }
}

/// Records in a super-block of a super-scaled kind (256 columns).
pub(crate) const SUPER_RECORDS: usize = 8;

/// The byte offsets inside a row group: super-blocks of `2^super_shift` records after a
/// header (8 records after 32 or 64 bytes for the super-scaled kinds; 1 record and no header
/// for the others), one after the other. Every offset is a multiple of 32.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordLayout {
    pub(crate) record: usize,
    pub(crate) header: usize,
    super_shift: u32,
}

impl RecordLayout {
    /// The offset of record `b` (32-column block `b`).
    #[inline(always)]
    pub(crate) fn record_at(self, b: usize) -> usize {
        let in_super = b & ((1 << self.super_shift) - 1);
        self.header_at(b) + self.header + in_super * self.record
    }

    /// The offset of record `b + n` given record `b`'s, `at` (`n` at most a super-block's
    /// records), cheaper than [`Self::record_at`]. (The kernels step from record to record
    /// with their kind's constants: `record`, and `header` after every [`SUPER_RECORDS`].)
    #[inline(always)]
    pub(crate) fn record_after(self, at: usize, b: usize, n: usize) -> usize {
        // The super-blocks that start after record `b`, up to record `b + n` (0 or 1; `n`
        // with no super-blocks, whose headers are empty).
        let started = ((b & ((1 << self.super_shift) - 1)) + n) >> self.super_shift;
        at + n * self.record + started * self.header
    }

    /// The offset of the header of record `b`'s super-block.
    #[inline(always)]
    pub(crate) fn header_at(self, b: usize) -> usize {
        (b >> self.super_shift) * ((self.record << self.super_shift) + self.header)
    }

    /// Bytes of `blocks` records, a whole number of super-blocks.
    pub(crate) fn span(self, blocks: usize) -> usize {
        self.header_at(blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_sizes_are_whole_half_lines_holding_their_tables() {
        // (With the super-block headers the K-quants stream 2.8 % (Q4_K) to 30 % (Q6_K) more
        // bytes than the file: 2,368 against 2,304 per 16 rows of Q4_K's 256 columns.)
        let sizes = [
            (DType::Q4_0, 256 + 32),
            (DType::Q4_1, 256 + 64),
            (DType::Q4_K, 256 + 32),
            (DType::Q8_0, 512 + 32),
            (DType::Q5_0, 320 + 32),
            (DType::Q5_1, 320 + 64),
            (DType::IQ4_NL, 256 + 32),
            (DType::IQ4_XS, 288), // 256 + 16, rounded up to a half line
            (DType::Q5_K, 320 + 32),
            (DType::Q6_K, 512 + 32),
        ];
        for (dtype, bytes) in sizes {
            let kind = RecordKind::of(dtype).expect("a packed type");
            assert_eq!(kind.record_bytes(), bytes, "{dtype}");
        }
    }

    #[test]
    fn super_blocks_put_their_header_before_their_eight_records() {
        let q4_k = RecordKind::of(DType::Q4_K).expect("a packed type").layout();
        let super_bytes = 64 + 8 * 288;
        assert_eq!(q4_k.record_at(0), 64);
        assert_eq!(q4_k.record_at(7), 64 + 7 * 288);
        assert_eq!(q4_k.header_at(7), 0);
        assert_eq!(q4_k.header_at(8), super_bytes);
        assert_eq!(q4_k.record_at(9), super_bytes + 64 + 288);
        assert_eq!(q4_k.span(16), 2 * super_bytes);
        for b in 0..24 {
            for n in 0..=8 {
                let after = q4_k.record_after(q4_k.record_at(b), b, n);
                assert_eq!(after, q4_k.record_at(b + n), "record {b} + {n}");
            }
        }
        let q8_0 = RecordKind::of(DType::Q8_0).expect("a packed type").layout();
        assert_eq!(
            (q8_0.record_at(5), q8_0.header_at(5), q8_0.span(3)),
            (5 * 544, 5 * 544, 3 * 544)
        );
        assert_eq!(q8_0.record_after(5 * 544, 5, 4), 9 * 544);
    }
}
