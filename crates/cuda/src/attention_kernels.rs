//! The launches of the attention kernels (attention.cu, attention_tc.cu) and of the merges of
//! their partitions. Like every launch they go through [`Kernels::launch`].

use crate::attention_tiles::shared_bytes;
use crate::error::CudaError;
use crate::kernels::{Arg, AttnShape, DevPtr, Kernels, TC_MAX_HEAD_DIM, TC_ROWS};

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

/// An `attention_tc_*` kernel pair: the names of its variant of a block per partition and
/// of its variant whose blocks fold their partitions themselves, the threads of its
/// blocks, and the dynamic shared memory the folding blocks take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TensorCoreKernel {
    pub name: &'static str,
    pub fold_name: &'static str,
    pub threads: u32,
    pub fold_shared_bytes: u32,
}

/// The `attention_tc_*` kernels, narrowest head first (see attention_tc.cu): each one's
/// registers hold the columns up to its bound; `attention_tc_256` splits the columns
/// between two warps per 16 rows. A folding warp keeps the fold's value sums in shared
/// memory, 512 bytes per 8 of its columns.
pub(crate) const TENSOR_CORE_KERNELS: [(usize, TensorCoreKernel); 3] = [
    (
        64,
        TensorCoreKernel {
            name: "attention_tc_64",
            fold_name: "attention_tc_64_fold",
            threads: 128,
            fold_shared_bytes: 4 * 8 * 512,
        },
    ),
    (
        128,
        TensorCoreKernel {
            name: "attention_tc_128",
            fold_name: "attention_tc_128_fold",
            threads: 128,
            fold_shared_bytes: 4 * 16 * 512,
        },
    ),
    (
        256,
        TensorCoreKernel {
            name: "attention_tc_256",
            fold_name: "attention_tc_256_fold",
            threads: 256,
            fold_shared_bytes: 8 * 16 * 512,
        },
    ),
];

const _: () = assert!(TENSOR_CORE_KERNELS[TENSOR_CORE_KERNELS.len() - 1].0 == TC_MAX_HEAD_DIM);

/// The narrowest `attention_tc_*` kernel that takes head dimension `d`, if any does.
pub(crate) fn tensor_core_kernel(d: usize) -> Option<TensorCoreKernel> {
    TENSOR_CORE_KERNELS
        .iter()
        .find(|(bound, _)| d <= *bound)
        .map(|&(_, k)| k)
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
    /// when `b.partials` is 0, per kv head only, each block folding its partitions itself
    /// (the same bits, no partial results written: for prefill, whose tiles are many). The
    /// kernel is the narrowest whose registers hold the head ([`tensor_core_kernel`]), up
    /// to [`TC_MAX_HEAD_DIM`].
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
        let kernel = tensor_core_kernel(d).filter(|_| d.is_multiple_of(16));
        let Some(kernel) = kernel else {
            return Err(CudaError::Unsupported(format!(
                "attention_tc takes head dimensions that are multiples of 16 up to \
                 {TC_MAX_HEAD_DIM}, not {d}"
            )));
        };
        let folded = b.partials == 0;
        if folded && !self.tensor_core_folds(d) {
            return Err(CudaError::Unsupported(format!(
                "this device's blocks cannot take {}'s shared memory",
                kernel.fold_name
            )));
        }
        let (name, parts, shared) = match folded {
            true => (kernel.fold_name, 1, kernel.fold_shared_bytes),
            false => (kernel.name, shape.num_parts as u32, 0),
        };
        let grid = (tiles as u32, shape.num_kv_heads as u32, parts);
        self.launch_3d(name, grid, kernel.threads, shared, &args)?;
        if folded {
            return Ok(());
        }
        self.attention_merge("attention_tc_merge", b, shape, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dynamic shared memory of a folding launch is what attention_tc.cu lays out: per
    /// warp, 128 floats per 8 of its columns (`OJ * 128`). A launch given less would
    /// overrun it on the GPU, which the emulator, whose buffer is always large, cannot show.
    #[test]
    fn folding_blocks_get_the_shared_memory_their_warps_fold_in() {
        for (bound, k) in TENSOR_CORE_KERNELS {
            let warps = k.threads as usize / 32;
            let slices = warps / 4; // TC_WARPS warps of rows per slice
            let columns = bound / slices; // a warp's
            let want = warps * columns / 8 * 128 * 4;
            assert_eq!(k.fold_shared_bytes as usize, want, "{}", k.fold_name);
            assert_eq!(tensor_core_kernel(bound), Some(k));
        }
        assert_eq!(
            tensor_core_kernel(48).map(|k| k.name),
            Some("attention_tc_64")
        );
        assert_eq!(
            tensor_core_kernel(96).map(|k| k.name),
            Some("attention_tc_128")
        );
        assert_eq!(tensor_core_kernel(272), None);
    }
}
