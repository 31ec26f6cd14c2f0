//! Row formats: scalar reference dequantization, dot products and quantizers.
//!
//! One file per format, each following ggml's exact little-endian bit layout:
//!
//! | type | block | bytes | layout                                                     |
//! |------|-------|-------|------------------------------------------------------------|
//! | F32  | 1     | 4     | IEEE binary32                                              |
//! | F16  | 1     | 2     | IEEE binary16                                              |
//! | BF16 | 1     | 2     | upper 16 bits of a binary32                                |
//! | Q8_0 | 32    | 34    | f16 `d`, 32 × i8 `q`; `x = q·d`                            |
//! | Q4_0 | 32    | 18    | f16 `d`, 16 bytes of nibbles; `x = (q−8)·d`                |
//! | Q4_1 | 32    | 20    | f16 `d`, f16 `m`, 16 bytes of nibbles; `x = q·d + m`       |
//! | Q4_K | 256   | 144   | f16 `d`, f16 `dmin`, 12 bytes 6-bit scales/mins, 128 nibbles |
//! | Q6_K | 256   | 210   | 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 × i8 scales, f16 `d` |
//!
//! Every function here takes whole rows: a row of `n` elements is `dtype.bytes_for(n)` bytes.
//! A length mismatch is a caller bug and panics with a message.
//!
//! These scalar functions are the reference that faster variants are tested against.

mod bf16;
mod f16;
mod f32;
mod q4_0;
mod q4_1;
mod q4_k;
mod q6_k;
mod q8_0;

use crate::DType;

/// Dequantizes the row `src` (stored as `dtype`) into `dst`; `dst.len()` is the element count.
///
/// Panics when `src.len() != dtype.bytes_for(dst.len())`.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    assert_row_len(dtype, src.len(), dst.len(), "dequantize_row");
    match dtype {
        DType::F32 => f32::dequantize(src, dst),
        DType::F16 => f16::dequantize(src, dst),
        DType::BF16 => bf16::dequantize(src, dst),
        DType::Q8_0 => q8_0::dequantize(src, dst),
        DType::Q4_0 => q4_0::dequantize(src, dst),
        DType::Q4_1 => q4_1::dequantize(src, dst),
        DType::Q4_K => q4_k::dequantize(src, dst),
        DType::Q6_K => q6_k::dequantize(src, dst),
    }
}

/// The 8 sub-blocks of one Q4_K block (144 bytes): `f(s, d·sc[s], dmin·m[s], q)` with the 32
/// 4-bit values of sub-block `s`, so that `x = (d·sc[s])·q − dmin·m[s]` (both factors exact in
/// f32).
pub(crate) fn q4_k_sub_blocks(block: &[u8], f: impl FnMut(usize, f32, f32, [u8; 32])) {
    q4_k::sub_blocks(block, f);
}

/// The 16 groups of one Q6_K block (210 bytes): `f(i0, d·sc, q)` with the signed 6-bit values
/// `q − 32` of elements `i0 .. i0 + 16`, so that `x = (d·sc)·(q − 32)` (`d·sc` exact in f32).
pub(crate) fn q6_k_groups(block: &[u8], f: impl FnMut(usize, f32, &[i8; 16])) {
    q6_k::groups(block, f);
}

/// Dot product of the stored row `src` (as `dtype`) with the activations `x`, computed block by
/// block without materialising the dequantized row. `x.len()` is the element count.
///
/// Panics when `src.len() != dtype.bytes_for(x.len())`.
pub fn dot_row(dtype: DType, src: &[u8], x: &[f32]) -> f32 {
    assert_row_len(dtype, src.len(), x.len(), "dot_row");
    match dtype {
        DType::F32 => f32::dot(src, x),
        DType::F16 => f16::dot(src, x),
        DType::BF16 => bf16::dot(src, x),
        DType::Q8_0 => q8_0::dot(src, x),
        DType::Q4_0 => q4_0::dot(src, x),
        DType::Q4_1 => q4_1::dot(src, x),
        DType::Q4_K => q4_k::dot(src, x),
        DType::Q6_K => q6_k::dot(src, x),
    }
}

/// Quantizes the f32 row `src` into `dst` as `dtype` (round-to-nearest; bit-exact with ggml's
/// reference quantizers for F16, BF16, Q8_0, Q4_0 and Q4_1; a simple round-to-nearest scheme
/// for Q4_K and Q6_K). Inputs are expected to be finite.
///
/// Panics when `dst.len() != dtype.bytes_for(src.len())`.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) {
    assert_row_len(dtype, dst.len(), src.len(), "quantize_row");
    match dtype {
        DType::F32 => f32::quantize(src, dst),
        DType::F16 => f16::quantize(src, dst),
        DType::BF16 => bf16::quantize(src, dst),
        DType::Q8_0 => q8_0::quantize(src, dst),
        DType::Q4_0 => q4_0::quantize(src, dst),
        DType::Q4_1 => q4_1::quantize(src, dst),
        DType::Q4_K => q4_k::quantize(src, dst),
        DType::Q6_K => q6_k::quantize(src, dst),
    }
}

/// Asserts that `n_bytes` bytes hold exactly `n_elements` elements of `dtype`.
fn assert_row_len(dtype: DType, n_bytes: usize, n_elements: usize, what: &str) {
    let expected = dtype.bytes_for(n_elements);
    assert!(
        expected == Some(n_bytes),
        "{what}: {n_elements} elements of {dtype} need {} bytes (block of {} elements), got {n_bytes}",
        expected.map_or_else(|| "a whole number of blocks and".to_owned(), |b| b.to_string()),
        dtype.block_len(),
    );
}

/// Reads the little-endian f16 at `b[at..at + 2]` as f32 (exact).
#[inline(always)]
fn read_f16(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Rounds `v` to f16 (to nearest, ties to even) and returns its bytes and its value as f32.
#[inline]
fn to_f16(v: f32) -> ([u8; 2], f32) {
    let h = half::f16::from_f32(v);
    (h.to_le_bytes(), h.to_f32())
}

/// `1 / d`, or 0 when `d` is 0 (an all-zero block quantizes to zeros).
#[inline]
fn inverse_or_zero(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}
