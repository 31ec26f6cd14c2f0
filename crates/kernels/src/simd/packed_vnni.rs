//! The int8 kernel on packed matrices with AVX-512 VNNI: one `zmm` of `i32` holds the 16 rows
//! of a group, `vpdpbusd` adds 4 products per row per instruction (weights unsigned, the 4
//! broadcast activation bytes signed). Bitwise equal to `packed::reference` (integer sums are
//! exact; the f32 steps are the same operations in the same order).
//!
//! Records start on half lines (`packed` module docs), so the 64-byte loads are unaligned
//! ones; no 32-byte half of one straddles two lines.

use std::arch::x86_64::*;

use crate::packed::{
    BlockScale, GroupOut, PackedMatrix, QuantizedRows, BLOCK, GROUP_ROWS, SUPER_RECORDS,
};
use crate::quant::IQ4_LEVELS;

use super::group_prefetch::GroupPrefetch;
use super::scale_tables::ScaleTables;
use super::PACKED_SCALES_PER_BLOCK as PER_BLOCK;

/// Tokens whose sums advance together over one decoded weight record.
const TILE: usize = 4;

/// `out[t, j] = W[16g + j] · x[t]` for every token of `xq` and live row `j` (as
/// `packed::reference::group`).
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL and VNNI, and F16C. Shapes are asserted.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
pub(super) unsafe fn group(
    w: &PackedMatrix,
    g: usize,
    xq: &QuantizedRows,
    out: &mut GroupOut,
    scales: &mut [f32],
) {
    assert!(
        xq.cols() == w.cols() && out.n_tokens() == xq.n_tokens(),
        "packed vnni: shapes do not match"
    );
    with_kind_flags!(w.kind(), tiles(w, g, xq, out, scales))
}

// `tiles`: every token of `xq`, `TILE` at a time, with this module's `tile`.
define_tiles!();

/// The 16 IQ4 levels plus `offset`, as bytes (the `pshufb` table of the table kinds).
#[inline(always)]
pub(super) unsafe fn iq4_levels(offset: i8) -> __m128i {
    let t: [i8; 16] = std::array::from_fn(|i| IQ4_LEVELS[i].wrapping_add(offset));
    _mm_loadu_si128(t.as_ptr().cast())
}

/// `nibbles` (bytes below 16) with 16 added where bit `bit` of the same byte of the fifth-bit
/// line `plane` is set: the line shifted in 16-bit lanes so that bit lands on bit 4 (a bit
/// crossing into the other byte lands below bit 4 or above it, where the mask drops it).
#[inline(always)]
unsafe fn with_fifth_bits(nibbles: __m512i, plane: __m512i, bit: i64) -> __m512i {
    let at4 = if bit <= 4 {
        _mm512_sll_epi16(plane, _mm_set_epi64x(0, 4 - bit))
    } else {
        _mm512_srl_epi16(plane, _mm_set_epi64x(0, bit - 4))
    };
    // 0xF8: a | (b & c).
    _mm512_ternarylogic_epi32::<0xF8>(nibbles, at4, _mm512_set1_epi8(0x10))
}

/// The 16 signed bytes at `p` as f32 (the rows' scale multipliers of a super-scaled record).
#[inline(always)]
unsafe fn multipliers(p: *const u8) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())))
}

/// The 4 activation bytes at `p` in every lane.
#[inline(always)]
unsafe fn broadcast4(p: *const i8) -> __m512i {
    _mm512_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// Tokens `t0 .. t0 + T` against group `g`.
#[inline(always)]
unsafe fn tile<
    const T: usize,
    const Q8: bool,
    const MIN: bool,
    const SUPER: bool,
    const HALVES: bool,
    const TABLE: bool,
    const PLANE: bool,
>(
    w: &PackedMatrix,
    g: usize,
    xq: &QuantizedRows,
    t0: usize,
    fetch: GroupPrefetch,
    tables: ScaleTables,
    out: &mut GroupOut,
) {
    let (layout, quants) = (w.kind().layout(), w.kind().quant_bytes());
    let bias = w.kind().weight_bias();
    let records = w.group(g);
    let blocks = w.cols() / BLOCK;
    let q: [*const i8; T] = std::array::from_fn(|i| xq.q(t0 + i).as_ptr());
    let scales: [&[BlockScale]; T] = std::array::from_fn(|i| xq.scales(t0 + i));
    let mut acc = [_mm512_setzero_ps(); T];
    let mut off = [_mm512_setzero_ps(); T];
    let nibble = _mm512_set1_epi8(0x0f);
    let levels = _mm512_broadcast_i32x4(iq4_levels(-128));
    // A super-block's header scales, converted once for its 8 records.
    let (mut d, mut dmin) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut at = layout.record_at(0);
    #[allow(clippy::needless_range_loop)] // `b` indexes the records, the bytes and the scales
    for b in 0..blocks {
        if SUPER && tables.converts() && b % SUPER_RECORDS == 0 {
            let head = records.as_ptr().add(layout.header_at(b));
            d = _mm512_cvtph_ps(_mm256_loadu_si256(head.cast()));
            if MIN {
                dmin = _mm512_cvtph_ps(_mm256_loadu_si256(head.add(32).cast()));
            }
        }
        let rec = records.as_ptr().add(at);
        fetch.fetch(records.as_ptr(), layout, b, at);
        at += layout.record;
        if SUPER && (b + 1) % SUPER_RECORDS == 0 {
            at += layout.header;
        }
        // Weight vector `k` pairs with activation bytes `4k ..` (Q8_0: vectors 4..8 are
        // elements 16..32; 4-bit: the high nibbles of vector k − 4 are).
        let mut wv = [_mm512_setzero_si512(); 8];
        for k in 0..4 {
            let v = _mm512_loadu_si512(rec.add(64 * k).cast());
            if Q8 {
                wv[k] = v;
                wv[4 + k] = _mm512_loadu_si512(rec.add(64 * (4 + k)).cast());
            } else if TABLE {
                // The levels `T[q] + 128` of the nibbles (`vpshufb` looks up within each
                // 128-bit lane, where the table is repeated).
                wv[k] = _mm512_shuffle_epi8(levels, _mm512_and_si512(v, nibble));
                let high = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
                wv[4 + k] = _mm512_shuffle_epi8(levels, high);
            } else {
                wv[k] = _mm512_and_si512(v, nibble);
                wv[4 + k] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
                if PLANE {
                    let plane = _mm512_loadu_si512(rec.add(256).cast());
                    wv[k] = with_fifth_bits(wv[k], plane, k as i64);
                    wv[4 + k] = with_fifth_bits(wv[4 + k], plane, 4 + k as i64);
                }
            }
        }
        // The scale table, then the second one (mins, or Q6_K's scales of elements 16..32).
        // (No closure: it would not inherit the target features.)
        let (dw, mw) = if SUPER {
            if let ScaleTables::Load(p) = tables {
                let p = p.add(PER_BLOCK * b);
                (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(GROUP_ROWS)))
            } else {
                // Each product of an f16 and an 8-bit integer is exact.
                let second = if MIN {
                    _mm512_mul_ps(dmin, multipliers(rec.add(quants + 16)))
                } else if HALVES {
                    _mm512_mul_ps(d, multipliers(rec.add(quants + 16)))
                } else {
                    _mm512_setzero_ps()
                };
                let first = _mm512_mul_ps(d, multipliers(rec.add(quants)));
                if let ScaleTables::Store(p) = tables {
                    let p = p.add(PER_BLOCK * b);
                    _mm512_storeu_ps(p, first);
                    _mm512_storeu_ps(p.add(GROUP_ROWS), second);
                }
                (first, second)
            }
        } else {
            let second = if MIN || HALVES {
                _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(quants + 32).cast()))
            } else {
                _mm512_setzero_ps()
            };
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(quants).cast())),
                second,
            )
        };
        for t in 0..T {
            let x = q[t].add(b * BLOCK);
            let s = scales[t][b];
            // The weights' bias times the activations' sum, subtracted up front (exact, as
            // integers are, and one operation fewer per token and block).
            let mut lo = if bias != 0 && !HALVES {
                _mm512_set1_epi32(-(bias * s.sum))
            } else {
                _mm512_setzero_si512()
            };
            let mut hi = _mm512_setzero_si512();
            for k in 0..4 {
                lo = _mm512_dpbusd_epi32(lo, wv[k], broadcast4(x.add(4 * k)));
                hi = _mm512_dpbusd_epi32(hi, wv[4 + k], broadcast4(x.add(16 + 4 * k)));
            }
            if HALVES {
                let i_lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(bias * s.sum_lo));
                let i_hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(bias * (s.sum - s.sum_lo)));
                let dx = _mm512_set1_ps(s.d);
                let d_lo = _mm512_mul_ps(dw, dx);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i_lo), d_lo, acc[t]);
                let d_hi = _mm512_mul_ps(mw, dx);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i_hi), d_hi, acc[t]);
                continue;
            }
            let i = _mm512_add_epi32(lo, hi);
            let dd = _mm512_mul_ps(dw, _mm512_set1_ps(s.d));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), dd, acc[t]);
            if MIN {
                off[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(s.sx), off[t]);
            }
        }
    }
    // The live lanes only: a last group's padding rows have no place in the output.
    let live = (1u32 << out.live()) - 1;
    for t in 0..T {
        let y = if MIN {
            _mm512_add_ps(acc[t], off[t])
        } else {
            acc[t]
        };
        _mm512_mask_storeu_ps(out.token(t0 + t), live as __mmask16, y);
    }
}

/// As `packed::activations::quantize_row` (bitwise equal): the block maximum is exact, the
/// scale the same division, `vcvtps2dq` rounds to nearest even like the reference, and the
/// sum is exact.
///
/// # Safety
/// The CPU must support AVX-512 F and BW. Shapes are asserted.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn quantize_row(x: &[f32], q: &mut [i8], scales: &mut [BlockScale]) {
    assert!(
        x.len() == q.len() && x.len() == scales.len() * BLOCK,
        "quantize_row: shapes do not match"
    );
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    for (b, s) in scales.iter_mut().enumerate() {
        let p = x.as_ptr().add(b * BLOCK);
        let (v0, v1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
        let abs =
            |v: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs_mask));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(abs(v0), abs(v1)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d == 0.0 { 0.0 } else { 1.0 / d });
        let limit = |v: __m512i| {
            _mm512_max_epi32(
                _mm512_min_epi32(v, _mm512_set1_epi32(127)),
                _mm512_set1_epi32(-127),
            )
        };
        let q0 = limit(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id)));
        let q1 = limit(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id)));
        let dst = q.as_mut_ptr().add(b * BLOCK);
        _mm_storeu_si128(dst.cast(), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128(dst.add(16).cast(), _mm512_cvtepi32_epi8(q1));
        let sum_lo = _mm512_reduce_add_epi32(q0);
        let sum = sum_lo + _mm512_reduce_add_epi32(q1);
        *s = BlockScale {
            d,
            sum,
            sum_lo,
            sx: d * sum as f32,
        };
    }
}
