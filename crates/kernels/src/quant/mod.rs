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
//! | Q5_0 | 32    | 22    | f16 `d`, u32 fifth bits, 16 bytes of nibbles; `x = (q−16)·d` |
//! | Q5_1 | 32    | 24    | f16 `d`, f16 `m`, u32 fifth bits, 16 bytes of nibbles; `x = q·d + m` |
//! | IQ4_NL | 32  | 18    | f16 `d`, 16 bytes of indices into a 16-level table; `x = d·T[q]` |
//! | Q2_K | 256   | 84    | 16 bytes 4-bit scales/mins, 64 bytes 2-bit `q`, f16 `d`, f16 `dmin` |
//! | Q3_K | 256   | 110   | 32 bytes high bits, 64 bytes 2-bit `q`, 12 bytes 6-bit scales, f16 `d` |
//! | Q4_K | 256   | 144   | f16 `d`, f16 `dmin`, 12 bytes 6-bit scales/mins, 128 nibbles |
//! | Q5_K | 256   | 176   | Q4_K's header, 32 bytes fifth bits, 128 nibbles            |
//! | Q6_K | 256   | 210   | 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 × i8 scales, f16 `d` |
//! | IQ4_XS | 256 | 136   | f16 `d`, 6-bit scales (u16 high bits, 4 bytes low), 8 × IQ4_NL nibbles |
//!
//! The dequantizations are ggml's (`dequantize_row_*` in ggml-quants.c) operation for
//! operation, so that they are bitwise equal to the `gguf` Python package's and llama.cpp's.
//!
//! Every function here takes whole rows: a row of `n` elements is `dtype.bytes_for(n)` bytes.
//! A length mismatch is a caller bug and panics with a message.
//!
//! These scalar functions are the reference that faster variants are tested against.

mod bf16;
mod f16;
mod f32;
mod iq4_nl;
mod iq4_xs;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
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
        DType::Q5_0 => q5_0::dequantize(src, dst),
        DType::Q5_1 => q5_1::dequantize(src, dst),
        DType::Q2_K => q2_k::dequantize(src, dst),
        DType::Q3_K => q3_k::dequantize(src, dst),
        DType::Q4_K => q4_k::dequantize(src, dst),
        DType::Q5_K => q5_k::dequantize(src, dst),
        DType::Q6_K => q6_k::dequantize(src, dst),
        DType::IQ4_NL => iq4_nl::dequantize(src, dst),
        DType::IQ4_XS => iq4_xs::dequantize(src, dst),
    }
}

/// A scale of a K-quant (or IQ4_XS) super-block's part, in its two stored factors: the
/// super-block's f16 `d` times a small integer `k` (a 6-bit scale or min, or an 8-bit one).
/// Their product is exact in f32 (11 significant bits times at most 8).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SubScale {
    pub(crate) d: SuperScale,
    pub(crate) k: i8,
}

impl SubScale {
    /// `d·k`, exactly.
    #[inline(always)]
    pub(crate) fn value(self) -> f32 {
        self.d.value * f32::from(self.k)
    }
}

/// A super-block's stored f16 scale, and its value converted once for the block's parts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SuperScale {
    pub(crate) bits: half::f16,
    value: f32,
}

impl SuperScale {
    /// The little-endian f16 at `b[at..at + 2]`.
    #[inline(always)]
    fn at(b: &[u8], at: usize) -> SuperScale {
        let bits = f16_at(b, at);
        SuperScale {
            bits,
            value: bits.to_f32(),
        }
    }
}

impl std::ops::Neg for SuperScale {
    type Output = SuperScale;

    /// `−d`, exactly (the sign bit flipped).
    fn neg(self) -> SuperScale {
        SuperScale {
            bits: -self.bits,
            value: -self.value,
        }
    }
}

/// The 8 sub-blocks of one Q4_K block (144 bytes): `f(s, d·sc[s], dmin·m[s], q)` with the 32
/// 4-bit values of sub-block `s`, so that `x = (d·sc[s])·q − dmin·m[s]`.
pub(crate) fn q4_k_sub_blocks(block: &[u8], f: impl FnMut(usize, SubScale, SubScale, [u8; 32])) {
    q4_k::sub_blocks(block, f);
}

/// The 16 groups of one Q6_K block (210 bytes): `f(i0, d·sc, q)` with the signed 6-bit values
/// `q − 32` of elements `i0 .. i0 + 16`, so that `x = (d·sc)·(q − 32)`.
pub(crate) fn q6_k_groups(block: &[u8], f: impl FnMut(usize, SubScale, &[i8; 16])) {
    q6_k::groups(block, f);
}

/// The signed values `q − 16` of one Q5_0 block (22 bytes) and its scale: `x = d·v`.
pub(crate) fn q5_0_values(block: &[u8]) -> (f32, [i8; 32]) {
    q5_0::signed_values(block)
}

/// The unsigned 5-bit values of one Q5_1 block (24 bytes), its scale and offset:
/// `x = q·d + m`, as `(d, m, q)`.
pub(crate) fn q5_1_values(block: &[u8]) -> (f32, f32, [u8; 32]) {
    q5_1::values(block)
}

/// The 16 levels of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`).
pub(crate) const IQ4_LEVELS: [i8; 16] = iq4_nl::KVALUES;

/// The 8 sub-blocks of one Q5_K block (176 bytes): `f(s, d·sc[s], dmin·m[s], q)` with the
/// 32 unsigned 5-bit values of sub-block `s`: `x = (d·sc[s])·q − dmin·m[s]`.
pub(crate) fn q5_k_sub_blocks(block: &[u8], f: impl FnMut(usize, SubScale, SubScale, [u8; 32])) {
    q5_k::sub_blocks(block, f);
}

/// The 16 groups of one Q3_K block (110 bytes): `f(i0, d·(sc − 32), q)` with the signed
/// 3-bit values of elements `i0 .. i0 + 16`: `x = (d·(sc − 32))·q`.
pub(crate) fn q3_k_groups(block: &[u8], f: impl FnMut(usize, SubScale, &[i8; 16])) {
    q3_k::groups(block, f);
}

/// The 8 sub-blocks of one IQ4_XS block (136 bytes): `f(s, d·(ls − 32), v)` with the 32
/// table values of sub-block `s`: `x = (d·(ls − 32))·v`.
pub(crate) fn iq4_xs_sub_blocks(block: &[u8], f: impl FnMut(usize, SubScale, [i8; 32])) {
    iq4_xs::sub_blocks(block, f);
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
        DType::Q5_0
        | DType::Q5_1
        | DType::Q2_K
        | DType::Q3_K
        | DType::Q5_K
        | DType::IQ4_NL
        | DType::IQ4_XS => dot_by_blocks(dtype, src, x),
    }
}

/// `Σ w·x` over the blocks of a row, each dequantized into a buffer then summed in order.
fn dot_by_blocks(dtype: DType, src: &[u8], x: &[f32]) -> f32 {
    let mut w = [0.0f32; 256];
    let w = &mut w[..dtype.block_len()];
    let mut total = 0.0f32;
    for (b, x) in src
        .chunks_exact(dtype.block_bytes())
        .zip(x.chunks_exact(dtype.block_len()))
    {
        dequantize_row(dtype, b, w);
        total += w.iter().zip(x).map(|(&w, &x)| w * x).sum::<f32>();
    }
    total
}

/// Quantizes the f32 row `src` into `dst` as `dtype` (round-to-nearest; bit-exact with ggml's
/// reference quantizers for F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1; a simple
/// round-to-nearest scheme for the K-quants and the IQ4 types, which llama.cpp quantizes
/// with a search this crate does not need: it only reads such files). Inputs are expected to
/// be finite.
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
        DType::Q5_0 => q5_0::quantize(src, dst),
        DType::Q5_1 => q5_1::quantize(src, dst),
        DType::Q2_K => q2_k::quantize(src, dst),
        DType::Q3_K => q3_k::quantize(src, dst),
        DType::Q4_K => q4_k::quantize(src, dst),
        DType::Q5_K => q5_k::quantize(src, dst),
        DType::Q6_K => q6_k::quantize(src, dst),
        DType::IQ4_NL => iq4_nl::quantize(src, dst),
        DType::IQ4_XS => iq4_xs::quantize(src, dst),
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
    f16_at(b, at).to_f32()
}

/// The little-endian f16 at `b[at..at + 2]`.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> half::f16 {
    half::f16::from_le_bytes([b[at], b[at + 1]])
}

/// Rounds `v` to f16 (to nearest, ties to even) and returns its bytes and its value as f32.
#[inline]
fn to_f16(v: f32) -> ([u8; 2], f32) {
    let h = half::f16::from_f32(v);
    (h.to_le_bytes(), h.to_f32())
}

/// The element of `x` with the largest magnitude, sign kept (the first of equal
/// magnitudes; 0 for an empty or all-zero slice), as ggml's quantizers pick it.
fn largest_magnitude(x: &[f32]) -> f32 {
    x.iter()
        .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a })
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
