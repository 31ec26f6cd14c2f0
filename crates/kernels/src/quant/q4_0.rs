//! Q4_0: blocks of 32 elements in 18 bytes: f16 scale `d`, then 16 bytes of 4-bit `q`;
//! `x = (q − 8)·d`. Byte `j` holds element `j` in its low nibble and element `j + 16` in its
//! high nibble.

use super::{inverse_or_zero, read_f16, to_f16};

const QK: usize = 32;
const BLOCK_BYTES: usize = 2 + QK / 2;

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b, 0);
        let (lo, hi) = y.split_at_mut(QK / 2);
        for ((&q, lo), hi) in b[2..].iter().zip(lo).zip(hi) {
            *lo = f32::from((q & 0x0f) as i8 - 8) * d;
            *hi = f32::from((q >> 4) as i8 - 8) * d;
        }
    }
}

pub(super) fn dot(src: &[u8], x: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for (b, x) in src.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(QK)) {
        let (lo, hi) = x.split_at(QK / 2);
        let mut sum = 0.0f32;
        for ((&q, &xl), &xh) in b[2..].iter().zip(lo).zip(hi) {
            sum += f32::from((q & 0x0f) as i8 - 8) * xl + f32::from((q >> 4) as i8 - 8) * xh;
        }
        total += read_f16(b, 0) * sum;
    }
    total
}

/// ggml's reference: `d = m / −8` where `m` is the element of largest magnitude (the first one
/// on ties), `q = min(15, trunc(x / d + 8.5))`; `d` is stored as f16.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let mut max = x[0];
        for &v in &x[1..] {
            if v.abs() > max.abs() {
                max = v;
            }
        }
        let d = max / -8.0;
        let id = inverse_or_zero(d);
        b[..2].copy_from_slice(&to_f16(d).0);
        let q = |v: f32| ((v * id + 8.5) as u8).min(15);
        let (lo, hi) = x.split_at(QK / 2);
        for ((byte, &l), &h) in b[2..].iter_mut().zip(lo).zip(hi) {
            *byte = q(l) | (q(h) << 4);
        }
    }
}
