//! F32 rows: little-endian IEEE binary32, 4 bytes per element.

/// Elements summed in f32 before joining the row total (bounds the rounding-error growth).
const CHUNK: usize = 32;

#[inline(always)]
fn load(c: &[u8]) -> f32 {
    f32::from_le_bytes([c[0], c[1], c[2], c[3]])
}

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = load(c);
    }
}

pub(super) fn dot(src: &[u8], x: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for (w, x) in src.chunks(4 * CHUNK).zip(x.chunks(CHUNK)) {
        let mut sum = 0.0f32;
        for (c, &xv) in w.chunks_exact(4).zip(x) {
            sum += load(c) * xv;
        }
        total += sum;
    }
    total
}

pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (c, &v) in dst.chunks_exact_mut(4).zip(src) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}
