//! Q2_K: super-blocks of 256 elements in 84 bytes: 16 bytes of 4-bit scale/min pairs, 64
//! bytes `qs` of 2-bit values, f16 `d`, f16 `dmin`. Group `g` of 16 elements decodes as
//! `x = (d·sc[g])·q − dmin·m[g]` with `sc[g]` the low and `m[g]` the high nibble of byte `g`.
//!
//! Element `i = 128·h + 32·k + l` (`h < 2`, `k < 4`, `l < 32`) is bits `2k, 2k + 1` of
//! `qs[32·h + l]`.

use super::{inverse_or_zero, read_f16, to_f16};

const QK: usize = 256;
const QS: usize = QK / 16;
const D: usize = QS + QK / 4;
const BLOCK_BYTES: usize = D + 4;

/// The groups of 16 elements of one block `b` (84 bytes): `f(i0, d·sc, dmin·m, q)` with the
/// 2-bit values of elements `i0 .. i0 + 16` (both factors exact in f32).
#[inline(always)]
pub(super) fn groups(b: &[u8], mut f: impl FnMut(usize, f32, f32, &[u8; 16])) {
    let d = read_f16(b, D);
    let dmin = read_f16(b, D + 2);
    for g in 0..QK / 16 {
        let i0 = 16 * g;
        let (h, k) = (i0 / 128, (i0 % 128) / 32);
        let q: [u8; 16] = std::array::from_fn(|e| (b[QS + 32 * h + i0 % 32 + e] >> (2 * k)) & 0x03);
        let (sc, m) = (b[g] & 0x0f, b[g] >> 4);
        f(i0, d * f32::from(sc), dmin * f32::from(m), &q);
    }
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        groups(b, |i0, ds, dm, q| {
            for (y, &q) in y[i0..i0 + 16].iter_mut().zip(q) {
                *y = ds * f32::from(q) - dm;
            }
        });
    }
}

/// Round-to-nearest: group `g` covers `[min(x_min, 0), x_max]` with scale
/// `(x_max − min(x_min, 0)) / 3`; scales and mins are quantized to 4 bits against the
/// super-block's largest (`d = max scale / 15`, `dmin = max min / 15`, both f16), then each
/// element takes the nearest of the 4 levels its group can represent.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let mut scale = [0.0f32; 16];
        let mut min = [0.0f32; 16];
        for (g, group) in x.chunks_exact(16).enumerate() {
            let lo = group.iter().fold(0.0f32, |a, &v| a.min(v));
            let hi = group.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            scale[g] = (hi - lo) / 3.0;
            min[g] = -lo;
        }
        let (d_bytes, d) = to_f16(scale.iter().fold(0.0f32, |a, &v| a.max(v)) / 15.0);
        let (dmin_bytes, dmin) = to_f16(min.iter().fold(0.0f32, |a, &v| a.max(v)) / 15.0);
        let to_4bit = |v: f32, unit: f32| (v * inverse_or_zero(unit)).round().min(15.0) as u8;
        b.fill(0);
        for g in 0..16 {
            let (sc, m) = (to_4bit(scale[g], d), to_4bit(min[g], dmin));
            b[g] = sc | (m << 4);
            let ds = d * f32::from(sc);
            let dm = dmin * f32::from(m);
            let ids = inverse_or_zero(ds);
            for e in 0..16 {
                let i = 16 * g + e;
                let q = ((x[i] + dm) * ids).round().clamp(0.0, 3.0) as u8;
                let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
                b[QS + 32 * h + l] |= q << (2 * k);
            }
        }
        b[D..D + 2].copy_from_slice(&d_bytes);
        b[D + 2..D + 4].copy_from_slice(&dmin_bytes);
    }
}
