//! Q4_1: blocks of 32 elements in 20 bytes: f16 scale `d`, f16 offset `m`, then 16 bytes of
//! 4-bit `q`; `x = q·d + m`. Byte `j` holds element `j` in its low nibble and element `j + 16`
//! in its high nibble.

use super::{inverse_or_zero, read_f16, to_f16};

const QK: usize = 32;
const BLOCK_BYTES: usize = 4 + QK / 2;

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b, 0);
        let m = read_f16(b, 2);
        let (lo, hi) = y.split_at_mut(QK / 2);
        for ((&q, lo), hi) in b[4..].iter().zip(lo).zip(hi) {
            *lo = f32::from(q & 0x0f) * d + m;
            *hi = f32::from(q >> 4) * d + m;
        }
    }
}

/// Per block: `d · Σ q·x + m · Σ x`.
pub(super) fn dot(src: &[u8], x: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for (b, x) in src.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(QK)) {
        let (lo, hi) = x.split_at(QK / 2);
        let mut qx = 0.0f32;
        let mut sx = 0.0f32;
        for ((&q, &xl), &xh) in b[4..].iter().zip(lo).zip(hi) {
            qx += f32::from(q & 0x0f) * xl + f32::from(q >> 4) * xh;
            sx += xl + xh;
        }
        total += read_f16(b, 0) * qx + read_f16(b, 2) * sx;
    }
    total
}

/// ggml's reference: `d = (max − min) / 15`, `m = min`, `q = min(15, trunc((x − min) / d + 0.5))`;
/// `d` and `m` are stored as f16.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let min = x.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let max = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let d = (max - min) / 15.0;
        let id = inverse_or_zero(d);
        b[..2].copy_from_slice(&to_f16(d).0);
        b[2..4].copy_from_slice(&to_f16(min).0);
        let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
        let (lo, hi) = x.split_at(QK / 2);
        for ((byte, &l), &h) in b[4..].iter_mut().zip(lo).zip(hi) {
            *byte = q(l) | (q(h) << 4);
        }
    }
}
