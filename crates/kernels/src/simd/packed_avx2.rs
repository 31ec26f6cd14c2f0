//! The int8 kernel on packed matrices with AVX2 (no VNNI): the 16 rows of a group are two `ymm`
//! halves of `i32` (rows 0..8 from bytes 0..32 of each 64-byte weight vector, rows 8..16 from
//! bytes 32..64), and `vpmaddubsw` + `vpmaddwd` stand in for `vpdpbusd`. Bitwise equal to
//! `packed::reference` (integer sums are exact; the f32 steps are the same operations in the
//! same order).
//!
//! **No saturation.** `vpmaddubsw` saturates each `i16` sum of two products:
//! - 4-bit weights are nibbles `0..=15` and activations lie in `-127..=127`, so a pair is at most
//!   `2·15·127 = 3810` in magnitude, and the 8 pairs of a row's 32 products summed in `i16`
//!   (before one `vpmaddwd`) at most `30480 < 32767`: exact.
//! - Q8_0's stored `u = q + 128` would reach `2·255·127`. So the signed weight `q = u ^ 0x80` is
//!   recovered and `vpmaddubsw(|q|, sign(x, q))` computes `Σ q·x` directly (pairs at most
//!   `2·128·127 = 32512`, widened to `i32` at once): the same integer as the reference's
//!   `Σ u·x − 128·Σx`, so no bias is subtracted.
//! - 5-bit weights (the plane kinds, `0..=31`): a pair is at most `2·31·127 = 7874`, and each
//!   `vpmaddubsw` result is widened to `i32` at once.
//! - Q6_K's stored bytes are its 6-bit `q` (`0..=63`): a pair is at most `2·63·127 = 16002`,
//!   and each `vpmaddubsw` result is widened to `i32` at once (per half of 16 elements, as
//!   its two scales need).

use std::arch::x86_64::*;

use crate::packed::{
    BlockScale, GroupOut, PackedMatrix, QuantizedRows, BLOCK, GROUP_ROWS, SUPER_RECORDS,
};

use super::group_prefetch::GroupPrefetch;
use super::scale_tables::ScaleTables;
use super::PACKED_SCALES_PER_BLOCK as PER_BLOCK;

/// Tokens whose sums advance together over one decoded weight record.
const TILE: usize = 4;
/// Rows per `ymm` of `i32`: a group is two halves.
const HALF: usize = GROUP_ROWS / 2;

/// `out[t, j] = W[16g + j] · x[t]` for every token of `xq` and live row `j` (as
/// `packed::reference::group`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. Shapes are asserted.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group(
    w: &PackedMatrix,
    g: usize,
    xq: &QuantizedRows,
    out: &mut GroupOut,
    scales: &mut [f32],
) {
    assert!(
        xq.cols() == w.cols() && out.n_tokens() == xq.n_tokens(),
        "packed avx2: shapes do not match"
    );
    with_kind_flags!(w.kind(), tiles(w, g, xq, out, scales))
}

// `tiles`: every token of `xq`, `TILE` at a time, with this module's `tile`.
define_tiles!();

/// `nibbles` (bytes below 16) with 16 added where bit `bit` of the same byte of the fifth-bit
/// line `plane` is set: the line shifted in 16-bit lanes so that bit lands on bit 4 (a bit
/// crossing into the other byte lands below bit 4 or above it, where the mask drops it).
#[inline(always)]
unsafe fn with_fifth_bits(nibbles: __m256i, plane: __m256i, bit: i64) -> __m256i {
    let at4 = if bit <= 4 {
        _mm256_sll_epi16(plane, _mm_set_epi64x(0, 4 - bit))
    } else {
        _mm256_srl_epi16(plane, _mm_set_epi64x(0, bit - 4))
    };
    _mm256_or_si256(nibbles, _mm256_and_si256(at4, _mm256_set1_epi8(0x10)))
}

/// The 8 signed bytes at `p` as f32 (8 rows' scale multipliers of a super-scaled record).
#[inline(always)]
unsafe fn multipliers(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())))
}

/// The 4 activation bytes at `p` in every lane.
#[inline(always)]
unsafe fn broadcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32(p.cast::<i32>().read_unaligned())
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
    // `c` of the module docs (Q8_0's is folded into the signed weights instead).
    let bias = if (Q8 || TABLE) && !HALVES {
        0
    } else {
        w.kind().weight_bias()
    };
    let records = w.group(g);
    let blocks = w.cols() / BLOCK;
    let q: [*const i8; T] = std::array::from_fn(|i| xq.q(t0 + i).as_ptr());
    let scales: [&[BlockScale]; T] = std::array::from_fn(|i| xq.scales(t0 + i));
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    let mut off = [[_mm256_setzero_ps(); 2]; T];
    let nibble = _mm256_set1_epi8(0x0f);
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let ones = _mm256_set1_epi16(1);
    let levels = _mm256_broadcastsi128_si256(super::packed_vnni::iq4_levels(0));
    // A super-block's header scales (per half of the rows), converted once for its 8 records.
    let (mut d, mut dmin) = ([_mm256_setzero_ps(); 2], [_mm256_setzero_ps(); 2]);
    let mut at = layout.record_at(0);
    #[allow(clippy::needless_range_loop)] // `b` indexes the records, the bytes and the scales
    for b in 0..blocks {
        if SUPER && tables.converts() && b % SUPER_RECORDS == 0 {
            let head = records.as_ptr().add(layout.header_at(b));
            for h in 0..2 {
                d[h] = _mm256_cvtph_ps(_mm_load_si128(head.add(16 * h).cast()));
                if MIN {
                    dmin[h] = _mm256_cvtph_ps(_mm_load_si128(head.add(32 + 16 * h).cast()));
                }
            }
        }
        let rec = records.as_ptr().add(at);
        fetch.fetch(records.as_ptr(), layout, b, at);
        at += layout.record;
        if SUPER && (b + 1) % SUPER_RECORDS == 0 {
            at += layout.header;
        }
        for h in 0..2 {
            // Weight vector `k` (this half) pairs with activation bytes `4k ..` (Q8_0: vectors
            // 4..8 are elements 16..32; 4-bit: the high nibbles of vector k − 4 are). For Q8_0,
            // `wv` holds |q| and `sg` the signed q, which only lends its sign to `x`.
            let mut wv = [_mm256_setzero_si256(); 8];
            let mut sg = [_mm256_setzero_si256(); 8];
            for k in 0..4 {
                let v = _mm256_load_si256(rec.add(64 * k + 32 * h).cast());
                if HALVES {
                    // Q6_K's bytes are its unsigned 6-bit values: pairs of products stay
                    // within `2·63·127`, and each is widened to `i32` at once.
                    wv[k] = v;
                    wv[4 + k] = _mm256_load_si256(rec.add(64 * (4 + k) + 32 * h).cast());
                } else if Q8 || TABLE {
                    if TABLE {
                        // The signed levels `T[q]` of the nibbles (`vpshufb` looks up
                        // within each 128-bit lane, where the table is repeated).
                        sg[k] = _mm256_shuffle_epi8(levels, _mm256_and_si256(v, nibble));
                        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
                        sg[4 + k] = _mm256_shuffle_epi8(levels, high);
                    } else {
                        let v4 = _mm256_load_si256(rec.add(64 * (4 + k) + 32 * h).cast());
                        sg[k] = _mm256_xor_si256(v, flip);
                        sg[4 + k] = _mm256_xor_si256(v4, flip);
                    }
                    // |−128| is 0x80, which `vpmaddubsw` reads as the unsigned 128, and
                    // sign(x, −128) = −x (never overflows: q_x ≥ −127), so even that edge
                    // (never produced by Q8_0 quantization) gives 128·(−x) = q·x exactly.
                    wv[k] = _mm256_abs_epi8(sg[k]);
                    wv[4 + k] = _mm256_abs_epi8(sg[4 + k]);
                } else {
                    wv[k] = _mm256_and_si256(v, nibble);
                    wv[4 + k] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
                    if PLANE {
                        // This half's 8 rows of the line of fifth bits.
                        let plane = _mm256_load_si256(rec.add(256 + 32 * h).cast());
                        wv[k] = with_fifth_bits(wv[k], plane, k as i64);
                        wv[4 + k] = with_fifth_bits(wv[4 + k], plane, 4 + k as i64);
                    }
                }
            }
            // The scale table, then the second one (mins, or Q6_K's scales of elements
            // 16..32), this half's 8 rows of each.
            let (dw, mw) = if SUPER {
                if let ScaleTables::Load(p) = tables {
                    let p = p.add(PER_BLOCK * b + HALF * h);
                    (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(GROUP_ROWS)))
                } else {
                    // Each product of an f16 and an 8-bit integer is exact.
                    let k = rec.add(quants + HALF * h);
                    let second = if MIN {
                        _mm256_mul_ps(dmin[h], multipliers(k.add(GROUP_ROWS)))
                    } else if HALVES {
                        _mm256_mul_ps(d[h], multipliers(k.add(GROUP_ROWS)))
                    } else {
                        _mm256_setzero_ps()
                    };
                    let first = _mm256_mul_ps(d[h], multipliers(k));
                    if let ScaleTables::Store(p) = tables {
                        let p = p.add(PER_BLOCK * b + HALF * h);
                        _mm256_storeu_ps(p, first);
                        _mm256_storeu_ps(p.add(GROUP_ROWS), second);
                    }
                    (first, second)
                }
            } else {
                let second = if MIN || HALVES {
                    _mm256_cvtph_ps(_mm_load_si128(rec.add(quants + 32 + 16 * h).cast()))
                } else {
                    _mm256_setzero_ps()
                };
                (
                    _mm256_cvtph_ps(_mm_load_si128(rec.add(quants + 16 * h).cast())),
                    second,
                )
            };
            for t in 0..T {
                let x = q[t].add(b * BLOCK);
                if HALVES {
                    let mut lo = _mm256_setzero_si256();
                    let mut hi = _mm256_setzero_si256();
                    for k in 0..4 {
                        let p = _mm256_maddubs_epi16(wv[k], broadcast4(x.add(4 * k)));
                        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(p, ones));
                        let p = _mm256_maddubs_epi16(wv[4 + k], broadcast4(x.add(16 + 4 * k)));
                        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(p, ones));
                    }
                    let s = scales[t][b];
                    let i_lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(bias * s.sum_lo));
                    let i_hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(bias * (s.sum - s.sum_lo)));
                    let dx = _mm256_set1_ps(s.d);
                    let d_lo = _mm256_mul_ps(dw, dx);
                    acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i_lo), d_lo, acc[t][h]);
                    let d_hi = _mm256_mul_ps(mw, dx);
                    acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i_hi), d_hi, acc[t][h]);
                    continue;
                }
                let mut i = if Q8 || TABLE {
                    let mut i = _mm256_setzero_si256();
                    for k in 0..8 {
                        let xs = _mm256_sign_epi8(broadcast4(x.add(4 * k)), sg[k]);
                        let p = _mm256_maddubs_epi16(wv[k], xs);
                        i = _mm256_add_epi32(i, _mm256_madd_epi16(p, ones));
                    }
                    i
                } else if PLANE {
                    // 5-bit weights: 8 pairs of products could overflow `i16`, so each
                    // `vpmaddubsw` is widened to `i32` at once.
                    let mut i = _mm256_setzero_si256();
                    for k in 0..4 {
                        let lo = _mm256_maddubs_epi16(wv[k], broadcast4(x.add(4 * k)));
                        let hi = _mm256_maddubs_epi16(wv[4 + k], broadcast4(x.add(16 + 4 * k)));
                        i = _mm256_add_epi32(i, _mm256_madd_epi16(lo, ones));
                        i = _mm256_add_epi32(i, _mm256_madd_epi16(hi, ones));
                    }
                    i
                } else {
                    let mut p = _mm256_setzero_si256();
                    for k in 0..4 {
                        let lo = _mm256_maddubs_epi16(wv[k], broadcast4(x.add(4 * k)));
                        let hi = _mm256_maddubs_epi16(wv[4 + k], broadcast4(x.add(16 + 4 * k)));
                        p = _mm256_add_epi16(p, _mm256_add_epi16(lo, hi));
                    }
                    _mm256_madd_epi16(p, ones)
                };
                let s = scales[t][b];
                if bias != 0 {
                    i = _mm256_sub_epi32(i, _mm256_set1_epi32(bias * s.sum));
                }
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(s.d));
                acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), dd, acc[t][h]);
                if MIN {
                    off[t][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(s.sx), off[t][h]);
                }
            }
        }
    }
    // The live lanes only: a last group's padding rows have no place in the output.
    let live = out.live();
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for t in 0..T {
        let p = out.token(t0 + t);
        for h in 0..2 {
            let y = if MIN {
                _mm256_add_ps(acc[t][h], off[t][h])
            } else {
                acc[t][h]
            };
            // The half's live lanes: 8, fewer in a last group, or none.
            let n = live.saturating_sub(h * HALF).min(HALF);
            if n == HALF {
                _mm256_storeu_ps(p.wrapping_add(h * HALF), y);
            } else if n > 0 {
                // Lanes below `n` (a mask lane's top bit set where it is).
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane);
                _mm256_maskstore_ps(p.wrapping_add(h * HALF), mask, y);
            }
        }
    }
}
