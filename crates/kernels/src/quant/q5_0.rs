//! Q5_0: blocks of 32 elements in 22 bytes: f16 scale `d`, 4 bytes `qh` (a little-endian
//! `u32` of high bits), 16 bytes of low nibbles; `x = (q − 16)·d` with the 5-bit `q`.
//!
//! Element `j < 16` takes its low 4 bits from the low nibble of byte `j`, element `j + 16` from
//! its high nibble; element `i`'s fifth bit is bit `i` of `qh`.

use super::{inverse_or_zero, read_f16, to_f16};

const QK: usize = 32;
const BLOCK_BYTES: usize = 2 + 4 + QK / 2;

/// The 32 unsigned 5-bit values of a Q5_0 or Q5_1 block whose `qh` starts at `at` (the 16
/// nibble bytes follow it).
#[inline(always)]
pub(super) fn values5(b: &[u8], at: usize) -> [u8; QK] {
    let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let qs = &b[at + 4..at + 4 + QK / 2];
    std::array::from_fn(|i| {
        let low = if i < QK / 2 {
            qs[i] & 0x0f
        } else {
            qs[i - QK / 2] >> 4
        };
        low | ((((qh >> i) & 1) as u8) << 4)
    })
}

/// Packs 32 values `< 32` into `qh` at `at` and the 16 nibble bytes after it.
pub(super) fn pack5(q: &[u8; QK], b: &mut [u8], at: usize) {
    let mut qh = 0u32;
    for (i, &v) in q.iter().enumerate() {
        qh |= u32::from(v >> 4) << i;
    }
    b[at..at + 4].copy_from_slice(&qh.to_le_bytes());
    for j in 0..QK / 2 {
        b[at + 4 + j] = (q[j] & 0x0f) | ((q[j + QK / 2] & 0x0f) << 4);
    }
}

/// The signed values `q − 16` of one block (22 bytes) and its scale `d`: `x = v·d`.
pub(super) fn signed_values(b: &[u8]) -> (f32, [i8; QK]) {
    let q = values5(b, 2);
    (read_f16(b, 0), q.map(|v| v as i8 - 16))
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let (d, q) = signed_values(b);
        for (y, &v) in y.iter_mut().zip(&q) {
            *y = f32::from(v) * d;
        }
    }
}

/// ggml's reference: `d = x_ext / −16` with `x_ext` the value of largest magnitude,
/// `q = min(31, trunc(x / d + 16.5))`; `d` stored as f16.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let ext = super::largest_magnitude(x);
        let d = ext / -16.0;
        let id = inverse_or_zero(d);
        b[..2].copy_from_slice(&to_f16(d).0);
        let q: [u8; QK] = std::array::from_fn(|i| ((x[i] * id + 16.5) as u8).min(31));
        pack5(&q, b, 2);
    }
}
