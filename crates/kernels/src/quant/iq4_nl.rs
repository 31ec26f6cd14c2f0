//! IQ4_NL: blocks of 32 elements in 18 bytes: f16 scale `d`, 16 bytes of 4-bit indices into
//! the non-linear table [`KVALUES`]; `x = d·KVALUES[q]`. Byte `j` holds element `j` in its
//! low nibble and element `j + 16` in its high nibble (Q4_0's order).

use super::{inverse_or_zero, read_f16, to_f16};

const QK: usize = 32;
const BLOCK_BYTES: usize = 2 + QK / 2;

/// ggml's `kvalues_iq4nl`: the 16 levels of IQ4_NL and IQ4_XS.
pub(super) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 32 table values of the 16 nibble bytes `qs` (element `j` low nibble of byte `j`,
/// element `j + 16` high nibble).
#[inline(always)]
pub(super) fn table_values(qs: &[u8]) -> [i8; QK] {
    std::array::from_fn(|i| {
        let n = if i < QK / 2 {
            qs[i] & 0x0f
        } else {
            qs[i - QK / 2] >> 4
        };
        KVALUES[usize::from(n)]
    })
}

/// The index of the level nearest to `v` (in units of the scale).
pub(super) fn nearest_level(v: f32) -> u8 {
    let mut best = 0u8;
    for (i, &k) in KVALUES.iter().enumerate() {
        if (v - f32::from(k)).abs() < (v - f32::from(KVALUES[usize::from(best)])).abs() {
            best = i as u8;
        }
    }
    best
}

/// Packs 32 level indices as [`table_values`] reads them.
pub(super) fn pack_levels(idx: &[u8; QK], qs: &mut [u8]) {
    for j in 0..QK / 2 {
        qs[j] = idx[j] | (idx[j + QK / 2] << 4);
    }
}

/// The scale and table values of one block (18 bytes): `x = d·v`.
pub(super) fn signed_values(b: &[u8]) -> (f32, [i8; QK]) {
    (read_f16(b, 0), table_values(&b[2..]))
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let (d, q) = signed_values(b);
        for (y, &v) in y.iter_mut().zip(&q) {
            *y = d * f32::from(v);
        }
    }
}

/// Round-to-nearest: `d = x_ext / −127` (the value of largest magnitude lands on the level
/// −127), stored as f16; each element takes the nearest level.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let ext = super::largest_magnitude(x);
        let (bytes, d) = to_f16(ext / -127.0);
        let id = inverse_or_zero(d);
        b[..2].copy_from_slice(&bytes);
        let idx: [u8; QK] = std::array::from_fn(|i| nearest_level(x[i] * id));
        pack_levels(&idx, &mut b[2..]);
    }
}
