//! Bit-exact cross-check of the row formats against the Python `gguf` package.
//!
//! `quant_gguf.bin` is written by `scripts/make_quant_fixtures.py` (see its docstring for the
//! file layout): rows quantized by gguf (or random valid blocks) and gguf's dequantization.
//! `quant_real_rows.bin` (same layout, `scripts/make_quant_real_fixtures.py`) holds rows of
//! real tensors written by llama.cpp's llama-quantize, with gguf's dequantization.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a test failure

use tandem_kernels::quant::{dequantize_row, quantize_row};
use tandem_kernels::DType;

const FIXTURE: &[u8] = include_bytes!("fixtures/quant_gguf.bin");
const REAL_ROWS: &[u8] = include_bytes!("fixtures/quant_real_rows.bin");

struct Record {
    dtype: DType,
    input: Option<Vec<f32>>,
    raw: Vec<u8>,
    dequantized: Vec<f32>,
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        self.take(4 * n)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

fn records() -> Vec<Record> {
    read_records(FIXTURE)
}

fn read_records(fixture: &[u8]) -> Vec<Record> {
    let mut r = Reader(fixture);
    assert_eq!(r.take(4), b"TQFX");
    assert_eq!(r.u32(), 1, "fixture version");
    let count = r.u32();
    let records = (0..count)
        .map(|_| {
            let id = r.u32();
            let dtype = DType::from_ggml_id(id).expect("fixture type is supported");
            let n = r.u32() as usize;
            let has_input = r.u32() == 1;
            let n_bytes = r.u32() as usize;
            let input = has_input.then(|| r.f32s(n));
            let raw = r.take(n_bytes).to_vec();
            let dequantized = r.f32s(n);
            Record {
                dtype,
                input,
                raw,
                dequantized,
            }
        })
        .collect();
    assert!(r.0.is_empty(), "trailing bytes in fixture");
    records
}

#[test]
fn fixture_covers_every_type() {
    let types: Vec<DType> = records().iter().map(|r| r.dtype).collect();
    for t in DType::ALL {
        assert!(types.contains(&t), "fixture lacks {t}");
    }
}

#[test]
fn dequantize_matches_gguf_bit_exactly() {
    check_dequantization(records());
}

/// Real rows of every type added after the first ones (files written by llama-quantize).
#[test]
fn real_rows_dequantize_as_gguf_does() {
    let recs = read_records(REAL_ROWS);
    for t in [
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q5_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
    ] {
        assert!(recs.iter().any(|r| r.dtype == t), "no real row of {t}");
    }
    check_dequantization(recs);
}

fn check_dequantization(records: Vec<Record>) {
    for rec in records {
        let mut out = vec![f32::NAN; rec.dequantized.len()];
        dequantize_row(rec.dtype, &rec.raw, &mut out);
        for (i, (a, b)) in out.iter().zip(&rec.dequantized).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{} element {i}: {a} vs gguf {b}",
                rec.dtype
            );
        }
    }
}

#[test]
fn quantize_matches_gguf_bit_exactly() {
    let mut checked = Vec::new();
    for rec in records() {
        let Some(input) = rec.input else { continue };
        let mut out = vec![0u8; rec.raw.len()];
        quantize_row(rec.dtype, &input, &mut out);
        let block = rec.dtype.block_bytes();
        for (i, (a, b)) in out.chunks(block).zip(rec.raw.chunks(block)).enumerate() {
            assert_eq!(a, b, "{} block {i} differs from gguf", rec.dtype);
        }
        checked.push(rec.dtype);
    }
    let expected = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
    ];
    assert_eq!(checked, expected);
}
