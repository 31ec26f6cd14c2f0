//! The scalar reference of the int8 kernels: the order of the `packed` module docs, one row and
//! one token at a time, read straight from the packed records.

use super::{PackedMatrix, QuantizedRows, RecordKind, BLOCK, GROUP_ROWS};
use crate::quant::IQ4_LEVELS;

/// Scale (or min) number `i` of the 16-row table at byte `at`, f16 or f32.
fn scale_at(rec: &[u8], at: usize, i: usize, f32_table: bool) -> f32 {
    if f32_table {
        let b = &rec[at + 4 * i..at + 4 * i + 4];
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    } else {
        half::f16::from_le_bytes([rec[at + 2 * i], rec[at + 2 * i + 1]]).to_f32()
    }
}

/// `out[t·16 + j] = W[16g + j] · x[t]` for every token of `xq` (`out`: `[n_tokens, 16]`;
/// lanes of padding rows get 0).
pub(crate) fn group(w: &PackedMatrix, g: usize, xq: &QuantizedRows, out: &mut [f32]) {
    assert!(
        xq.cols() == w.cols() && out.len() == xq.n_tokens() * GROUP_ROWS,
        "packed reference: shapes do not match"
    );
    let kind = w.kind();
    let (record, quants) = (w.record_bytes(), kind.quant_bytes());
    let bias = kind.weight_bias();
    let wide = kind.wide();
    // Bytes of one scale table (16 rows).
    let table = if wide { 64 } else { 32 };
    let bytes8 = kind.bytes8();
    let lookup = kind.table();
    let plane = kind.plane();
    let has_min = kind.has_min();
    let records = w.group(g);
    for (t, lanes) in out.chunks_exact_mut(GROUP_ROWS).enumerate() {
        let (q, scales) = (xq.q(t), xq.scales(t));
        for (j, y) in lanes.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            let mut off = 0.0f32;
            for ((b, rec), s) in records.chunks_exact(record).enumerate().zip(scales) {
                let x = &q[b * BLOCK..(b + 1) * BLOCK];
                // Integer sums over elements 0..16 and 16..32.
                let (mut lo, mut hi) = (0i32, 0i32);
                let vectors = if bytes8 { 8 } else { 4 };
                for k in 0..vectors {
                    for p in 0..4 {
                        let byte = i32::from(rec[64 * k + 4 * j + p]);
                        if bytes8 {
                            let e = 4 * k + p;
                            let part = byte * i32::from(x[e]);
                            if e < 16 {
                                lo += part;
                            } else {
                                hi += part;
                            }
                        } else if lookup {
                            let level = |n: i32| i32::from(IQ4_LEVELS[n as usize]) + 128;
                            lo += level(byte & 0x0f) * i32::from(x[4 * k + p]);
                            hi += level(byte >> 4) * i32::from(x[16 + 4 * k + p]);
                        } else {
                            let e = 4 * k + p;
                            // Fifth bits (0 without a plane) of elements e and 16 + e.
                            let (b_lo, b_hi) = if plane {
                                let bits = i32::from(rec[256 + 4 * j + p]);
                                ((bits >> k) & 1, (bits >> (4 + k)) & 1)
                            } else {
                                (0, 0)
                            };
                            lo += ((byte & 0x0f) | (b_lo << 4)) * i32::from(x[e]);
                            hi += ((byte >> 4) | (b_hi << 4)) * i32::from(x[16 + e]);
                        }
                    }
                }
                if kind == RecordKind::Halves {
                    let i_lo = lo - bias * s.sum_lo;
                    let i_hi = hi - bias * (s.sum - s.sum_lo);
                    let (d_lo, d_hi) = (
                        scale_at(rec, quants, j, true),
                        scale_at(rec, quants + table, j, true),
                    );
                    acc = (i_lo as f32).mul_add(d_lo * s.d, acc);
                    acc = (i_hi as f32).mul_add(d_hi * s.d, acc);
                    continue;
                }
                let i = lo + hi - bias * s.sum;
                let dw = scale_at(rec, quants, j, wide);
                acc = (i as f32).mul_add(dw * s.d, acc);
                if has_min {
                    off = scale_at(rec, quants + table, j, wide).mul_add(s.sx, off);
                }
            }
            *y = if has_min { acc + off } else { acc };
        }
    }
}
