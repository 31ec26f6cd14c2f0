//! `paged_attention` and `attention_merge` over a paged cache with shuffled blocks: against
//! an f64 reference, and the invariance the decode ≡ forward promise rests on — a token's
//! output is bitwise the same whether it runs alone in a decode step, in a prefill tile
//! with its neighbours, in any launch group, or in a launch sized for longer contexts —
//! with and without a sliding window.

use super::*;
use crate::attention_kernels::AttnBuffers;
use crate::attention_tiles::{shared_bytes, tokens_per_tile, AttentionTiles};
use crate::error::CudaError;
use crate::kernels::{tc_tile_tokens, window_parts, AttnShape, ATTN_PARTITION};

const BLOCK: usize = 16;

/// A paged cache holding several sequences, and queries for every position of each.
struct Scene {
    dtype: CudaDtype,
    heads: usize,
    kv_heads: usize,
    d: usize,
    lens: Vec<usize>,
    /// `[num_seqs, max_blocks]`.
    tables: Vec<i32>,
    max_blocks: usize,
    /// `[num_slots, kv_dim]`, as stored.
    k: Vec<f32>,
    v: Vec<f32>,
    /// `[tokens, q_dim]`, every position of every sequence in order.
    q: Vec<f32>,
    token_seq: Vec<i32>,
    positions: Vec<i32>,
    /// Positions a token sees (a sliding window); 0: all.
    window: usize,
}

impl Scene {
    fn new(dtype: CudaDtype, heads: usize, kv_heads: usize, d: usize, lens: &[usize]) -> Scene {
        let mut r = rng((heads * 1000 + d) as u64);
        let max_blocks = lens.iter().map(|l| l.div_ceil(BLOCK)).max().unwrap_or(1);
        let total: usize = lens.iter().map(|l| l.div_ceil(BLOCK)).sum();
        // Blocks handed out in a scrambled order, two spare blocks never used.
        let num_blocks = total + 2;
        let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, r.random_range(0..=i));
        }
        let mut tables = vec![-1i32; lens.len() * max_blocks];
        let mut next = 0;
        for (s, l) in lens.iter().enumerate() {
            for b in 0..l.div_ceil(BLOCK) {
                tables[s * max_blocks + b] = ids[next];
                next += 1;
            }
        }
        let kv_dim = kv_heads * d;
        let k = as_stored(dtype, &normal_ish(&mut r, num_blocks * BLOCK * kv_dim, 1.0));
        let v = as_stored(dtype, &normal_ish(&mut r, num_blocks * BLOCK * kv_dim, 1.0));
        let n: usize = lens.iter().sum();
        let q = normal_ish(&mut r, n * heads * d, 1.0);
        let (mut token_seq, mut positions) = (Vec::new(), Vec::new());
        for (s, &l) in lens.iter().enumerate() {
            token_seq.extend(std::iter::repeat_n(s as i32, l));
            positions.extend(0..l as i32);
        }
        Scene {
            dtype,
            heads,
            kv_heads,
            d,
            lens: lens.to_vec(),
            tables,
            max_blocks,
            k,
            v,
            q,
            token_seq,
            positions,
            window: 0,
        }
    }

    fn slot(&self, seq: usize, p: usize) -> usize {
        self.tables[seq * self.max_blocks + p / BLOCK] as usize * BLOCK + p % BLOCK
    }

    /// Attention of token `t` (an index into the scene's tokens), in f64.
    fn reference(&self, t: usize) -> Vec<f64> {
        let (d, group) = (self.d, self.heads / self.kv_heads);
        let kv_dim = self.kv_heads * d;
        let seq = self.token_seq[t] as usize;
        let context = self.positions[t] as usize + 1;
        let first = match self.window {
            0 => 0,
            w => context.saturating_sub(w),
        };
        let mut out = vec![0.0; self.heads * d];
        for h in 0..self.heads {
            let q = &self.q[(t * self.heads + h) * d..][..d];
            let col = (h / group) * d;
            let scores: Vec<f64> = (first..context)
                .map(|p| {
                    let key = &self.k[self.slot(seq, p) * kv_dim + col..][..d];
                    let dot: f64 = q.iter().zip(key).map(|(&a, &b)| a as f64 * b as f64).sum();
                    dot / (d as f64).sqrt()
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let total: f64 = w.iter().sum();
            for (p, wp) in (first..context).zip(&w) {
                let value = &self.v[self.slot(seq, p) * kv_dim + col..][..d];
                for i in 0..d {
                    out[h * d + i] += wp / total * value[i] as f64;
                }
            }
        }
        out
    }

    /// The kernels' shape arguments for this scene.
    fn shape(&self, parts: usize, tile_tokens: usize) -> AttnShape {
        AttnShape {
            num_heads: self.heads as i32,
            num_kv_heads: self.kv_heads as i32,
            head_dim: self.d as i32,
            block_size: BLOCK as i32,
            max_blocks: self.max_blocks as i32,
            scale: 1.0 / (self.d as f32).sqrt(),
            num_parts: parts as i32,
            tile_tokens: tile_tokens as i32,
            window: self.window as i32,
        }
    }

    fn parts(&self) -> usize {
        self.lens
            .iter()
            .max()
            .unwrap_or(&1)
            .div_ceil(ATTN_PARTITION)
    }

    /// Runs the attention of tokens `tokens` (indices into the scene's tokens) in launch
    /// groups of `group_rows`, with prefill tiles of up to `tile_tokens` tokens (`None`: one
    /// token per tile, as decode steps run) and `parts` partitions per token; returns the
    /// outputs of those tokens, `[tokens.len(), q_dim]`.
    fn run(
        &self,
        tokens: &[usize],
        group_rows: usize,
        tile_tokens: Option<usize>,
        parts: usize,
    ) -> Vec<f32> {
        self.launch(tokens, group_rows, tile_tokens, parts, Kernel::CudaCores)
    }

    /// [`Scene::run`] with the kernel `kernel` (the tensor cores' takes a tile table:
    /// `tile_tokens` is required).
    fn launch(
        &self,
        tokens: &[usize],
        group_rows: usize,
        tile_tokens: Option<usize>,
        parts: usize,
        kernel: Kernel,
    ) -> Vec<f32> {
        let k = kernels(self.dtype);
        let (q_dim, n) = (self.heads * self.d, tokens.len());
        let q: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| self.q[t * q_dim..(t + 1) * q_dim].to_vec())
            .collect();
        let seqs: Vec<i32> = tokens.iter().map(|&t| self.token_seq[t]).collect();
        let positions: Vec<i32> = tokens.iter().map(|&t| self.positions[t]).collect();
        let tiles = tile_tokens.map(|t| AttentionTiles::build(&seqs, &positions, t, group_rows));
        let mut qb = Buf::of(&q);
        let (mut kb, mut vb) = (act_buf(self.dtype, &self.k), act_buf(self.dtype, &self.v));
        let (mut tb, mut sb, mut pb) = (Buf::of(&self.tables), Buf::of(&seqs), Buf::of(&positions));
        let mut tiles_buf = Buf::of(tiles.as_ref().map_or(&[0][..], |t| &t.pairs[..]));
        let mut out = act_buf(self.dtype, &vec![f32::NAN; n * q_dim]);
        // A windowed layer's launch names only the partitions its windows span, as the
        // forward program launches it.
        let tile_tokens = tiles.as_ref().map_or(1, |t| t.tile_tokens);
        let window = (self.window > 0).then_some(self.window);
        let parts = window_parts(parts, window, tile_tokens);
        // NaN where no partition wrote: a merge that reads a partition nobody wrote fails.
        let mut partials = Buf::of(&vec![f32::NAN; n * self.heads * parts * (self.d + 2)]);
        let shape = self.shape(parts, tile_tokens);
        let act = self.dtype.size() as u64;
        for (g, first) in (0..n).step_by(group_rows).enumerate() {
            let rows = group_rows.min(n - first);
            let f = first as u64;
            let (tile_ptr, num_tiles) = match &tiles {
                Some(t) => (
                    Some(tiles_buf.ptr() + t.groups[g].start as u64 * 8),
                    t.groups[g].len(),
                ),
                None => (None, rows),
            };
            let b = AttnBuffers {
                q: qb.ptr() + f * q_dim as u64 * 4,
                k_cache: kb.ptr(),
                v_cache: vb.ptr(),
                block_tables: tb.ptr(),
                token_seq: sb.ptr() + f * 4,
                positions: pb.ptr() + f * 4,
                tiles: tile_ptr,
                out: out.ptr() + f * q_dim as u64 * act,
                partials: match kernel {
                    Kernel::TensorCoresFolding => 0,
                    _ => partials.ptr(),
                },
            };
            match kernel {
                Kernel::CudaCores => k.paged_attention(&b, shape, rows, num_tiles),
                _ => k.attention_tc(&b, shape, rows, num_tiles),
            }
            .expect("launch");
        }
        read_act(self.dtype, &out)
    }
}

/// Which attention kernel a scene runs, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kernel {
    /// `paged_attention`.
    CudaCores,
    /// `attention_tc`, a block per tile, head and partition, then `attention_tc_merge`.
    TensorCores,
    /// `attention_tc`, a block per tile and head folding the tile's partitions itself.
    TensorCoresFolding,
}

impl Scene {
    /// Runs the tensor-core attention `kernel` (bf16 scenes only) of every token, the tiles
    /// of up to `tile_tokens` tokens cut within launch groups of `group_rows` tokens, with
    /// `parts` partitions; returns `[tokens, q_dim]`.
    fn run_tensor_cores(
        &self,
        kernel: Kernel,
        group_rows: usize,
        tile_tokens: usize,
        parts: usize,
    ) -> Vec<f32> {
        let all: Vec<usize> = (0..self.token_seq.len()).collect();
        self.launch(&all, group_rows, Some(tile_tokens), parts, kernel)
    }
}

/// The tensor-core attention against the f64 reference (its probabilities are rounded to
/// bf16: a looser tolerance), and bitwise the same however tokens are tiled and launched:
/// blocks folding their partitions or a block per partition, in launch groups, in tiles of
/// 7 tokens, and each token alone in its tile as decode steps run it, in launches naming
/// more partitions than needed (as graphs do).
fn check_tensor_cores(heads: usize, kv_heads: usize, d: usize, lens: &[usize], window: usize) {
    let s = Scene {
        window,
        ..Scene::new(CudaDtype::Bf16, heads, kv_heads, d, lens)
    };
    let q_dim = heads * d;
    let n = s.token_seq.len();
    let parts = s.parts();
    let (per_part, folding) = (Kernel::TensorCores, Kernel::TensorCoresFolding);
    let tile = tc_tile_tokens(heads / kv_heads);
    let all = s.run_tensor_cores(folding, n, tile, parts);
    for t in 0..s.token_seq.len() {
        let got = &all[t * q_dim..(t + 1) * q_dim];
        let name = format!("tensor cores heads {heads}/{kv_heads} d {d} window {window}: {t}");
        assert_close(&name, got, &s.reference(t), 2e-2);
    }
    // (kernel, launch group, tile tokens, partitions named beyond the needed ones)
    let variants = [
        (per_part, n, tile, 0),
        (folding, 50, tile, 0),
        (per_part, 50, tile, 1),
        (folding, n, 7, 0),
        (per_part, n, 7, 0),
        (folding, n, 1, 0),
        (per_part, n, 1, 2), // as decode steps run
    ];
    for (kernel, group, tile, more) in variants {
        let got = s.run_tensor_cores(kernel, group, tile, parts + more);
        let differ = bits(&got)
            .iter()
            .zip(bits(&all))
            .filter(|(a, b)| **a != *b)
            .count();
        let what = format!("{kernel:?}, groups of {group}, tiles of {tile}, {more} parts more");
        assert_eq!(differ, 0, "d {d} window {window}, {what}: values differ");
    }
}

#[test]
fn tensor_core_attention() {
    check_tensor_cores(4, 2, 64, &[1, 45, 130], 0);
    // Contexts over three partitions.
    check_tensor_cores(2, 1, 64, &[300, 9], 0);
    // Groups of query heads that do not divide the block's 64 rows (SmolLM2's 3: tiles of
    // 21 tokens, 63 rows), and of 8 (tiles of 8 tokens).
    check_tensor_cores(9, 3, 64, &[70, 5], 0);
    check_tensor_cores(9, 3, 64, &[300, 5], 0); // over three partitions
    check_tensor_cores(8, 1, 32, &[40, 2], 0);
    check_tensor_cores(2, 1, 128, &[70, 3], 0);
    // Folds over three partitions (the fold's value sums in shared memory).
    check_tensor_cores(4, 2, 128, &[300, 9], 0);
    check_tensor_cores(8, 8, 16, &[66], 0);
    // Head dimensions below each kernel's bound: 48 (attention_tc_64), 96 (_128).
    check_tensor_cores(4, 1, 48, &[70, 2], 0);
    check_tensor_cores(2, 2, 96, &[100, 33], 0);
}

#[test]
fn tensor_core_attention_of_wide_heads() {
    // attention_tc_256: two warps a row group, each summing half the value columns; Gemma
    // 3's shape (4 query heads on one kv head, 256 dimensions) over two partitions and in
    // a window crossing one, and 176 dimensions, whose second slice has fewer columns.
    check_tensor_cores(4, 1, 256, &[150, 3], 0);
    check_tensor_cores(4, 1, 256, &[170, 4], 60);
    check_tensor_cores(2, 2, 176, &[150, 17], 0);
    check_tensor_cores(2, 2, 176, &[150, 4], 30);
}

/// What no `attention_tc_*` block can hold is refused before anything runs: tiles of more
/// rows than a block's 64, heads wider than 256 or not a multiple of 16.
#[test]
fn tensor_core_attention_refuses_shapes_its_blocks_cannot_hold() {
    let k = kernels(CudaDtype::Bf16);
    let refused = |heads: usize, kv_heads: usize, d: usize, tile_tokens: usize| {
        let s = Scene::new(CudaDtype::Bf16, heads, kv_heads, d, &[1]);
        let b = AttnBuffers {
            q: 0,
            k_cache: 0,
            v_cache: 0,
            block_tables: 0,
            token_seq: 0,
            positions: 0,
            tiles: Some(0),
            out: 0,
            partials: 0,
        };
        let got = k.attention_tc(&b, s.shape(1, tile_tokens), 1, 1);
        matches!(got, Err(CudaError::Unsupported(_)))
    };
    assert!(refused(4, 1, 64, 17)); // 68 rows
    assert!(refused(2, 1, 272, 1));
    assert!(refused(2, 1, 72, 1));
}

#[test]
fn tensor_core_attention_in_sliding_windows() {
    // Windows shorter than a chunk of 64 positions, and longer, crossing chunks.
    check_tensor_cores(4, 2, 64, &[1, 45, 200], 10);
    check_tensor_cores(2, 1, 32, &[150, 7], 70);
    // Chunks of 32 positions (head dimension 128).
    check_tensor_cores(2, 1, 128, &[90, 5], 40);
    // A window over a partition boundary from a later partition than the window of the
    // tile's first token starts in (a token's partial slots count from its own window).
    check_tensor_cores(2, 1, 64, &[300, 20], 129);
    check_tensor_cores(9, 3, 64, &[300, 20], 129);
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Prefill of every token against the reference, then the same tokens tiled, in launch
/// groups, and as decode steps (last tokens only, in a launch sized for longer contexts):
/// bitwise equal to the plain launch.
fn check(heads: usize, kv_heads: usize, d: usize, lens: &[usize]) {
    check_in_window(heads, kv_heads, d, lens, 0);
}

/// [`check`] with a sliding window of `window` positions (0: none).
fn check_in_window(heads: usize, kv_heads: usize, d: usize, lens: &[usize], window: usize) {
    for dtype in MODES {
        let s = Scene {
            window,
            ..Scene::new(dtype, heads, kv_heads, d, lens)
        };
        let what = format!("{dtype:?} heads {heads}/{kv_heads} d {d} window {window}");
        let q_dim = heads * d;
        let all: Vec<usize> = (0..s.token_seq.len()).collect();
        let plain = s.run(&all, all.len(), None, s.parts());
        for &t in &all {
            let got = &plain[t * q_dim..(t + 1) * q_dim];
            let name = format!("{what}: token {t} (position {})", s.positions[t]);
            assert_close(&name, got, &s.reference(t), tolerance(dtype));
        }
        let group = heads / kv_heads;
        let limit = kernels(dtype).attention_shared_limit();
        let per_tile = tokens_per_tile(group, d, dtype.size(), limit);
        assert!(shared_bytes(group, per_tile, d, dtype.size()) <= limit);
        let tiled = s.run(&all, all.len(), Some(per_tile), s.parts());
        assert_eq!(
            bits(&tiled),
            bits(&plain),
            "{what}: tiles of {per_tile} tokens"
        );
        let grouped = s.run(&all, 50, Some(per_tile), s.parts() + 1);
        assert_eq!(
            bits(&grouped),
            bits(&plain),
            "{what}: launch groups of 50 rows"
        );
        let mut last = Vec::new();
        let mut end = 0;
        for l in &s.lens {
            end += l;
            last.push(end - 1);
        }
        let decode = s.run(&last, last.len(), None, s.parts() + 2);
        let want: Vec<f32> = last
            .iter()
            .flat_map(|&t| plain[t * q_dim..(t + 1) * q_dim].to_vec())
            .collect();
        assert_eq!(
            bits(&decode),
            bits(&want),
            "{what}: decode step of the last tokens"
        );
    }
}

#[test]
fn grouped_query_heads_over_several_partitions() {
    // Contexts of one position, part of a chunk, several chunks, and three partitions.
    check(4, 2, 64, &[1, 45, 130, 260]);
}

#[test]
fn one_kv_head_per_query_head_and_wide_heads() {
    check(2, 2, 128, &[3, 140]);
}

#[test]
fn many_query_heads_per_kv_head() {
    check(8, 1, 32, &[70, 129]);
}

#[test]
fn rows_whose_pieces_do_not_divide_the_block() {
    // 96 dimensions: 24 (f32) or 12 (bf16) 16-byte pieces a row, which do not divide a
    // block of 64 threads; 256 f32 dimensions: 64 pieces a row, more than a one-warp block.
    check(2, 1, 96, &[5, 100]);
    check(1, 1, 256, &[40]);
}

#[test]
fn sliding_windows_within_and_across_partitions() {
    // A window inside a chunk; one that spans partition boundaries, so that late tokens
    // merge two partitions, neither the first; one longer than a partition.
    check_in_window(4, 2, 64, &[1, 45, 300], 7);
    check_in_window(2, 1, 32, &[290, 20], 40);
    check_in_window(2, 2, 32, &[280], 150);
}

#[test]
fn windows_far_into_long_contexts_launch_only_the_partitions_they_span() {
    // Contexts of up to 8 partitions; the launches name 2 or 3 (see `window_parts`), so
    // late tokens' windows lie wholly past the partitions the launch numbers from zero.
    check_in_window(2, 1, 32, &[1000, 130], 40);
    check_in_window(4, 2, 64, &[900], 200);
}

#[test]
fn window_parts_cover_every_tile_of_consecutive_positions() {
    // The partitions from the tile's first window start to its last position, as
    // paged_attention numbers them, never outnumber the launch's.
    let p = ATTN_PARTITION;
    for w in (1..=3 * p + 5).step_by(3) {
        for tile in 1..=40 {
            let named = window_parts(usize::MAX, Some(w), tile);
            let mut widest = 0;
            for p0 in 0..5 * p {
                let first = (p0 + 1).saturating_sub(w) / p;
                let last = (p0 + tile - 1) / p;
                widest = widest.max(last - first + 1);
            }
            assert!(
                widest <= named,
                "window {w}, tiles of {tile}: {widest} > {named}"
            );
            assert!(
                named <= widest + 1,
                "window {w}, tiles of {tile}: {named} is loose"
            );
        }
    }
    assert_eq!(window_parts(7, None, 4), 7);
    assert_eq!(window_parts(7, Some(0), 4), 7);
    assert_eq!(window_parts(1, Some(40), 1), 1);
}
