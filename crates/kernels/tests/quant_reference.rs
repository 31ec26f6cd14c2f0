//! The row formats against an independent f64 reference written here from the format
//! descriptions (ggml's block layouts), on random block bytes of several lengths.
//!
//! - `dequantize_row` must equal the f64 value rounded once to f32, up to one rounding of the
//!   f32 arithmetic: `|Δ| ≤ ε · (|a| + |b|)` where the format computes `a + b` (e.g. `d·q` and
//!   `m` for Q4_1); for F32/F16/BF16/Q8_0/Q4_0 it must be exact.
//! - `dot_row` must match the f64 dot of the f64 values within
//!   `|Δ| ≤ 1e-5 · Σ_i |x_i|·(|a_i| + |b_i|)`.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tandem_kernels::quant::{dequantize_row, dot_row};
use tandem_kernels::DType;

/// One element of the f64 reference: the value is `a + b` (`b` is the offset term, 0 if none).
#[derive(Clone, Copy)]
struct Ref {
    a: f64,
    b: f64,
}

/// IEEE binary16 -> f64 from the bit fields (finite inputs).
fn f16_bits(b: &[u8], at: usize) -> f64 {
    let h = u16::from_le_bytes([b[at], b[at + 1]]);
    let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f64::from(h & 0x3ff);
    assert!(exp != 31, "reference given a non-finite f16");
    if exp == 0 {
        sign * man * 2f64.powi(-24)
    } else {
        sign * (1.0 + man / 1024.0) * 2f64.powi(exp - 15)
    }
}

fn nibble(byte: u8, high: bool) -> f64 {
    f64::from(if high { byte >> 4 } else { byte & 15 })
}

/// Element `i` of a row (`row` holds whole blocks) per the format description.
fn reference(dtype: DType, row: &[u8], i: usize) -> Ref {
    let bb = dtype.block_bytes();
    let blk = &row[(i / dtype.block_len()) * bb..][..bb];
    let j = i % dtype.block_len();
    let plain = |a: f64| Ref { a, b: 0.0 };
    match dtype {
        DType::F32 => plain(f64::from(f32::from_le_bytes(blk.try_into().unwrap()))),
        DType::F16 => plain(f16_bits(blk, 0)),
        DType::BF16 => {
            let bits = u32::from(u16::from_le_bytes([blk[0], blk[1]])) << 16;
            plain(f64::from(f32::from_bits(bits)))
        }
        DType::Q8_0 => plain(f16_bits(blk, 0) * f64::from(blk[2 + j] as i8)),
        // Byte k holds element k (low nibble) and element k + 16 (high nibble).
        DType::Q4_0 => plain(f16_bits(blk, 0) * (nibble(blk[2 + j % 16], j >= 16) - 8.0)),
        DType::Q4_1 => Ref {
            a: f16_bits(blk, 0) * nibble(blk[4 + j % 16], j >= 16),
            b: f16_bits(blk, 2),
        },
        DType::Q4_K => q4_k(blk, j),
        DType::Q6_K => q6_k(blk, j),
        DType::Q5_0 => plain(f16_bits(blk, 0) * (five_bits(blk, 2, j) - 16.0)),
        DType::Q5_1 => Ref {
            a: f16_bits(blk, 0) * five_bits(blk, 4, j),
            b: f16_bits(blk, 2),
        },
        DType::IQ4_NL => plain(f16_bits(blk, 0) * iq4(nibble(blk[2 + j % 16], j >= 16))),
        DType::Q2_K => q2_k(blk, j),
        DType::Q3_K => q3_k(blk, j),
        DType::Q5_K => q5_k(blk, j),
        DType::IQ4_XS => iq4_xs(blk, j),
    }
}

/// The 5-bit value of element `j` of a Q5_0 / Q5_1 block whose u32 of fifth bits is at `at`
/// (16 nibble bytes follow, Q4_0's order).
fn five_bits(blk: &[u8], at: usize, j: usize) -> f64 {
    let qh = u32::from_le_bytes(blk[at..at + 4].try_into().unwrap());
    nibble(blk[at + 4 + j % 16], j >= 16) + 16.0 * f64::from((qh >> j) & 1)
}

/// The IQ4_NL / IQ4_XS level of a 4-bit index (ggml's `kvalues_iq4nl`).
fn iq4(index: f64) -> f64 {
    const LEVELS: [f64; 16] = [
        -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0,
        69.0, 89.0, 113.0,
    ];
    LEVELS[index as usize]
}

/// Q2_K: 16 bytes of (scale low nibble, min high nibble) per group of 16, qs[64], d, dmin.
/// Element j = 128h + 32k + l is bits 2k.. of qs[32h + l].
fn q2_k(blk: &[u8], j: usize) -> Ref {
    let (h, k, l) = (j / 128, (j % 128) / 32, j % 32);
    let q = f64::from((blk[16 + 32 * h + l] >> (2 * k)) & 3);
    let (sc, m) = (f64::from(blk[j / 16] & 15), f64::from(blk[j / 16] >> 4));
    Ref {
        a: f16_bits(blk, 80) * sc * q,
        b: -f16_bits(blk, 82) * m,
    }
}

/// Q3_K: hmask[32], qs[64], 12 scale bytes, d. The 6-bit scale of group g has its low 4 bits
/// in byte g % 8 (high nibble for g ≥ 8) and its top 2 bits at bit 2·(g / 4) of byte
/// 8 + g % 4; a clear hmask bit subtracts 4.
fn q3_k(blk: &[u8], j: usize) -> Ref {
    let (h, k, l) = (j / 128, (j % 128) / 32, j % 32);
    let low = f64::from((blk[32 + 32 * h + l] >> (2 * k)) & 3);
    let high_set = (blk[l] >> (j / 32)) & 1 == 1;
    let q = if high_set { low } else { low - 4.0 };
    let g = j / 16;
    let s = &blk[96..108];
    let sc = f64::from(
        ((s[g % 8] >> (4 * (g / 8))) & 15) | (((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4),
    ) - 32.0;
    plain_ref(f16_bits(blk, 108) * sc * q)
}

/// Q5_K: Q4_K's header and scales, qh[32] (bit s of byte l: fifth bit of sub-block s, element
/// l), 128 nibble bytes as Q4_K's.
fn q5_k(blk: &[u8], j: usize) -> Ref {
    let sub = j / 32;
    let four = q4_k_with_nibbles(blk, j, 48);
    let fifth = f64::from((blk[16 + j % 32] >> sub) & 1);
    let (sc, _) = q4_k_scale_min(&blk[4..16], sub);
    Ref {
        a: four.a + f16_bits(blk, 0) * f64::from(sc) * 16.0 * fifth,
        b: four.b,
    }
}

/// IQ4_XS: d, u16 of high scale bits, 4 bytes of low scale nibbles, 8 × 16 bytes of IQ4_NL
/// nibbles; sub-block s has scale d·(ls − 32).
fn iq4_xs(blk: &[u8], j: usize) -> Ref {
    let s = j / 32;
    let high = u16::from_le_bytes([blk[2], blk[3]]);
    let ls =
        f64::from(((blk[4 + s / 2] >> (4 * (s % 2))) & 15) as u16 | (((high >> (2 * s)) & 3) << 4));
    let q = iq4(nibble(blk[8 + 16 * s + j % 16], j % 32 >= 16));
    plain_ref(f16_bits(blk, 0) * (ls - 32.0) * q)
}

fn plain_ref(a: f64) -> Ref {
    Ref { a, b: 0.0 }
}

/// Q4_K: d, dmin, 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks of 32, 128 nibble bytes
/// (32-byte group g: sub-block 2g low nibbles, 2g+1 high nibbles).
fn q4_k(blk: &[u8], j: usize) -> Ref {
    q4_k_with_nibbles(blk, j, 16)
}

/// Q4_K's decoding with its nibble bytes starting at `at` (Q5_K's low 4 bits).
fn q4_k_with_nibbles(blk: &[u8], j: usize, at: usize) -> Ref {
    let sub = j / 32;
    let (sc, m) = q4_k_scale_min(&blk[4..16], sub);
    let q = nibble(blk[at + 32 * (sub / 2) + j % 32], sub % 2 == 1);
    Ref {
        a: f16_bits(blk, 0) * f64::from(sc) * q,
        b: -f16_bits(blk, 2) * f64::from(m),
    }
}

/// The 6-bit (scale, min) of K-quant sub-block `sub` from the 12 scale bytes `s`.
fn q4_k_scale_min(s: &[u8], sub: usize) -> (u8, u8) {
    if sub < 4 {
        (s[sub] & 0x3f, s[sub + 4] & 0x3f)
    } else {
        let k = sub - 4;
        // Low 4 bits from byte 8 + k, top 2 bits from the spare bits of bytes k and 4 + k.
        (
            (s[8 + k] & 0xf) + 16 * (s[k] >> 6),
            (s[8 + k] >> 4) + 16 * (s[4 + k] >> 6),
        )
    }
}

/// Q6_K: ql[128], qh[64], i8 scales[16], d. Element j = 128h + 32k + l.
fn q6_k(blk: &[u8], j: usize) -> Ref {
    let (h, k, l) = (j / 128, (j % 128) / 32, j % 32);
    let low = nibble(blk[64 * h + 32 * (k % 2) + l], k >= 2);
    let high = f64::from((blk[128 + 32 * h + l] >> (2 * k)) & 3);
    let q = low + 16.0 * high - 32.0;
    let scale = f64::from(blk[192 + j / 16] as i8);
    Ref {
        a: f16_bits(blk, 208) * scale * q,
        b: 0.0,
    }
}

/// Random finite f16 bits in roughly [-2^e_max, 2^e_max] (exponent field below `e_max + 15`).
fn random_f16(rng: &mut StdRng, max_exp_field: u16) -> [u8; 2] {
    let bits = (rng.random::<u16>() & 0x83ff) | (rng.random_range(0..=max_exp_field) << 10);
    bits.to_le_bytes()
}

/// Random bytes for `n` elements with every float field finite.
fn random_row(rng: &mut StdRng, dtype: DType, n: usize) -> Vec<u8> {
    let mut row = vec![0u8; dtype.bytes_for(n).unwrap()];
    rng.fill(&mut row[..]);
    for blk in row.chunks_exact_mut(dtype.block_bytes()) {
        match dtype {
            DType::F32 => blk.copy_from_slice(&(rng.random::<f32>() * 8.0 - 4.0).to_le_bytes()),
            DType::F16 => blk.copy_from_slice(&random_f16(rng, 30)),
            DType::BF16 => {
                let exp = rng.random_range(0..=0x9fu16) << 7; // up to 2^32: dots stay finite
                let bits = (u16::from_le_bytes([blk[0], blk[1]]) & 0x807f) | exp;
                blk.copy_from_slice(&bits.to_le_bytes());
            }
            DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4_NL | DType::IQ4_XS => {
                blk[..2].copy_from_slice(&random_f16(rng, 16))
            }
            DType::Q3_K => blk[108..].copy_from_slice(&random_f16(rng, 16)),
            DType::Q2_K => {
                blk[80..82].copy_from_slice(&random_f16(rng, 16));
                blk[82..].copy_from_slice(&random_f16(rng, 16));
            }
            DType::Q4_1 | DType::Q4_K | DType::Q5_1 | DType::Q5_K => {
                blk[..2].copy_from_slice(&random_f16(rng, 16));
                blk[2..4].copy_from_slice(&random_f16(rng, 16));
            }
            DType::Q6_K => blk[208..].copy_from_slice(&random_f16(rng, 16)),
        }
    }
    row
}

fn lengths(dtype: DType) -> Vec<usize> {
    match dtype.block_len() {
        1 => vec![1, 7, 16, 33, 100, 1000],
        32 => vec![32, 64, 96, 576, 1536],
        256 => vec![256, 512, 1536],
        other => panic!("unexpected block length {other}"),
    }
}

fn exact_type(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::Q8_0
            | DType::Q4_0
            | DType::Q5_0
            | DType::IQ4_NL
    )
}

#[test]
fn dequantize_matches_f64_reference() {
    let mut rng = StdRng::seed_from_u64(1);
    for dtype in DType::ALL {
        for n in lengths(dtype) {
            for _ in 0..4 {
                let row = random_row(&mut rng, dtype, n);
                let mut out = vec![f32::NAN; n];
                dequantize_row(dtype, &row, &mut out);
                for (i, &got) in out.iter().enumerate() {
                    let r = reference(dtype, &row, i);
                    let want = r.a + r.b;
                    let err = (f64::from(got) - want).abs();
                    let tol = if exact_type(dtype) {
                        0.0
                    } else {
                        f64::from(f32::EPSILON) * (r.a.abs() + r.b.abs())
                    };
                    assert!(
                        err <= tol,
                        "{dtype} n={n} i={i}: {got} vs {want} (tol {tol})"
                    );
                }
            }
        }
    }
}

#[test]
fn dot_matches_f64_reference() {
    let mut rng = StdRng::seed_from_u64(2);
    for dtype in DType::ALL {
        for n in lengths(dtype) {
            for _ in 0..4 {
                let row = random_row(&mut rng, dtype, n);
                let x: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                let (mut want, mut magnitude) = (0.0f64, 0.0f64);
                for (i, &xi) in x.iter().enumerate() {
                    let r = reference(dtype, &row, i);
                    want += (r.a + r.b) * f64::from(xi);
                    magnitude += (r.a.abs() + r.b.abs()) * f64::from(xi).abs();
                }
                let got = f64::from(dot_row(dtype, &row, &x));
                let tol = 1e-5 * magnitude;
                assert!(
                    (got - want).abs() <= tol,
                    "{dtype} n={n}: {got} vs {want} (tol {tol})"
                );
            }
        }
    }
}

#[test]
#[should_panic(expected = "dequantize_row")]
fn dequantize_rejects_partial_blocks() {
    let mut out = vec![0.0f32; 31];
    dequantize_row(DType::Q8_0, &[0u8; 34], &mut out);
}

#[test]
#[should_panic(expected = "dot_row")]
fn dot_rejects_wrong_byte_count() {
    dot_row(DType::Q4_K, &[0u8; 143], &[0.0f32; 256]);
}
