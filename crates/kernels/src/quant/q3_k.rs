//! Q3_K: super-blocks of 256 elements in 110 bytes: 32 bytes `hmask`, 64 bytes `qs` of 2-bit
//! pairs, 12 bytes of 6-bit signed scales, f16 `d`. Group `g` of 16 elements decodes as
//! `x = (d·(sc[g] − 32))·q` with the signed 3-bit `q` in `−4 ..= 3`.
//!
//! Element `i = 128·h + 32·k + l` (`h < 2`, `k < 4`, `l < 32`): its low 2 bits are bits
//! `2k, 2k + 1` of `qs[32·h + l]`; `q` is those bits minus 4 unless bit `i / 32` of
//! `hmask[l]` is set. Scales: `sc[g]` has low 4 bits from byte `g % 8` (low nibble for
//! `g < 8`, high otherwise) and high 2 bits from bits `2·(g / 4)` of byte `8 + g % 4`.

use super::{inverse_or_zero, to_f16, SubScale, SuperScale};

const QK: usize = 256;
const QS: usize = QK / 8;
const SCALES: usize = QS + QK / 4;
const D: usize = SCALES + 12;
const BLOCK_BYTES: usize = D + 2;

/// The 6-bit scale of group `g < 16` (unsigned; the signed scale is `sc − 32`).
#[inline(always)]
fn scale(s: &[u8], g: usize) -> u8 {
    let low = (s[g % 8] >> (4 * (g / 8))) & 0x0f;
    let high = (s[8 + g % 4] >> (2 * (g / 4))) & 0x03;
    low | (high << 4)
}

/// The groups of 16 elements of one block `b` (110 bytes) sharing a scale: `f(i0, d·(sc − 32),
/// q)` with the signed 3-bit values of elements `i0 .. i0 + 16` (`d·(sc − 32)` is exact).
#[inline(always)]
pub(super) fn groups(b: &[u8], mut f: impl FnMut(usize, SubScale, &[i8; 16])) {
    let d = SuperScale::at(b, D);
    for g in 0..QK / 16 {
        let i0 = 16 * g;
        let (h, k) = (i0 / 128, (i0 % 128) / 32);
        let q: [i8; 16] = std::array::from_fn(|e| {
            let l = i0 % 32 + e;
            let low = ((b[QS + 32 * h + l] >> (2 * k)) & 0x03) as i8;
            let high_set = (b[l] >> (i0 / 32)) & 1 == 1;
            if high_set {
                low
            } else {
                low - 4
            }
        });
        let sc = scale(&b[SCALES..D], g) as i8 - 32;
        f(i0, SubScale { d, k: sc }, &q);
    }
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        groups(b, |i0, ds, q| {
            let ds = ds.value();
            for (y, &q) in y[i0..i0 + 16].iter_mut().zip(q) {
                *y = ds * f32::from(q);
            }
        });
    }
}

/// Round-to-nearest: group `g` gets the signed scale `x_ext / −4` (its value of largest
/// magnitude lands on the level −4); the 16 scales are quantized to `−31 ..= 31` against the
/// largest magnitude (`d = max|scale| / 31`, stored as f16), then each element takes the
/// nearest level in `−4 ..= 3` of its group.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let scale: [f32; 16] = std::array::from_fn(|g| {
            let ext = super::largest_magnitude(&x[16 * g..16 * (g + 1)]);
            ext / -4.0
        });
        let (d_bytes, d) = to_f16(scale.iter().fold(0.0f32, |a, &v| a.max(v.abs())) / 31.0);
        let id = inverse_or_zero(d);
        let sc: [i8; 16] =
            std::array::from_fn(|g| (scale[g] * id).round().clamp(-31.0, 31.0) as i8);
        b.fill(0);
        for (i, &v) in x.iter().enumerate() {
            let ids = inverse_or_zero(d * f32::from(sc[i / 16]));
            let q = ((v * ids).round().clamp(-4.0, 3.0) as i8 + 4) as u8;
            let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
            b[QS + 32 * h + l] |= (q & 0x03) << (2 * k);
            b[l] |= (q >> 2) << (i / 32);
        }
        for (g, &s) in sc.iter().enumerate() {
            let u = (s + 32) as u8;
            b[SCALES + g % 8] |= (u & 0x0f) << (4 * (g / 8));
            b[SCALES + 8 + g % 4] |= (u >> 4) << (2 * (g / 4));
        }
        b[D..D + 2].copy_from_slice(&d_bytes);
    }
}
