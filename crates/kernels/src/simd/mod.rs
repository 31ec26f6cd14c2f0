//! The per-ISA kernel table used by [`crate::matmul`] and [`crate::attention`]: row dequantization, the 1-row, 4-row,
//! 4-row × 2-token and 4-row × 4-token f32 dots, the fused dequantize-and-dot of 1 or 4
//! stored rows (SIMD only; used for single-token calls), the int8 kernel of one packed row
//! group and the activation quantizer (`packed_vnni`, `packed_avx2`; bitwise equal to
//! `packed::reference`), and the attention of the query groups of one or more KV heads
//! (`attention`; bitwise equal to scalar, over f32, f16 or 8-bit rows).
//!
//! | ISA           | f32 path vs scalar | quantized weights (all but Q2_K)                         |
//! |---------------|--------------------|----------------------------------------------------------|
//! | `scalar`      | reference          | reference                                                |
//! | `avx2`        | **bitwise equal**  | bitwise equal                                            |
//! | `avx512`      | **bitwise equal**  | bitwise equal                                            |
//! | `avx2-int8`   | bitwise equal      | packed int8 (`vpmaddubsw`): = `packed::reference`        |
//! | `avx512-int8` | bitwise equal      | packed int8 (VNNI `vpdpbusd`): = `packed::reference`     |
//!
//! The exact variants reproduce the scalar reference ([`crate::quant`]'s dequantization and
//! [`crate::dot16`]'s fixed 16-lane order) operation for operation: AVX-512 keeps the 16
//! accumulators in one register, AVX2 in two, both use a rounded multiply then a rounded add
//! (no FMA), the scalar tail and the same final tree (done in registers). An FMA variant was
//! measured during development: no throughput difference beyond the noise of the shared
//! machine (the loops are bound by decoding and loads, and a multiply-add pair has the same
//! dependency chain through the add), so the bitwise-equal form is the only one kept.
//! The attention kernel is different: its contract itself uses fused multiply-adds (in the
//! score dots and the value accumulation; the scalar reference calls `f32::mul_add`), which
//! made long scoring measurably faster (BENCHMARKS.md § Figures behind choices in the code),
//! and its variants stay bitwise equal.
//!
//! Every variant, int8 included, computes each output from its own row and token only, in an
//! order fixed by the row length: results never depend on `n_tokens` or the thread split.

#[cfg(target_arch = "x86_64")]
mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_tile;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod decode;
#[cfg(target_arch = "x86_64")]
mod decode_more;
#[cfg(target_arch = "x86_64")]
mod group_prefetch;
#[cfg(target_arch = "x86_64")]
mod kernels;
#[cfg(target_arch = "x86_64")]
#[macro_use]
mod packed_common;
#[cfg(target_arch = "x86_64")]
mod lanes;
#[cfg(target_arch = "x86_64")]
mod packed_avx2;
#[cfg(target_arch = "x86_64")]
mod packed_vnni;
#[cfg(target_arch = "x86_64")]
mod scale_tables;

use crate::attention::{KvView, Partial, TileWork};
use crate::isa::Isa;
use crate::packed::{BlockScale, GroupOut, PackedMatrix, QuantizedRows};
use crate::{dot16, packed, quant, DType};

/// Scratch values per 32-column block that the int8 kernels need for a super-scaled kind's
/// scale tables: 16 rows' scales, then 16 rows' second table (mins, or Q6_K's second half's
/// scales).
pub(crate) const PACKED_SCALES_PER_BLOCK: usize = 32;

type AttendFn = unsafe fn(&[f32], &KvView<'_>, usize, f32, Partial<'_>, &[usize]);
type AttendTileFn = unsafe fn(&[f32], &[usize], &KvView<'_>, f32, Partial<'_>, &mut TileWork);
type DequantFn = unsafe fn(DType, &[u8], &mut [f32]);
type Dot1Fn = unsafe fn(&[f32], &[f32]) -> f32;
type Dot4Fn = unsafe fn([&[f32]; 4], &[f32]) -> [f32; 4];
type Dot4x2Fn = unsafe fn([&[f32]; 4], [&[f32]; 2]) -> [[f32; 4]; 2];
type Dot4x4Fn = unsafe fn([&[f32]; 4], [&[f32]; 4]) -> [[f32; 4]; 4];
type DotRowFn = unsafe fn(DType, &[u8], &[f32]) -> f32;
type PackedFn = unsafe fn(&PackedMatrix, usize, &QuantizedRows, &mut GroupOut, &mut [f32]);
type QuantizeFn = unsafe fn(&[f32], &mut [i8], &mut [BlockScale]);
type DotRows4Fn = unsafe fn(DType, [&[u8]; 4], &[f32]) -> [f32; 4];

/// The fused dequantize-and-dot kernels (1 and 4 stored rows with one activation row).
#[derive(Debug, Clone, Copy)]
struct Fused {
    one: DotRowFn,
    four: DotRows4Fn,
}

/// The kernels of one ISA. Built only by [`Kernels::new`], which checks that the CPU supports
/// the ISA: that check is what makes calling the (target-feature) function pointers sound.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernels {
    /// The ISA these kernels were built for (where portable code is compiled per ISA too).
    isa: Isa,
    dequant: DequantFn,
    dot1: Dot1Fn,
    dot4: Dot4Fn,
    dot4x2: Option<Dot4x2Fn>,
    /// Only where 16 accumulators fit in registers (AVX-512).
    dot4x4: Option<Dot4x4Fn>,
    fused: Option<Fused>,
    attend: AttendFn,
    attend_tile: AttendTileFn,
    /// The int8 product of one packed row group with every token (the scalar reference
    /// unless the ISA has int8 kernels).
    packed: PackedFn,
    /// The quantization of one activation row for the int8 kernels.
    quantize: QuantizeFn,
}

impl Kernels {
    /// The kernels of `isa`, or `None` when this CPU cannot run them.
    pub(crate) fn new(isa: Isa) -> Option<Kernels> {
        if !isa.is_available() {
            return None;
        }
        match isa {
            Isa::Scalar => Some(Kernels {
                isa,
                dequant: quant::dequantize_row,
                dot1: dot16::dot_1,
                dot4: dot16::dot_4,
                dot4x2: None,
                dot4x4: None,
                fused: None,
                attend: crate::attention::attend_group_scalar,
                attend_tile: crate::attention::attend_tile_scalar,
                packed: packed::reference::group,
                quantize: packed::quantize_row,
            }),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Int8 => Some(Kernels {
                isa,
                packed: packed_avx2::group,
                ..Kernels::new(Isa::Avx2)?
            }),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Int8 => Some(Kernels {
                isa,
                packed: packed_vnni::group,
                quantize: packed_vnni::quantize_row,
                ..Kernels::new(Isa::Avx512)?
            }),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(Kernels {
                isa,
                dequant: avx2::dequantize_row,
                dot1: avx2::dot_1,
                dot4: avx2::dot_4,
                dot4x2: Some(avx2::dot_4x2),
                dot4x4: None,
                fused: Some(Fused {
                    one: avx2::dot_row,
                    four: avx2::dot_rows_4,
                }),
                attend: attention::attend_group_avx2,
                attend_tile: attention_tile::attend_tile_avx2,
                packed: packed::reference::group,
                quantize: packed::quantize_row,
            }),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(Kernels {
                isa,
                dequant: avx512::dequantize_row,
                dot1: avx512::dot_1,
                dot4: avx512::dot_4,
                dot4x2: Some(avx512::dot_4x2),
                dot4x4: Some(avx512::dot_4x4),
                fused: Some(Fused {
                    one: avx512::dot_row,
                    four: avx512::dot_rows_4,
                }),
                attend: attention::attend_group_avx512,
                attend_tile: attention_tile::attend_tile_avx512,
                packed: packed::reference::group,
                quantize: packed_vnni::quantize_row,
            }),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// The ISA these kernels were built for.
    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    /// As [`quant::dequantize_row`] (bitwise equal).
    pub(crate) fn dequantize_row(&self, dtype: DType, src: &[u8], dst: &mut [f32]) {
        // SAFETY: `new` built this table only after checking the CPU's features; the kernel
        // asserts the lengths itself.
        unsafe { (self.dequant)(dtype, src, dst) }
    }

    /// As [`crate::attention::attend_group_scalar`] (bitwise equal): the state over one
    /// partition of at most [`crate::attention::GROUP_MAX`] query heads of each of `kv_heads`
    /// consecutive KV heads; `next`: the slots after the partition's, whose first block it
    /// prefetches at its end (empty: none).
    pub(crate) fn attend_partition(
        &self,
        q: &[f32],
        kv: &KvView<'_>,
        kv_heads: usize,
        scale: f32,
        state: Partial<'_>,
        next: &[usize],
    ) {
        // SAFETY: as in `dequantize_row`; the kernel asserts the shapes.
        unsafe { (self.attend)(q, kv, kv_heads, scale, state, next) }
    }

    /// As [`crate::attention::attend_tile_scalar`] (bitwise equal): the state over one
    /// partition of at most [`crate::attention::TILE_ROWS`] query rows of one KV head, each
    /// over its own part of it; `work` holds `q` transposed ([`TileWork::new`]).
    pub(crate) fn attend_tile_partition(
        &self,
        q: &[f32],
        context: &[usize],
        kv: &KvView<'_>,
        scale: f32,
        state: Partial<'_>,
        work: &mut TileWork,
    ) {
        // SAFETY: as in `dequantize_row`; the kernel asserts the shapes.
        unsafe { (self.attend_tile)(q, context, kv, scale, state, work) }
    }

    /// As [`dot16::dot_1`] (bitwise equal).
    pub(crate) fn dot_1(&self, w: &[f32], x: &[f32]) -> f32 {
        // SAFETY: as in `dequantize_row`.
        unsafe { (self.dot1)(w, x) }
    }

    /// As [`dot16::dot_4`] (bitwise equal).
    pub(crate) fn dot_4(&self, w: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
        // SAFETY: as in `dequantize_row`.
        unsafe { (self.dot4)(w, x) }
    }

    /// [`Kernels::dot_4`] of two activation rows (`[x[0] results, x[1] results]`).
    pub(crate) fn dot_4x2(&self, w: [&[f32]; 4], x: [&[f32]; 2]) -> [[f32; 4]; 2] {
        match self.dot4x2 {
            // SAFETY: as in `dequantize_row`.
            Some(f) => unsafe { f(w, x) },
            None => x.map(|xt| self.dot_4(w, xt)),
        }
    }

    /// [`Kernels::dot_4`] of four activation rows (`out[t]` holds `x[t]`'s results).
    pub(crate) fn dot_4x4(&self, w: [&[f32]; 4], x: [&[f32]; 4]) -> [[f32; 4]; 4] {
        match self.dot4x4 {
            // SAFETY: as in `dequantize_row`.
            Some(f) => unsafe { f(w, x) },
            None => {
                let [a, b] = self.dot_4x2(w, [x[0], x[1]]);
                let [c, d] = self.dot_4x2(w, [x[2], x[3]]);
                [a, b, c, d]
            }
        }
    }

    /// `out[t·16 + j] = W[16g + j] · x[t]` for every token of `xq` (`out`: `[n_tokens, 16]`),
    /// bitwise equal to [`packed::reference::group`]. `scales`: scratch for a super-scaled
    /// kind's scale tables, [`PACKED_SCALES_PER_BLOCK`] values per 32-column block (else
    /// unused).
    pub(crate) fn packed_group(
        &self,
        w: &PackedMatrix,
        g: usize,
        xq: &QuantizedRows,
        out: &mut GroupOut,
        scales: &mut [f32],
    ) {
        // SAFETY: as in `dequantize_row`; the kernel asserts the shapes.
        unsafe { (self.packed)(w, g, xq, out, scales) }
    }

    /// One activation row quantized for the int8 kernels, bitwise equal to
    /// [`packed::quantize_row`].
    pub(crate) fn quantize_row(&self, x: &[f32], q: &mut [i8], scales: &mut [BlockScale]) {
        // SAFETY: as in `dequantize_row`; the kernel asserts the shapes.
        unsafe { (self.quantize)(x, q, scales) }
    }

    /// Whether there are fused dequantize-and-dot kernels (else callers use scratch rows).
    pub(crate) fn has_fused_rows(&self) -> bool {
        self.fused.is_some()
    }

    /// The dot of a stored row with `x`, bitwise equal to dequantizing the row and calling
    /// [`Kernels::dot_1`] (which is what it does when there is no fused kernel).
    pub(crate) fn dot_row(&self, dtype: DType, src: &[u8], x: &[f32]) -> f32 {
        match self.fused {
            // SAFETY: as in `dequantize_row`.
            Some(f) => unsafe { (f.one)(dtype, src, x) },
            None => {
                let mut w = vec![0.0f32; x.len()];
                self.dequantize_row(dtype, src, &mut w);
                self.dot_1(&w, x)
            }
        }
    }

    /// [`Kernels::dot_row`] of four stored rows (each result bitwise equal to it).
    pub(crate) fn dot_rows_4(&self, dtype: DType, src: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
        match self.fused {
            // SAFETY: as in `dequantize_row`.
            Some(f) => unsafe { (f.four)(dtype, src, x) },
            None => src.map(|s| self.dot_row(dtype, s, x)),
        }
    }
}
