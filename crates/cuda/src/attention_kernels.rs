//! The launches of the attention kernels (attention.cu, attention_tc.cu) and of the merges of
//! their partitions. Like every launch they go through [`Kernels::launch`].

use crate::attention_tiles::shared_bytes;
use crate::error::CudaError;
use crate::kernels::{
    Arg, AttnShape, DevPtr, Kernels, TC_FOLD_MAX_HEAD_DIM, TC_MAX_HEAD_DIM, TC_ROWS,
};

/// The arguments of both attention kernels, in their order.
fn attention_args(b: &AttnBuffers, shape: AttnShape) -> [Arg; 10] {
    [
        Arg::Ptr(b.q),
        Arg::Ptr(b.k_cache),
        Arg::Ptr(b.v_cache),
        Arg::Ptr(b.block_tables),
        Arg::Ptr(b.token_seq),
        Arg::Ptr(b.positions),
        Arg::Ptr(b.tiles.unwrap_or(0)),
        Arg::Ptr(b.out),
        Arg::Ptr(b.partials),
        Arg::Attn(shape),
    ]
}

/// The `attention_tc_*` kernel for head dimension `d` and the threads of its blocks: each
/// kernel's registers hold the columns up to its bound, and `attention_tc_256` splits the
/// columns between two warps per 16 rows (attention_tc.cu).
fn tensor_core_kernel(d: usize) -> (&'static str, u32) {
    match d {
        0..=64 => ("attention_tc_64", 128),
        65..=128 => ("attention_tc_128", 128),
        _ => ("attention_tc_256", 256),
    }
}

/// Buffers of `paged_attention` for one layer (n tokens).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnBuffers {
    /// `[n, q_dim]` f32.
    pub q: DevPtr,
    /// `[num_slots, kv_dim]` act.
    pub k_cache: DevPtr,
    pub v_cache: DevPtr,
    /// `[num_seqs, max_blocks]` i32.
    pub block_tables: DevPtr,
    /// `[n]` i32 each: the sequence and the position of every token.
    pub token_seq: DevPtr,
    pub positions: DevPtr,
    /// `[tiles, 2]` i32: (first token, count) of every tile, or `None` for tiles of one
    /// token each (see [`crate::attention_tiles`]).
    pub tiles: Option<DevPtr>,
    /// `[n, q_dim]` act.
    pub out: DevPtr,
    /// `[n, num_heads, num_parts, head_dim + 2]` f32: per-partition results of tokens whose
    /// context spans more than one partition.
    pub partials: DevPtr,
}

impl Kernels {
    /// Causal attention of `n` query tokens, in `tiles` blocks per kv head and partition,
    /// over the paged cache, then the merge of the partitions of tokens whose context spans
    /// several (see attention.cu).
    pub fn paged_attention(
        &self,
        b: &AttnBuffers,
        shape: AttnShape,
        n: usize,
        tiles: usize,
    ) -> Result<(), CudaError> {
        let args = attention_args(b, shape);
        let group = (shape.num_heads / shape.num_kv_heads) as usize;
        let tile_tokens = shape.tile_tokens.max(1) as usize;
        let grid = (
            tiles as u32,
            shape.num_kv_heads as u32,
            shape.num_parts as u32,
        );
        let shared = shared_bytes(group, tile_tokens, shape.head_dim as usize, self.act_size);
        let threads = (32 * group * tile_tokens) as u32;
        self.launch_3d("paged_attention", grid, threads, shared as u32, &args)?;
        self.attention_merge("attention_merge", b, shape, n)
    }

    /// The merge (kernel `name`: `attention_merge` of attention.cu, `attention_tc_merge` of
    /// attention_tc.cu) of the partitions of every token of `n` whose context spans
    /// several; nothing when the launch had one partition (every token wrote its output
    /// directly).
    fn attention_merge(
        &self,
        name: &str,
        b: &AttnBuffers,
        shape: AttnShape,
        n: usize,
    ) -> Result<(), CudaError> {
        if shape.num_parts <= 1 {
            return Ok(());
        }
        let merge = [
            Arg::Ptr(b.partials),
            Arg::Ptr(b.positions),
            Arg::Ptr(b.out),
            Arg::Attn(shape),
        ];
        let threads = (shape.head_dim as u32).next_multiple_of(32);
        self.launch(name, (n as u32, shape.num_heads as u32), threads, &merge)
    }

    /// Attention on tensor cores (attention_tc.cu, bf16 only) of `n` query tokens in
    /// `tiles` tiles of up to [`crate::kernels::tc_tile_tokens`] tokens each (`b.tiles`,
    /// required; `shape.tile_tokens` the longest), per kv head and partition, then the fold
    /// of the partitions of tokens whose context spans several (`attention_tc_merge`); or,
    /// when `b.partials` is 0 (head dimensions up to [`TC_FOLD_MAX_HEAD_DIM`]), per kv head
    /// only, each block folding its partitions itself (the same bits, no partial results
    /// written: for prefill, whose tiles are many). The kernel is the narrowest whose
    /// registers hold the head ([`tensor_core_kernel`]), up to [`TC_MAX_HEAD_DIM`].
    pub fn attention_tc(
        &self,
        b: &AttnBuffers,
        shape: AttnShape,
        n: usize,
        tiles: usize,
    ) -> Result<(), CudaError> {
        let args = attention_args(b, shape);
        let group = (shape.num_heads / shape.num_kv_heads.max(1)) as usize;
        if shape.tile_tokens.max(1) as usize * group > TC_ROWS {
            return Err(CudaError::Unsupported(format!(
                "attention_tc blocks hold {TC_ROWS} rows, not tiles of {} tokens of {group} \
                 heads each",
                shape.tile_tokens
            )));
        }
        let d = shape.head_dim as usize;
        if d > TC_MAX_HEAD_DIM || !d.is_multiple_of(16) {
            return Err(CudaError::Unsupported(format!(
                "attention_tc takes head dimensions that are multiples of 16 up to \
                 {TC_MAX_HEAD_DIM}, not {d}"
            )));
        }
        let folded = b.partials == 0;
        if folded && shape.head_dim as usize > TC_FOLD_MAX_HEAD_DIM {
            return Err(CudaError::Unsupported(format!(
                "attention_tc folds partitions within a block up to head dimension \
                 {TC_FOLD_MAX_HEAD_DIM}, not {}",
                shape.head_dim
            )));
        }
        let parts = if folded { 1 } else { shape.num_parts as u32 };
        let grid = (tiles as u32, shape.num_kv_heads as u32, parts);
        let (name, threads) = tensor_core_kernel(shape.head_dim as usize);
        self.launch_3d(name, grid, threads, 0, &args)?;
        if folded {
            return Ok(());
        }
        self.attention_merge("attention_tc_merge", b, shape, n)
    }
}
