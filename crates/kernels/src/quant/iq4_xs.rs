//! IQ4_XS: super-blocks of 256 elements in 136 bytes: f16 `d`, a little-endian `u16` of
//! high scale bits, 4 bytes of low scale nibbles, then 8 sub-blocks of 16 bytes laid out as
//! IQ4_NL's (4-bit indices into the non-linear table). Sub-block `s` (32 elements) decodes as
//! `x = (d·(ls[s] − 32))·KVALUES[q]` with the 6-bit `ls[s]`: low 4 bits from byte `4 + s / 2`
//! (low nibble for even `s`), high 2 bits from bits `2s, 2s + 1` of the `u16`.

use super::iq4_nl::{nearest_level, pack_levels, table_values};
use super::{inverse_or_zero, to_f16, SubScale, SuperScale};

const QK: usize = 256;
const SUB: usize = 32;
const QS: usize = 8;
const BLOCK_BYTES: usize = QS + QK / 2;

/// The sub-blocks of one block `b` (136 bytes): `f(s, d·(ls − 32), v)` with the 32 table
/// values of sub-block `s` (`d·(ls − 32)` is exact in f32).
#[inline(always)]
pub(super) fn sub_blocks(b: &[u8], mut f: impl FnMut(usize, SubScale, [i8; SUB])) {
    let d = SuperScale::at(b, 0);
    let high = u16::from_le_bytes([b[2], b[3]]);
    for s in 0..QK / SUB {
        let low = (b[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
        let ls = low | ((((high >> (2 * s)) & 0x03) as u8) << 4);
        let qs = &b[QS + 16 * s..QS + 16 * (s + 1)];
        f(
            s,
            SubScale {
                d,
                k: ls as i8 - 32,
            },
            table_values(qs),
        );
    }
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        sub_blocks(b, |s, ds, v| {
            let ds = ds.value();
            for (y, &v) in y[s * SUB..(s + 1) * SUB].iter_mut().zip(&v) {
                *y = ds * f32::from(v);
            }
        });
    }
}

/// Round-to-nearest: sub-block `s` gets the signed scale `x_ext / −127` (as IQ4_NL's block);
/// the 8 scales are quantized to `−31 ..= 31` against the largest magnitude (`d = max|scale|
/// / 31`, stored as f16), then each element takes the nearest level of its sub-block.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let scale: [f32; 8] = std::array::from_fn(|s| {
            let ext = super::largest_magnitude(&x[SUB * s..SUB * (s + 1)]);
            ext / -127.0
        });
        let (d_bytes, d) = to_f16(scale.iter().fold(0.0f32, |a, &v| a.max(v.abs())) / 31.0);
        let id = inverse_or_zero(d);
        b.fill(0);
        b[..2].copy_from_slice(&d_bytes);
        let mut high = 0u16;
        for (s, sub) in x.chunks_exact(SUB).enumerate() {
            let ls = ((scale[s] * id).round().clamp(-31.0, 31.0) as i8 + 32) as u8;
            b[4 + s / 2] |= (ls & 0x0f) << (4 * (s % 2));
            high |= u16::from(ls >> 4) << (2 * s);
            let ids = inverse_or_zero(d * f32::from(ls as i8 - 32));
            let idx: [u8; SUB] = std::array::from_fn(|l| nearest_level(sub[l] * ids));
            pack_levels(&idx, &mut b[QS + 16 * s..QS + 16 * (s + 1)]);
        }
        b[2..4].copy_from_slice(&high.to_le_bytes());
    }
}
