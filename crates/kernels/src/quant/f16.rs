//! F16 rows: little-endian IEEE binary16, 2 bytes per element.

/// Elements summed in f32 before joining the row total (bounds the rounding-error growth).
const CHUNK: usize = 32;

pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = super::read_f16(c, 0);
    }
}

pub(super) fn dot(src: &[u8], x: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for (w, x) in src.chunks(2 * CHUNK).zip(x.chunks(CHUNK)) {
        let mut sum = 0.0f32;
        for (c, &xv) in w.chunks_exact(2).zip(x) {
            sum += super::read_f16(c, 0) * xv;
        }
        total += sum;
    }
    total
}

/// Rounds to nearest, ties to even (as ggml and numpy do).
pub(super) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (c, &v) in dst.chunks_exact_mut(2).zip(src) {
        c.copy_from_slice(&super::to_f16(v).0);
    }
}
