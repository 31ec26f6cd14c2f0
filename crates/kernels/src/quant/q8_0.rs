//! Q8_0: blocks of 32 elements in 34 bytes: f16 scale `d`, then 32 × i8 `q`; `x = q·d`.

use super::{inverse_or_zero, read_f16, to_f16};

const QK: usize = 32;
const BLOCK_BYTES: usize = 2 + QK;

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[2..]) {
            *y = f32::from(q as i8) * d;
        }
    }
}

pub(super) fn dot(src: &[u8], x: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for (b, x) in src.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(QK)) {
        let mut sum = 0.0f32;
        for (&q, &xv) in b[2..].iter().zip(x) {
            sum += f32::from(q as i8) * xv;
        }
        total += read_f16(b, 0) * sum;
    }
    total
}

/// `d = max|x| / 127` and `q = round(x / d)` (ties away from zero), as ggml's reference does;
/// `q` is computed with the unrounded f32 `d`, and `d` is stored as f16.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = inverse_or_zero(d);
        b[..2].copy_from_slice(&to_f16(d).0);
        for (q, &v) in b[2..].iter_mut().zip(x) {
            // |v * id| <= 127 (up to rounding), so the cast does not saturate in practice.
            *q = (v * id).round() as i8 as u8;
        }
    }
}
