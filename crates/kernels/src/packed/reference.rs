//! The scalar reference of the int8 kernels: the order of the `packed` module docs, one row and
//! one token at a time, read straight from the packed records.

use super::{PackedMatrix, QuantizedRows, BLOCK, GROUP_ROWS};
use crate::DType;

/// The offset subtracted from each stored weight to get its signed value times the block
/// scale's unit: `c` in the module docs (Q4_1's offset is its `m` term instead).
pub(crate) fn weight_bias(dtype: DType) -> i32 {
    match dtype {
        DType::Q4_0 => 8,
        DType::Q8_0 => 128,
        _ => 0,
    }
}

/// Bytes of quants at the start of a record (then the f16 scales, then Q4_1's f16 mins).
pub(crate) fn quant_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q8_0 => 512,
        _ => 256,
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `out[t·16 + j] = W[16g + j] · x[t]` for every token of `xq` (`out`: `[n_tokens, 16]`;
/// lanes of padding rows get 0).
pub(crate) fn group(w: &PackedMatrix, g: usize, xq: &QuantizedRows, out: &mut [f32]) {
    assert!(
        xq.cols() == w.cols() && out.len() == xq.n_tokens() * GROUP_ROWS,
        "packed reference: shapes do not match"
    );
    let dtype = w.dtype();
    let (record, quants) = (w.record_bytes(), quant_bytes(dtype));
    let bias = weight_bias(dtype);
    let records = w.group(g);
    for (t, lanes) in out.chunks_exact_mut(GROUP_ROWS).enumerate() {
        let (q, scales) = (xq.q(t), xq.scales(t));
        for (j, y) in lanes.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            let mut off = 0.0f32;
            for ((b, rec), s) in records.chunks_exact(record).enumerate().zip(scales) {
                let x = &q[b * BLOCK..(b + 1) * BLOCK];
                let mut i = 0i32;
                for k in 0..quants / 64 {
                    for p in 0..4 {
                        let byte = i32::from(rec[64 * k + 4 * j + p]);
                        if dtype == DType::Q8_0 {
                            i += byte * i32::from(x[4 * k + p]);
                        } else {
                            i += (byte & 0x0f) * i32::from(x[4 * k + p]);
                            i += (byte >> 4) * i32::from(x[16 + 4 * k + p]);
                        }
                    }
                }
                i -= bias * s.sum;
                let dw = f16_at(rec, quants + 2 * j);
                acc = (i as f32).mul_add(dw * s.d, acc);
                if dtype == DType::Q4_1 {
                    off = f16_at(rec, quants + 32 + 2 * j).mul_add(s.sx, off);
                }
            }
            *y = if dtype == DType::Q4_1 { acc + off } else { acc };
        }
    }
}
