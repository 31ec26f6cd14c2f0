//! Q6_K: super-blocks of 256 elements in 210 bytes: `ql` (128 bytes of low 4 bits), `qh`
//! (64 bytes of high 2-bit pairs), 16 × i8 scales `sc`, f16 `d`; `x = (d·sc[i / 16])·(q − 32)`
//! with the 6-bit `q` of element `i`.
//!
//! Element `i = 128·h + 32·k + l` (`h < 2`, `k < 4`, `l < 32`) takes its low 4 bits from
//! `ql[64·h + 32·(k % 2) + l]` (low nibble for `k < 2`, high nibble otherwise) and its high
//! 2 bits from bits `2k, 2k + 1` of `qh[32·h + l]`.

use super::{inverse_or_zero, to_f16, SubScale, SuperScale};

const QK: usize = 256;
const BLOCK_BYTES: usize = QK / 2 + QK / 4 + QK / 16 + 2;
const QH: usize = QK / 2;
const SCALES: usize = QH + QK / 4;
const D: usize = SCALES + QK / 16;

/// The signed 6-bit value `q − 32` of element `128·h + 32·k + l` of block `b`.
#[inline(always)]
fn value(b: &[u8], h: usize, k: usize, l: usize) -> i8 {
    let low = (b[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0f;
    let high = (b[QH + 32 * h + l] >> (2 * k)) & 0x03;
    (low | (high << 4)) as i8 - 32
}

/// Calls `f(i0, d·sc, q)` for each group of 16 elements `i0 .. i0 + 16` sharing a scale.
#[inline(always)]
fn for_each_group(b: &[u8], mut f: impl FnMut(usize, SubScale, &[i8; 16])) {
    let d = SuperScale::at(b, D);
    for h in 0..2 {
        for k in 0..4 {
            for g in 0..2 {
                let i0 = 128 * h + 32 * k + 16 * g;
                let q: [i8; 16] = std::array::from_fn(|j| value(b, h, k, 16 * g + j));
                f(
                    i0,
                    SubScale {
                        d,
                        k: b[SCALES + i0 / 16] as i8,
                    },
                    &q,
                );
            }
        }
    }
}

/// The groups of 16 elements of one block `b` (210 bytes) sharing a scale: `f(i0, d·sc, q)`
/// with the signed values `q − 32` of elements `i0 .. i0 + 16` (exact: `d·sc` is the product
/// of an f16 and an 8-bit integer). For the int8 kernels' repacking.
pub(super) fn groups(b: &[u8], f: impl FnMut(usize, SubScale, &[i8; 16])) {
    for_each_group(b, f);
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        for_each_group(b, |i0, ds, q| {
            let ds = ds.value();
            for (y, &q) in y[i0..i0 + 16].iter_mut().zip(q) {
                *y = ds * f32::from(q);
            }
        });
    }
}

/// Per group of 16: `d·sc · Σ (q − 32)·x`.
pub(super) fn dot(src: &[u8], x: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for (b, x) in src.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(QK)) {
        for_each_group(b, |i0, ds, q| {
            let ds = ds.value();
            let mut sum = 0.0f32;
            for (&xv, &q) in x[i0..i0 + 16].iter().zip(q) {
                sum += f32::from(q) * xv;
            }
            total += ds * sum;
        });
    }
    total
}

/// Round-to-nearest: group `g` gets scale `max|x| / 31`; the 16 scales are quantized to i8
/// against the largest (`d = max scale / 127`, stored as f16), then each element takes the
/// nearest level in `−32 ..= 31` of its group.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let scale: [f32; 16] = std::array::from_fn(|g| {
            x[16 * g..16 * (g + 1)]
                .iter()
                .fold(0.0f32, |a, v| a.max(v.abs()))
                / 31.0
        });
        let (d_bytes, d) = to_f16(scale.iter().fold(0.0f32, |a, &v| a.max(v)) / 127.0);
        let id = inverse_or_zero(d);
        let sc: [i8; 16] = std::array::from_fn(|g| (scale[g] * id).round().min(127.0) as i8);
        b[..SCALES].fill(0);
        for (i, &v) in x.iter().enumerate() {
            let ids = inverse_or_zero(d * f32::from(sc[i / 16]));
            let q = ((v * ids).round().clamp(-32.0, 31.0) as i8 + 32) as u8;
            let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
            b[64 * h + 32 * (k % 2) + l] |= (q & 0x0f) << (4 * (k / 2));
            b[QH + 32 * h + l] |= (q >> 4) << (2 * k);
        }
        for (s, &v) in b[SCALES..D].iter_mut().zip(&sc) {
            *s = v as u8;
        }
        b[D..D + 2].copy_from_slice(&d_bytes);
    }
}
