//! The paged KV pool in device memory: per layer, key and value planes of
//! `[num_blocks * block_size, kv_dim]` elements of the storage type, plus one f32 final
//! hidden state per slot (`[num_slots, hidden_size]`, read by `cached_logits`). Block `b`
//! holds slots `b * block_size .. (b + 1) * block_size` of every plane.

use std::sync::Arc;

use cudarc::driver::{result as driver, CudaSlice, CudaStream, DevicePtr};
use tandem_model::batch::BlockId;
use tandem_model::ModelConfig;

use crate::error::CudaError;
use crate::kernels::DevPtr;
use crate::options::CudaDtype;
use crate::program_buffers::KvPtrs;

/// Memory kept free beyond the KV pool when sizing it from a fraction of device memory
/// (cuBLAS workspaces, the LM head's logits tile, allocator slack).
const SIZING_HEADROOM_BYTES: usize = 512 << 20;

/// Bytes one token slot takes: keys and values of every layer plus its f32 hidden state.
pub(crate) fn bytes_per_token(c: &ModelConfig, dtype: CudaDtype) -> usize {
    2 * c.num_layers * c.kv_dim() * dtype.size() + c.hidden_size * 4
}

/// Blocks that fit when the process may use `fraction` of `total` device memory and
/// `total - free` is in use already.
pub(crate) fn blocks_for_fraction(
    free: usize,
    total: usize,
    fraction: f64,
    bytes_per_block: usize,
) -> Result<usize, CudaError> {
    let allowed = (total as f64 * fraction) as usize;
    let used = total.saturating_sub(free);
    let budget = allowed
        .saturating_sub(used)
        .saturating_sub(SIZING_HEADROOM_BYTES)
        .min(free.saturating_sub(SIZING_HEADROOM_BYTES));
    let blocks = budget / bytes_per_block.max(1);
    if blocks == 0 {
        return Err(CudaError::OutOfMemory(format!(
            "no room for KV blocks: {used} of {total} bytes are in use and the process may use \
             {fraction} of the device"
        )));
    }
    Ok(blocks)
}

/// The KV planes and hidden-state store.
#[derive(Debug)]
pub(crate) struct KvPool {
    pub block_size: usize,
    pub num_blocks: usize,
    kv_dim: usize,
    hidden_size: usize,
    elem: usize,
    /// Per layer `[num_slots, kv_dim]` storage type.
    keys: Vec<CudaSlice<u8>>,
    values: Vec<CudaSlice<u8>>,
    /// `[num_slots, hidden_size]` f32.
    hidden: CudaSlice<f32>,
    stream: Arc<CudaStream>,
}

impl KvPool {
    /// Allocates a zeroed pool of `num_blocks` blocks, plus one scratch block (see
    /// [`KvPool::scratch_block`]).
    pub fn new(
        stream: &Arc<CudaStream>,
        c: &ModelConfig,
        dtype: CudaDtype,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<KvPool, CudaError> {
        let slots = (num_blocks + 1)
            .checked_mul(block_size)
            .filter(|s| *s <= i64::MAX as usize / (c.kv_dim().max(c.hidden_size) * 4))
            .ok_or_else(|| CudaError::OutOfMemory(format!("{num_blocks} blocks overflow")))?;
        let plane = slots * c.kv_dim() * dtype.size();
        let oom = |e| CudaError::OutOfMemory(format!("KV pool of {num_blocks} blocks: {e}"));
        let alloc = || stream.alloc_zeros::<u8>(plane).map_err(oom);
        let keys = (0..c.num_layers)
            .map(|_| alloc())
            .collect::<Result<Vec<_>, _>>()?;
        let values = (0..c.num_layers)
            .map(|_| alloc())
            .collect::<Result<Vec<_>, _>>()?;
        let hidden = stream
            .alloc_zeros::<f32>(slots * c.hidden_size)
            .map_err(oom)?;
        Ok(KvPool {
            block_size,
            num_blocks,
            kv_dim: c.kv_dim(),
            hidden_size: c.hidden_size,
            elem: dtype.size(),
            keys,
            values,
            hidden,
            stream: stream.clone(),
        })
    }

    /// The block after the engine's `num_blocks`: padding rows of a replayed decode graph
    /// write their K/V and hidden state there, and nothing ever reads it back.
    pub fn scratch_block(&self) -> usize {
        self.num_blocks
    }

    /// The addresses [`LayerProgram`](crate::layer_program::LayerProgram) reads and writes.
    pub fn ptrs(&self) -> KvPtrs {
        let plane = |p: &CudaSlice<u8>| p.device_ptr(&self.stream).0;
        KvPtrs {
            keys: self.keys.iter().map(plane).collect(),
            values: self.values.iter().map(plane).collect(),
            hidden: self.hidden_ptr(),
            block_size: self.block_size,
        }
    }

    /// Device address of the hidden-state store.
    pub fn hidden_ptr(&self) -> DevPtr {
        self.hidden.device_ptr(&self.stream).0
    }

    /// Copies whole blocks `(src, dst)` in order, every plane and the hidden states, on the
    /// device. All ids are checked before anything is copied.
    pub fn copy_blocks(&self, copies: &[(BlockId, BlockId)]) -> Result<(), CudaError> {
        tandem_model::runner::check_block_copies(copies, self.num_blocks)?;
        let kv_block = self.block_size * self.kv_dim * self.elem; // bytes per block, one plane
        let hidden_block = self.block_size * self.hidden_size * 4;
        for &(src, dst) in copies.iter().filter(|(s, d)| s != d) {
            let (s, d) = (src.0 as usize, dst.0 as usize);
            for plane in self.keys.iter().chain(&self.values) {
                let base = plane.device_ptr(&self.stream).0;
                self.copy(base, s * kv_block, d * kv_block, kv_block)?;
            }
            self.copy(
                self.hidden_ptr(),
                s * hidden_block,
                d * hidden_block,
                hidden_block,
            )?;
        }
        Ok(())
    }

    /// Copies `len` bytes from `base + src` to `base + dst` (disjoint: different blocks).
    fn copy(&self, base: DevPtr, src: usize, dst: usize, len: usize) -> Result<(), CudaError> {
        // SAFETY: `base` is a live allocation of this pool and both ranges are whole blocks
        // below `num_blocks` (checked by the caller), so they lie inside it and, being
        // different blocks, do not overlap. The copy is queued on the pool's stream, which
        // orders it after earlier writes and before later reads.
        unsafe {
            driver::memcpy_dtod_async(
                base + dst as u64,
                base + src as u64,
                len,
                self.stream.cu_stream(),
            )
        }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fraction_sizing_counts_memory_in_use_and_headroom() {
        let gib = 1usize << 30;
        // 80 GiB device, 10 GiB in use, 90%: 72 - 10 - 0.5 = 61.5 GiB for blocks of 1 MiB.
        let blocks = blocks_for_fraction(70 * gib, 80 * gib, 0.9, 1 << 20).expect("fits");
        assert_eq!(blocks, (72 * gib - 10 * gib - SIZING_HEADROOM_BYTES) >> 20);
        assert!(blocks_for_fraction(gib, 80 * gib, 0.9, 1 << 20).is_err());
        assert!(blocks_for_fraction(70 * gib, 80 * gib, 0.1, 1 << 20).is_err());
    }
}
