//! Q4_K: super-blocks of 256 elements in 144 bytes:
//! f16 `d`, f16 `dmin`, 12 bytes of packed 6-bit scales `sc[8]` and mins `m[8]`, 128 bytes of
//! 4-bit `q`. Sub-block `s` (32 elements) decodes as `x = (d·sc[s])·q − dmin·m[s]`.
//!
//! Nibbles: bytes `32·j .. 32·j + 32` hold sub-block `2j` in their low nibbles and sub-block
//! `2j + 1` in their high nibbles.
//!
//! Scales (`b` = the 12 bytes), for `j < 4`: `sc[j] = b[j] & 63`, `m[j] = b[j + 4] & 63`,
//! `sc[j + 4] = (b[j + 8] & 15) | (b[j] >> 6) << 4`, `m[j + 4] = (b[j + 8] >> 4) | (b[j + 4] >> 6) << 4`.

use super::{inverse_or_zero, read_f16, to_f16, SubScale, SuperScale};

const QK: usize = 256;
const SUB: usize = 32;
const BLOCK_BYTES: usize = 4 + 12 + QK / 2;

/// The 6-bit scale and min of sub-block `j < 8` from the 12 packed bytes.
#[inline(always)]
pub(super) fn scale_min(b: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (b[j] & 63, b[j + 4] & 63)
    } else {
        (
            (b[j + 4] & 0x0f) | ((b[j - 4] >> 6) << 4),
            (b[j + 4] >> 4) | ((b[j] >> 6) << 4),
        )
    }
}

/// Packs 6-bit scales and mins (each `< 64`) into the 12-byte layout decoded by [`scale_min`].
pub(super) fn pack_scales(sc: &[u8; 8], m: &[u8; 8], b: &mut [u8]) {
    for j in 0..4 {
        b[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        b[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        b[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
    }
}

/// Calls `f(s, sc[s], m[s], nibbles, shift)` for each sub-block `s` of the block `b`: element
/// `l` of the sub-block is `(nibbles[l] >> shift) & 15`, its value `(d·sc)·q − dmin·m` with
/// the block's f16 `d` (bytes 0..2) and `dmin` (bytes 2..4).
#[inline(always)]
fn for_each_sub_block(b: &[u8], mut f: impl FnMut(usize, u8, u8, &[u8], u32)) {
    let scales = &b[4..16];
    for (j, nibbles) in b[16..].chunks_exact(SUB).enumerate() {
        for (half, shift) in [(0, 0), (1, 4)] {
            let s = 2 * j + half;
            let (sc, m) = scale_min(scales, s);
            f(s, sc, m, nibbles, shift);
        }
    }
}

/// The sub-blocks of one block `b` (144 bytes): `f(s, d·sc[s], dmin·m[s], q)` with the 32
/// 4-bit values of sub-block `s`. For the int8 kernels' repacking.
pub(super) fn sub_blocks(b: &[u8], mut f: impl FnMut(usize, SubScale, SubScale, [u8; SUB])) {
    let (d, dmin) = (SuperScale::at(b, 0), SuperScale::at(b, 2));
    for_each_sub_block(b, |s, sc, m, nibbles, shift| {
        f(
            s,
            SubScale { d, k: sc as i8 },
            SubScale {
                d: dmin,
                k: m as i8,
            },
            std::array::from_fn(|l| (nibbles[l] >> shift) & 0x0f),
        );
    });
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let (d, dmin) = (read_f16(b, 0), read_f16(b, 2));
        for_each_sub_block(b, |s, sc, m, nibbles, shift| {
            let (ds, dm) = (d * f32::from(sc), dmin * f32::from(m));
            for (y, &q) in y[s * SUB..(s + 1) * SUB].iter_mut().zip(nibbles) {
                *y = ds * f32::from((q >> shift) & 0x0f) - dm;
            }
        });
    }
}

/// Per sub-block: `d·sc · Σ q·x − dmin·m · Σ x`.
pub(super) fn dot(src: &[u8], x: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for (b, x) in src.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(QK)) {
        let (d, dmin) = (read_f16(b, 0), read_f16(b, 2));
        for_each_sub_block(b, |s, sc, m, nibbles, shift| {
            let (ds, dm) = (d * f32::from(sc), dmin * f32::from(m));
            let mut qx = 0.0f32;
            let mut sx = 0.0f32;
            for (&xv, &q) in x[s * SUB..(s + 1) * SUB].iter().zip(nibbles) {
                qx += f32::from((q >> shift) & 0x0f) * xv;
                sx += xv;
            }
            total += ds * qx - dm * sx;
        });
    }
    total
}

/// Round-to-nearest: sub-block `s` covers `[min(x_min, 0), x_max]` with scale
/// `(x_max − min(x_min, 0)) / 15`; scales and mins are quantized to 6 bits against the
/// super-block's largest (`d = max scale / 63`, `dmin = max min / 63`, both f16), then each
/// element takes the nearest of the 16 levels its sub-block can represent.
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let mut scale = [0.0f32; 8];
        let mut min = [0.0f32; 8];
        for (s, sub) in x.chunks_exact(SUB).enumerate() {
            let lo = sub.iter().fold(0.0f32, |a, &v| a.min(v));
            let hi = sub.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            scale[s] = (hi - lo) / 15.0;
            min[s] = -lo;
        }
        let (d_bytes, d) = to_f16(scale.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0);
        let (dmin_bytes, dmin) = to_f16(min.iter().fold(0.0f32, |a, &v| a.max(v)) / 63.0);
        let to_6bit = |v: f32, unit: f32| (v * inverse_or_zero(unit)).round().min(63.0) as u8;
        let sc: [u8; 8] = std::array::from_fn(|s| to_6bit(scale[s], d));
        let m: [u8; 8] = std::array::from_fn(|s| to_6bit(min[s], dmin));
        b[0..2].copy_from_slice(&d_bytes);
        b[2..4].copy_from_slice(&dmin_bytes);
        pack_scales(&sc, &m, &mut b[4..16]);
        let nibbles = &mut b[16..];
        nibbles.fill(0);
        for (s, sub) in x.chunks_exact(SUB).enumerate() {
            let ds = d * f32::from(sc[s]);
            let dm = dmin * f32::from(m[s]);
            let ids = inverse_or_zero(ds);
            let shift = 4 * (s % 2);
            for (byte, &v) in nibbles[(s / 2) * SUB..].iter_mut().zip(sub) {
                let q = ((v + dm) * ids).round().clamp(0.0, 15.0) as u8;
                *byte |= q << shift;
            }
        }
    }
}
