//! The int8 matrix product: Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL / Q3_K / Q4_K / Q5_K /
//! Q6_K / IQ4_XS weights (every quantized type but Q2_K) repacked once at load time into
//! groups of 16 rows, multiplied by activations rounded to 8 bits (as llama.cpp
//! does), with integer dot products (AVX-512 VNNI `vpdpbusd`, or AVX2 `vpmaddubsw` +
//! `vpmaddwd`).
//!
//! **Layout.** A [`PackedMatrix`] stores its rows in groups of [`GROUP_ROWS`] (the last group
//! padded with zero rows). Group `g` is a run of records, one per 32-column block `b`, each
//! [`PackedMatrix::record_bytes`] long (a multiple of 32: whole half lines, no more padding
//! than that), and the groups follow each other without a gap:
//! - 4-bit types: 4 vectors of 64 bytes, then the 16 rows' scales `d`, then their mins `m`
//!   (f16 for Q4_0 and Q4_1, Q4_0's `m` zero). Vector `k`, lane `j` (4 bytes) holds bytes
//!   `4k .. 4k + 4` of row `16g + j`'s block in Q4_0's order: low nibbles are elements
//!   `4k ..`, high nibbles elements `16 + 4k ..`.
//! - 8-bit types: 8 vectors of 64 bytes; vector `k`, lane `j` holds elements `4k .. 4k + 4` of
//!   row `16g + j` as unsigned bytes (Q8_0: `q + 128`; Q6_K: its 6-bit `q`), then the scales:
//!   Q8_0 16 × f16 `d`.
//! - Super-scaled types (the K-quants and IQ4_XS, whose blocks of 256 columns scale each 32
//!   or 16 columns by a small integer times one f16): the group's records come in
//!   super-blocks of 8, each after a header of the 16 rows' f16 `d` (and, with mins, their
//!   `−dmin`), and a record's tables hold 16 rows' signed 8-bit multipliers: Q4_K's `sc` and
//!   `m` per 32 columns (`d = d·sc`, `m = −dmin·m`), Q6_K's `sc` of elements 0..16 and of
//!   16..32 (`d_lo`, `d_hi`). The kernels multiply the factors, exactly in f32 (11 bits
//!   times 8), as the file's decoder does; stored so, Q4_K streams 2.8 % more bytes than
//!   the file where f32 tables streamed 33 % more.
//!
//! The other types are re-encoded into one of these record kinds ([`RecordKind`]) when packed,
//! exactly (every stored value is an integer of at most 8 bits times a scale that is exact in
//! the record's tables): Q3_K as Q6_K's halves (`q + 32`, `d·(sc − 32)`). Q5_0, Q5_1 and
//! Q5_K keep their 5-bit `q` as Q4_0's nibbles plus one line of fifth bits in the nibbles'
//! layout (lane `j`, byte `p`: bit `k` is element `4k + p`'s, bit `4 + k` element
//! `16 + 4k + p`'s), with Q4_0's f16 scale (`c` = 16), Q4_1's f16, or Q4_K's super-scaled,
//! scale and min tables; the kernels shift each vector's bits onto its nibbles and go on as
//! with bytes `q`. IQ4_NL and IQ4_XS keep their 4-bit indices in Q4_0's nibble layout with an
//! f16 `d`, or a super-scaled `d·(ls − 32)` per 32 columns; the kernels look the indices up
//! in the 16-level table and go on as with 8-bit weights `T[q] + 128`. Q2_K, whose mins
//! change every 16 columns, is not packed and takes the exact path.
//!
//! So one `vpdpbusd` of a weight vector with 4 broadcast activation bytes gives, in lane `j`,
//! 4 products of row `j`: 16 rows advance together and no horizontal sum is ever needed.
//!
//! **Order (fixed per row and token, whatever the batch, the grouping or the thread split).**
//! For row `r`, token `t`, block `b` in increasing order, with `q_w` the stored unsigned
//! weights, `q_x`, `d_x`, `Σq_x`, `Σ_lo q_x` (its first 16) and `s_x = d_x·Σq_x` the block's
//! quantized activations (see [`QuantizedRows`]):
//! 1. `i = Σ q_w·q_x − c·Σq_x` exactly in `i32` (`c` = 0 for Q4_1 and Q4_K, 8 for Q4_0, 128
//!    for the 8-bit kinds);
//! 2. `acc = fma(f32(i), d_w·d_x, acc)` (the product `d_w·d_x` rounded first);
//! 3. kinds with mins only: `off = fma(m_w, s_x, off)`.
//!
//! Q6_K instead takes its two halves in turn: `i_lo = Σ_{0..16} q_w·q_x − 32·Σ_lo q_x`,
//! `acc = fma(f32(i_lo), d_lo·d_x, acc)`, then the same for elements 16..32 with
//! `Σq_x − Σ_lo q_x` and `d_hi`.
//!
//! The result is `acc`, or `acc + off` with mins. [`reference`] does exactly this one scalar
//! at a time; every SIMD variant is bitwise equal to it. Against the exact f32 path the error
//! is the activation rounding: at most `Σ |w_i|·d_x/2` per row and token.

mod activations;
mod group_out;
mod grouped;
mod record;
pub(crate) mod reference;

use std::ops::Range;

pub(crate) use activations::quantize_row;
pub use activations::{BlockScale, QuantizedRows};
pub(crate) use group_out::GroupOut;
pub use grouped::{matmuls_quantized_grouped, GroupedProduct};
pub(crate) use record::{RecordKind, RecordLayout, SUPER_RECORDS};

use crate::isa::{self, Isa};
use crate::matmul::{for_each_column_chunk_of, with_scratch, ColumnSplit, ColumnsMut, WeightView};
use crate::quant::SubScale;
use crate::simd::{Kernels, PACKED_SCALES_PER_BLOCK};
use crate::{DType, ThreadPool};

/// Rows that advance together: the 16 lanes of one 512-bit register of `i32`.
pub const GROUP_ROWS: usize = 16;
/// Columns per block (of the weights and of the quantized activations).
pub const BLOCK: usize = 32;

/// One 64-byte line: the storage starts on a line, and every record on a half line, so that
/// no vector load of 32 bytes or fewer straddles two lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A matrix `[rows, cols]` of a packed type in the int8 kernels' layout (module docs).
pub struct PackedMatrix {
    dtype: DType,
    kind: RecordKind,
    rows: usize,
    cols: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("dtype", &self.dtype)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

impl PackedMatrix {
    /// Whether weights of `dtype` can be packed.
    pub fn packs(dtype: DType) -> bool {
        RecordKind::of(dtype).is_some()
    }

    /// Repacks `w`; `None` if its type is not one [`PackedMatrix::packs`]. The groups are
    /// packed in parallel on `pool`.
    pub fn pack(w: &WeightView<'_>, pool: &ThreadPool) -> Option<PackedMatrix> {
        let row_bytes = w.dtype.bytes_for(w.cols).expect("a validated weight view");
        let row = |r: usize| &w.data[r * row_bytes..(r + 1) * row_bytes];
        PackedMatrix::pack_rows(w.dtype, w.rows, w.cols, row, pool)
    }

    /// Repacks the matrices `ws` stacked into one (`ws[0]`'s rows first), in one allocation
    /// that huge pages can back: the experts of a mixture, each a few MB, would otherwise sit
    /// on small pages, whose boundaries stop the hardware prefetcher while a product streams
    /// them. Matrix `i` is then [`PackedMatrix::row_range`] of its rows. `None` unless every
    /// matrix has the same packable type and columns and a whole number of row groups.
    pub fn pack_stacked(ws: &[WeightView<'_>], pool: &ThreadPool) -> Option<PackedMatrix> {
        let first = ws.first()?;
        let (dtype, cols) = (first.dtype, first.cols);
        let fits = |w: &WeightView<'_>| {
            w.dtype == dtype && w.cols == cols && w.rows.is_multiple_of(GROUP_ROWS)
        };
        if !ws.iter().all(fits) {
            return None;
        }
        let mut starts = vec![0];
        for w in ws {
            starts.push(starts[starts.len() - 1] + w.rows);
        }
        let row_bytes = dtype.bytes_for(cols).expect("a validated weight view");
        let row = |r: usize| {
            let i = starts.partition_point(|&s| s <= r) - 1;
            let local = r - starts[i];
            &ws[i].data[local * row_bytes..(local + 1) * row_bytes]
        };
        PackedMatrix::pack_rows(dtype, starts[ws.len()], cols, row, pool)
    }

    /// Packs `rows` rows of `cols` columns of `dtype`, row `r` stored as `row(r)`.
    fn pack_rows<'a>(
        dtype: DType,
        rows: usize,
        cols: usize,
        row: impl Fn(usize) -> &'a [u8] + Sync,
        pool: &ThreadPool,
    ) -> Option<PackedMatrix> {
        let kind = RecordKind::of(dtype)?;
        let groups = rows.div_ceil(GROUP_ROWS);
        let blocks = cols / BLOCK;
        let layout = kind.layout();
        let group_bytes = layout.span(blocks);
        let mut lines = huge_page_lines((groups * group_bytes).div_ceil(64));
        let block_bytes = dtype.block_bytes();
        // Records per stored block (K-quant blocks hold 256 columns: a super-block).
        let span = layout.span(dtype.block_len() / BLOCK);
        if group_bytes > 0 {
            let bytes = &mut lines_as_bytes(&mut lines)[..groups * group_bytes];
            crate::parallel::for_each_chunk_mut(pool, bytes, group_bytes, |g, dst| {
                for j in 0..GROUP_ROWS.min(rows - g * GROUP_ROWS) {
                    let src_row = row(g * GROUP_ROWS + j);
                    for (b, src) in src_row.chunks_exact(block_bytes).enumerate() {
                        let records = &mut dst[b * span..(b + 1) * span];
                        pack_block(dtype, kind, src, j, records);
                    }
                }
            });
        }
        Some(PackedMatrix {
            dtype,
            kind,
            rows,
            cols,
            lines,
        })
    }

    /// Rows `first..first + rows` of this matrix as a matrix of their own, for the grouped
    /// products (a stacked expert); `first` and `rows` must be whole row groups.
    pub fn row_range(&self, first: usize, rows: usize) -> PackedRows<'_> {
        assert!(
            first.is_multiple_of(GROUP_ROWS)
                && rows.is_multiple_of(GROUP_ROWS)
                && first + rows <= self.rows,
            "row_range: rows {first}..{} are not whole groups of the {} rows",
            first + rows,
            self.rows
        );
        PackedRows {
            matrix: self,
            first_group: first / GROUP_ROWS,
            rows,
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The layout of its records.
    pub(crate) fn kind(&self) -> RecordKind {
        self.kind
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes of one group's record for one block.
    pub fn record_bytes(&self) -> usize {
        self.kind.record_bytes()
    }
    /// Bytes of memory held.
    pub fn bytes(&self) -> usize {
        self.lines.len() * 64
    }
    fn blocks(&self) -> usize {
        self.cols / BLOCK
    }
    /// The records of group `g`, block after block.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let bytes = self.kind.layout().span(self.blocks());
        &lines_as_bytes_ref(&self.lines)[g * bytes..(g + 1) * bytes]
    }
}

/// Rows of a [`PackedMatrix`] taken as a matrix: all of it, or whole row groups of it
/// ([`PackedMatrix::row_range`]).
#[derive(Debug, Clone, Copy)]
pub struct PackedRows<'a> {
    pub(crate) matrix: &'a PackedMatrix,
    /// The first row group of the range.
    pub(crate) first_group: usize,
    pub(crate) rows: usize,
}

impl PackedRows<'_> {
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.matrix.cols
    }
}

impl<'a> From<&'a PackedMatrix> for PackedRows<'a> {
    fn from(matrix: &'a PackedMatrix) -> Self {
        PackedRows {
            matrix,
            first_group: 0,
            rows: matrix.rows,
        }
    }
}

/// Writes row `j`'s stored block `src` into its records `dst` (of `kind`; module docs): one
/// record for the 32-column types, 8 for the 256-column ones.
fn pack_block(dtype: DType, kind: RecordKind, src: &[u8], j: usize, dst: &mut [u8]) {
    match dtype {
        DType::Q4_K => crate::quant::q4_k_sub_blocks(src, |s, d, m, q| {
            let mut r = RecordWriter::new(dst, s, kind, j);
            r.nibbles(&q);
            r.super_table(0, 0, d);
            r.super_table(1, 1, SubScale { d: -m.d, ..m });
        }),
        DType::Q5_K => crate::quant::q5_k_sub_blocks(src, |s, d, m, q| {
            let mut r = RecordWriter::new(dst, s, kind, j);
            r.five_bits(&q);
            r.super_table(0, 0, d);
            r.super_table(1, 1, SubScale { d: -m.d, ..m });
        }),
        DType::IQ4_XS => crate::quant::iq4_xs_sub_blocks(src, |s, d, _| {
            let mut r = RecordWriter::new(dst, s, kind, j);
            // Sub-block `s`'s 16 index bytes, in IQ4_NL's (= Q4_0's) nibble order.
            r.nibble_bytes(&src[8 + 16 * s..8 + 16 * (s + 1)]);
            r.super_table(0, 0, d);
        }),
        DType::Q6_K => crate::quant::q6_k_groups(src, |i0, d, v| {
            RecordWriter::new(dst, i0 / BLOCK, kind, j).half(i0 % BLOCK / 16, v, d);
        }),
        DType::Q3_K => crate::quant::q3_k_groups(src, |i0, d, v| {
            RecordWriter::new(dst, i0 / BLOCK, kind, j).half(i0 % BLOCK / 16, v, d);
        }),
        DType::Q8_0 => {
            let mut r = RecordWriter::new(dst, 0, kind, j);
            r.biased_bytes(&src[2..2 + BLOCK]);
            r.f16_table(0, &src[..2]);
        }
        DType::Q5_0 => {
            let (_, v) = crate::quant::q5_0_values(src);
            let mut r = RecordWriter::new(dst, 0, kind, j);
            r.five_bits(&v.map(|v| (v + 16) as u8));
            r.f16_table(0, &src[..2]);
        }
        DType::IQ4_NL => {
            let mut r = RecordWriter::new(dst, 0, kind, j);
            r.nibble_bytes(&src[2..18]);
            r.f16_table(0, &src[..2]);
        }
        DType::Q5_1 => {
            let (_, _, q) = crate::quant::q5_1_values(src);
            let mut r = RecordWriter::new(dst, 0, kind, j);
            r.five_bits(&q);
            r.f16_table(0, &src[..2]);
            r.f16_table(1, &src[2..4]);
        }
        DType::Q4_0 => {
            let mut r = RecordWriter::new(dst, 0, kind, j);
            r.nibble_bytes(&src[2..18]);
            r.f16_table(0, &src[..2]);
        }
        DType::Q4_1 => {
            let mut r = RecordWriter::new(dst, 0, kind, j);
            r.nibble_bytes(&src[4..20]);
            r.f16_table(0, &src[..2]);
            r.f16_table(1, &src[2..4]);
        }
        _ => unreachable!("pack_block: {dtype} is not packed (checked by `pack`)"),
    }
}

/// Row `j`'s lane of one record (and of its super-block's header).
struct RecordWriter<'a> {
    /// The records of one stored block: one, or a super-block's header and 8.
    dst: &'a mut [u8],
    /// Where the record starts in `dst`, and its super-block's header.
    rec: usize,
    head: usize,
    j: usize,
    /// Bytes of quants before the scale tables.
    quants: usize,
}

impl<'a> RecordWriter<'a> {
    /// Row `j`'s lane of record `b` of `dst` (records of `kind`).
    fn new(dst: &'a mut [u8], b: usize, kind: RecordKind, j: usize) -> Self {
        let layout = kind.layout();
        RecordWriter {
            dst,
            rec: layout.record_at(b),
            head: layout.header_at(b),
            j,
            quants: kind.quant_bytes(),
        }
    }

    /// The record's bytes `at .. at + n`.
    fn bytes(&mut self, at: usize, n: usize) -> &mut [u8] {
        &mut self.dst[self.rec + at..self.rec + at + n]
    }

    /// Signed 8-bit weights `q` stored unsigned (`q ^ 0x80`, i.e. biased by 128): vector
    /// `k`, lane `j` holds elements `4k .. 4k + 4`, copied four at a time.
    fn biased_bytes(&mut self, q: &[u8]) {
        for (k, four) in q.chunks_exact(4).take(BLOCK / 4).enumerate() {
            let at = 64 * k + 4 * self.j;
            for (d, &s) in self.bytes(at, 4).iter_mut().zip(four) {
                *d = s ^ 0x80;
            }
        }
    }

    /// 4-bit weights `q` (`< 16`) in Q4_0's order: byte `i < 16` holds element `i` in its low
    /// nibble and element `i + 16` in its high nibble.
    fn nibbles(&mut self, q: &[u8; BLOCK]) {
        let packed: [u8; 16] = std::array::from_fn(|i| q[i] | (q[16 + i] << 4));
        self.nibble_bytes(&packed);
    }

    /// 5-bit weights `q` (`< 32`): their low 4 bits as [`RecordWriter::nibbles`], then the
    /// fifth bits in the line after the 4 nibble vectors, laid out as the nibbles are: byte
    /// `p` of lane `j` holds in bit `k` the fifth bit of element `4k + p` (the low nibble of
    /// vector `k`'s byte `p`) and in bit `4 + k` that of element `16 + 4k + p` (its high
    /// nibble), so a kernel moves a vector's bits onto its nibbles with one shift.
    fn five_bits(&mut self, q: &[u8; BLOCK]) {
        self.nibbles(&q.map(|v| v & 0x0f));
        let at = 256 + 4 * self.j;
        for p in 0..4 {
            self.bytes(at + p, 1)[0] = (0..4).fold(0u8, |acc, k| {
                let (lo, hi) = (q[4 * k + p] >> 4, q[16 + 4 * k + p] >> 4);
                acc | (lo << k) | (hi << (4 + k))
            });
        }
    }

    /// 16 bytes already in Q4_0's nibble order.
    fn nibble_bytes(&mut self, packed: &[u8]) {
        for k in 0..4 {
            let at = 64 * k + 4 * self.j;
            self.bytes(at, 4).copy_from_slice(&packed[4 * k..4 * k + 4]);
        }
    }

    /// Half `h` (elements `16h .. 16h + 16`) of an 8-bit record of signed values `v` stored as
    /// `v + 32`, with its scale `d·k`: `k` in table `h`, `d` in the header.
    fn half(&mut self, h: usize, v: &[i8; 16], d: SubScale) {
        for (e, &v) in v.iter().enumerate() {
            let e = 16 * h + e;
            self.bytes(64 * (e / 4) + 4 * self.j + e % 4, 1)[0] = (v + 32) as u8;
        }
        self.super_table(h, 0, d);
    }

    /// Entry `j` of the 8-bit multiplier table `t` (0: scales, 1: mins or the second half's
    /// scales), `v.k`, and of the header's f16 table `head` (0: `d`, 1: `−dmin`), `v.d`.
    fn super_table(&mut self, t: usize, head: usize, v: SubScale) {
        let at = self.quants + 16 * t + self.j;
        self.bytes(at, 1)[0] = v.k as u8;
        let at = self.head + 32 * head + 2 * self.j;
        self.dst[at..at + 2].copy_from_slice(&v.d.bits.to_le_bytes());
    }

    /// Entry `j` of f16 table `t` (0: scales, 1: mins), the stored bytes `h`.
    fn f16_table(&mut self, t: usize, h: &[u8]) {
        let at = self.quants + 32 * t + 2 * self.j;
        self.bytes(at, 2).copy_from_slice(h);
    }
}

/// `n` zeroed lines, backed by transparent huge pages where the kernel offers them: the
/// single-token pass streams every weight once per step, and 4 KiB pages would cost a TLB miss
/// every 64 lines.
fn huge_page_lines(n: usize) -> Vec<Line> {
    let mut lines: Vec<Line> = Vec::with_capacity(n);
    crate::huge_pages::advise_huge_pages(lines.as_ptr() as usize, n * 64);
    lines.resize(n, Line([0; 64]));
    lines
}

fn lines_as_bytes(lines: &mut [Line]) -> &mut [u8] {
    let len = lines.len() * 64;
    // SAFETY: `Line` is `repr(C)` around `[u8; 64]` (size 64, no padding), so the slice is
    // `len` initialized bytes, borrowed mutably for the same lifetime.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), len) }
}

fn lines_as_bytes_ref(lines: &[Line]) -> &[u8] {
    // SAFETY: as in `lines_as_bytes`.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast(), lines.len() * 64) }
}

/// `y[t, r] = W[r] · x[t]` with the int8 kernels of the process-wide ISA ([`isa::active`];
/// the scalar [`reference`] when it has none). `x`: `[n_tokens, cols]`, `y`: `[n_tokens, rows]`.
pub fn matmul_packed(
    pool: &ThreadPool,
    w: &PackedMatrix,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
) {
    matmul_packed_with(isa::active(), pool, w, x, y, n_tokens);
}

/// [`matmul_packed`] with the kernels of `isa` (all bitwise equal); panics if this CPU
/// cannot run `isa` or the shapes do not match.
pub fn matmul_packed_with(
    isa: Isa,
    pool: &ThreadPool,
    w: &PackedMatrix,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
) {
    assert_eq!(
        x.len(),
        n_tokens * w.cols,
        "matmul_packed: x must be [n_tokens, cols]"
    );
    assert_eq!(
        y.len(),
        n_tokens * w.rows,
        "matmul_packed: y must be [n_tokens, rows]"
    );
    let xq = QuantizedRows::quantize_with(isa, pool, x, n_tokens, w.cols);
    matmul_quantized_with(isa, pool, w, &xq, y);
}

/// [`matmul_packed`] of activations already quantized (several matrices that read the same
/// input quantize it once): `y`: `[xq.n_tokens(), rows]`.
pub fn matmul_quantized(pool: &ThreadPool, w: &PackedMatrix, xq: &QuantizedRows, y: &mut [f32]) {
    matmuls_quantized_with(isa::active(), pool, [w], xq, [y]);
}

/// [`matmul_quantized`] with the kernels of `isa`.
pub fn matmul_quantized_with(
    isa: Isa,
    pool: &ThreadPool,
    w: &PackedMatrix,
    xq: &QuantizedRows,
    y: &mut [f32],
) {
    matmuls_quantized_with(isa, pool, [w], xq, [y]);
}

/// [`matmul_quantized`] of `N` matrices with the same input (`ys[m]`: `[xq.n_tokens(),
/// ws[m].rows()]`) as one job on the pool: one start and one wait for all (the q/k/v or
/// gate/up projections of a layer), and the tail of one matrix overlaps the next. Each
/// result is bitwise that of [`matmul_quantized`].
pub fn matmuls_quantized<const N: usize>(
    pool: &ThreadPool,
    ws: [&PackedMatrix; N],
    xq: &QuantizedRows,
    ys: [&mut [f32]; N],
) {
    matmuls_quantized_with(isa::active(), pool, ws, xq, ys);
}

/// [`matmuls_quantized`] with the kernels of `isa`.
pub fn matmuls_quantized_with<const N: usize>(
    isa: Isa,
    pool: &ThreadPool,
    ws: [&PackedMatrix; N],
    xq: &QuantizedRows,
    ys: [&mut [f32]; N],
) {
    let kernels = Kernels::new(isa)
        .unwrap_or_else(|| panic!("matmul_quantized_with: this CPU cannot run the {isa} kernels"));
    let n_tokens = xq.n_tokens();
    for (w, y) in ws.iter().zip(&ys) {
        assert_eq!(
            xq.cols(),
            w.cols,
            "matmul_quantized: x must have the matrix's columns"
        );
        assert_eq!(
            y.len(),
            n_tokens * w.rows,
            "matmul_quantized: y must be [n_tokens, rows]"
        );
    }
    if n_tokens == 0 {
        return;
    }
    let split = ColumnSplit::Guided {
        unit: GROUP_ROWS,
        threads: pool.n_threads(),
    };
    let rows = ws.map(|w| w.rows);
    for_each_column_chunk_of(pool, ys, n_tokens, rows, split, |m, rows, out| {
        product_groups(&kernels, ws[m].into(), group_range(&rows), xq, out);
    });
}

/// Rows `groups` (row groups of `w`) of the product `xq · wᵀ` into `out`, whose columns start
/// at the first group's first row: the one loop of every int8 product, alone or grouped.
pub(crate) fn product_groups(
    kernels: &Kernels,
    w: PackedRows<'_>,
    groups: Range<usize>,
    xq: &QuantizedRows,
    out: &mut ColumnsMut<'_>,
) {
    let start = groups.start * GROUP_ROWS;
    let scales = if w.matrix.kind.super_scaled() {
        PACKED_SCALES_PER_BLOCK * w.matrix.blocks()
    } else {
        0
    };
    with_scratch(scales, |scales| {
        for g in groups {
            let first = g * GROUP_ROWS;
            let live = GROUP_ROWS.min(w.rows - first);
            let mut group_out = out.group_out(first - start, live);
            kernels.packed_group(w.matrix, w.first_group + g, xq, &mut group_out, scales);
        }
    });
}

/// The groups whose rows start in `rows` (a chunk starts on a group boundary).
fn group_range(rows: &Range<usize>) -> Range<usize> {
    rows.start / GROUP_ROWS..rows.end.div_ceil(GROUP_ROWS)
}
