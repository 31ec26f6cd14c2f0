//! Q5_1: blocks of 32 elements in 24 bytes: f16 scale `d`, f16 offset `m`, 4 bytes `qh`,
//! 16 bytes of low nibbles (Q5_0's bit layout); `x = q·d + m` with the 5-bit `q`.

use super::q5_0::{pack5, values5};
use super::{inverse_or_zero, read_f16, to_f16};

const QK: usize = 32;
const BLOCK_BYTES: usize = 4 + 4 + QK / 2;

/// The unsigned 5-bit values of one block (24 bytes), its scale `d` and offset `m`:
/// `x = q·d + m`.
pub(super) fn values(b: &[u8]) -> (f32, f32, [u8; QK]) {
    (read_f16(b, 0), read_f16(b, 2), values5(b, 4))
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let (d, m, q) = values(b);
        for (y, &v) in y.iter_mut().zip(&q) {
            *y = f32::from(v) * d + m;
        }
    }
}

/// ggml's reference: `d = (max − min) / 31`, `m = min`, `q = min(31, trunc((x − min)/d + 0.5))`;
/// `d` and `m` stored as f16.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let min = x.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let max = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let d = (max - min) / 31.0;
        let id = inverse_or_zero(d);
        b[..2].copy_from_slice(&to_f16(d).0);
        b[2..4].copy_from_slice(&to_f16(min).0);
        let q: [u8; QK] = std::array::from_fn(|i| (((x[i] - min) * id + 0.5) as u8).min(31));
        pack5(&q, b, 4);
    }
}
