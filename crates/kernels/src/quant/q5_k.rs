//! Q5_K: super-blocks of 256 elements in 176 bytes: f16 `d`, f16 `dmin`, 12 bytes of 6-bit
//! scales `sc[8]` and mins `m[8]` (Q4_K's packing), 32 bytes `qh` of fifth bits, 128 bytes of
//! low nibbles. Sub-block `s` (32 elements) decodes as `x = (d·sc[s])·q − dmin·m[s]`.
//!
//! Element `l` of sub-block `s = 2j + h` takes its low 4 bits from byte `48 + 32·j + l` (low
//! nibble for `h = 0`, high for `h = 1`) and its fifth bit from bit `s` of `qh[l]`.

use super::q4_k::{pack_scales, scale_min};
use super::{inverse_or_zero, to_f16, SubScale, SuperScale};

const QK: usize = 256;
const SUB: usize = 32;
const QH: usize = 16;
const QS: usize = QH + QK / 8;
const BLOCK_BYTES: usize = QS + QK / 2;

/// The sub-blocks of one block `b` (176 bytes): `f(s, d·sc[s], dmin·m[s], q)` with the 32
/// unsigned 5-bit values of sub-block `s` (both factors exact in f32).
#[inline(always)]
pub(super) fn sub_blocks(b: &[u8], mut f: impl FnMut(usize, SubScale, SubScale, [u8; SUB])) {
    let (d, dmin) = (SuperScale::at(b, 0), SuperScale::at(b, 2));
    for s in 0..QK / SUB {
        let (sc, m) = scale_min(&b[4..16], s);
        let nibbles = &b[QS + SUB * (s / 2)..QS + SUB * (s / 2 + 1)];
        let shift = 4 * (s % 2);
        let q =
            std::array::from_fn(|l| ((nibbles[l] >> shift) & 0x0f) | (((b[QH + l] >> s) & 1) << 4));
        f(
            s,
            SubScale { d, k: sc as i8 },
            SubScale {
                d: dmin,
                k: m as i8,
            },
            q,
        );
    }
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        sub_blocks(b, |s, ds, dm, q| {
            let (ds, dm) = (ds.value(), dm.value());
            for (y, &q) in y[s * SUB..(s + 1) * SUB].iter_mut().zip(&q) {
                *y = ds * f32::from(q) - dm;
            }
        });
    }
}

/// Round-to-nearest, as Q4_K's with 32 levels: sub-block `s` covers `[min(x_min, 0), x_max]`
/// with scale `(x_max − min(x_min, 0)) / 31`; scales and mins are quantized to 6 bits against
/// the super-block's largest (`d = max scale / 63`, `dmin = max min / 63`, both f16).
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let mut scale = [0.0f32; 8];
        let mut min = [0.0f32; 8];
        for (s, sub) in x.chunks_exact(SUB).enumerate() {
            let lo = sub.iter().fold(0.0f32, |a, &v| a.min(v));
            let hi = sub.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            scale[s] = (hi - lo) / 31.0;
            min[s] = -lo;
        }
        let (d_bytes, d) = to_f16(scale.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0);
        let (dmin_bytes, dmin) = to_f16(min.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0);
        let to_6bit = |v: f32, unit: f32| (v * inverse_or_zero(unit)).round().min(63.0) as u8;
        let sc: [u8; 8] = std::array::from_fn(|s| to_6bit(scale[s], d));
        let m: [u8; 8] = std::array::from_fn(|s| to_6bit(min[s], dmin));
        b[0..2].copy_from_slice(&d_bytes);
        b[2..4].copy_from_slice(&dmin_bytes);
        pack_scales(&sc, &m, &mut b[4..16]);
        b[QH..].fill(0);
        for (s, sub) in x.chunks_exact(SUB).enumerate() {
            let ds = d * f32::from(sc[s]);
            let dm = dmin * f32::from(m[s]);
            let ids = inverse_or_zero(ds);
            for (l, &v) in sub.iter().enumerate() {
                let q = ((v + dm) * ids).round().clamp(0.0, 31.0) as u8;
                b[QS + SUB * (s / 2) + l] |= (q & 0x0f) << (4 * (s % 2));
                b[QH + l] |= (q >> 4) << s;
            }
        }
    }
}
