//! BF16 rows: the upper 16 bits of a binary32, little-endian, 2 bytes per element.

/// Elements summed in f32 before joining the row total (bounds the rounding-error growth).
const CHUNK: usize = 32;

#[inline(always)]
fn load(c: &[u8]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = load(c);
    }
}

pub(super) fn dot(src: &[u8], x: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for (w, x) in src.chunks(2 * CHUNK).zip(x.chunks(CHUNK)) {
        let mut sum = 0.0f32;
        for (c, &xv) in w.chunks_exact(2).zip(x) {
            sum += load(c) * xv;
        }
        total += sum;
    }
    total
}

/// The bf16 bits of `v`: round to nearest, ties to even; NaNs stay NaN (made quiet).
fn bits_of(v: f32) -> u16 {
    let n = v.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        return ((n >> 16) | 0x0040) as u16;
    }
    let rounded = (u64::from(n) + 0x7fff + u64::from((n >> 16) & 1)) >> 16;
    // An f32 just below +-inf can round up to +-inf: the result still fits in 16 bits.
    rounded as u16
}

pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (c, &v) in dst.chunks_exact_mut(2).zip(src) {
        c.copy_from_slice(&bits_of(v).to_le_bytes());
    }
}
