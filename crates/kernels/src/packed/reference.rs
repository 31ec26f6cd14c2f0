//! The scalar reference of the int8 kernels: the order of the `packed` module docs, one row and
//! one token at a time, read straight from the packed records.

use super::{GroupOut, PackedMatrix, QuantizedRows, RecordKind, BLOCK};
use crate::quant::IQ4_LEVELS;

/// Entry `i` of the 16-row f16 table at byte `at` of `bytes`.
fn f16_at(bytes: &[u8], at: usize, i: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at + 2 * i], bytes[at + 2 * i + 1]]).to_f32()
}

/// Row `j`'s scale (`t` = 0) or min or second half's scale (`t` = 1) of the record at `rec`
/// (super-block header at `head`) in `records`.
fn scale(kind: RecordKind, records: &[u8], rec: usize, head: usize, t: usize, j: usize) -> f32 {
    let tables = rec + kind.quant_bytes();
    if kind.super_scaled() {
        // The header holds `d` (and `−dmin` for the mins); the record the multipliers.
        let d = f16_at(records, head + if kind.has_min() { 32 * t } else { 0 }, j);
        d * f32::from(records[tables + 16 * t + j] as i8)
    } else {
        f16_at(records, tables + 32 * t, j)
    }
}

/// `out[t, j] = W[16g + j] · x[t]` for every token of `xq` and live row `j` (padding rows are
/// not computed). The reference reads every scale from the records: it needs no scratch for
/// them.
pub(crate) fn group(
    w: &PackedMatrix,
    g: usize,
    xq: &QuantizedRows,
    out: &mut GroupOut,
    _scales: &mut [f32],
) {
    assert!(
        xq.cols() == w.cols() && out.n_tokens() == xq.n_tokens(),
        "packed reference: shapes do not match"
    );
    let kind = w.kind();
    let layout = kind.layout();
    let bias = kind.weight_bias();
    let bytes8 = kind.bytes8();
    let lookup = kind.table();
    let plane = kind.plane();
    let has_min = kind.has_min();
    let records = w.group(g);
    for t in 0..out.n_tokens() {
        let (q, scales) = (xq.q(t), xq.scales(t));
        for j in 0..out.live() {
            let mut acc = 0.0f32;
            let mut off = 0.0f32;
            for (b, s) in scales.iter().enumerate() {
                let (at, head) = (layout.record_at(b), layout.header_at(b));
                let rec = &records[at..at + layout.record];
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
                        scale(kind, records, at, head, 0, j),
                        scale(kind, records, at, head, 1, j),
                    );
                    acc = (i_lo as f32).mul_add(d_lo * s.d, acc);
                    acc = (i_hi as f32).mul_add(d_hi * s.d, acc);
                    continue;
                }
                let i = lo + hi - bias * s.sum;
                let dw = scale(kind, records, at, head, 0, j);
                acc = (i as f32).mul_add(dw * s.d, acc);
                if has_min {
                    off = scale(kind, records, at, head, 1, j).mul_add(s.sx, off);
                }
            }
            out.set(t, j, if has_min { acc + off } else { acc });
        }
    }
}
