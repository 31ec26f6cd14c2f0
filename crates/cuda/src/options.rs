//! How a [`crate::CudaRunner`] is built: device, numeric mode, KV pool size, kernel cache.

use std::path::PathBuf;

use tandem_model::runner::KvDtype;

use crate::error::CudaError;

/// The numeric mode: how weights, matrix-product inputs and the KV cache are stored.
/// Accumulation is f32 in both; the residual stream and the stored hidden states are f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaDtype {
    /// bfloat16 storage, f32 accumulation (cuBLAS bf16 tensor cores).
    Bf16,
    /// f32 everywhere, TF32 disabled: the reference mode.
    F32,
}

impl CudaDtype {
    /// Bytes of one stored element.
    pub fn size(self) -> usize {
        match self {
            CudaDtype::Bf16 => 2,
            CudaDtype::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CudaDtype::Bf16 => "bf16",
            CudaDtype::F32 => "f32",
        }
    }

    /// The KV pool's element type in this mode.
    pub fn kv_dtype(self) -> KvDtype {
        match self {
            CudaDtype::Bf16 => KvDtype::Bf16,
            CudaDtype::F32 => KvDtype::F32,
        }
    }
}

/// How the matrices of the decoder layers are stored on the device (the embedding and the
/// LM head are always in the storage type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaWeights {
    /// In the storage type (`CudaDtype`).
    Dense,
    /// Q8_0: int8 codes and one f32 scale per 32 values (kernels/q8.cu); decode steps
    /// multiply from the codes, larger batches expand a matrix at a time.
    Q8_0,
    /// Q4_1: 4-bit codes with an f16 scale and minimum per 32 values (kernels/q4.cu), the
    /// CPU's Q4_1 weights; used as Q8_0 is.
    Q4_1,
}

impl CudaWeights {
    pub fn name(self) -> &'static str {
        match self {
            CudaWeights::Dense => "dense",
            CudaWeights::Q8_0 => "q8_0",
            CudaWeights::Q4_1 => "q4_1",
        }
    }
}

/// How many KV blocks to allocate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// Exactly this many blocks.
    Blocks(usize),
    /// As many blocks as fit while the process uses at most this fraction of the device's
    /// total memory (vLLM's `gpu_memory_utilization`), after weights and workspace.
    MemoryFraction(f64),
}

impl Default for KvBudget {
    fn default() -> Self {
        KvBudget::MemoryFraction(0.9)
    }
}

/// Everything [`crate::CudaRunner::new`] needs besides the model.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// Which GPU (`cuda:N`).
    pub device_ordinal: usize,
    pub dtype: CudaDtype,
    /// Token slots per KV block.
    pub block_size: usize,
    pub kv: KvBudget,
    /// Where compiled kernels (cubin) are cached between runs.
    pub kernel_cache_dir: PathBuf,
    /// Tokens per forward call the workspace is allocated for up front (larger batches grow
    /// it on demand); counted before sizing the KV pool from a memory fraction.
    pub max_batch_tokens: usize,
    /// Replay decode steps as recorded CUDA graphs (off: every kernel launched from the
    /// host, for comparison and debugging).
    pub cuda_graphs: bool,
    /// Matrix products by tandem's fixed-order kernel instead of cuBLAS, so that a token's
    /// logits are bitwise the same whatever else is in its batch (slower; see
    /// `kernels/matmul.cu`).
    pub batch_invariant: bool,
    /// How the layers' matrices are stored.
    pub weights: CudaWeights,
    /// Run the attention of every step on tensor cores (bf16, head dimensions that are
    /// multiples of 16 up to 256; kernels/attention_tc.cu). Decode steps stay bitwise equal
    /// to scoring (they use the same kernel); the results round differently from the
    /// default kernel's. Off by default until measured on a GPU.
    pub tensor_core_attention: bool,
    /// Overlap steps (`ModelRunner::overlaps_steps`): the engine launches a step, plans
    /// the next while the device runs it, and collects its picks after launching the next
    /// (see `launched_steps.rs`). Off: every step runs to its end before the next is
    /// planned.
    pub overlap_steps: bool,
}

impl CudaOptions {
    /// bf16 on device 0, blocks of 16, 90% of device memory, workspace for 2048 tokens,
    /// CUDA graphs for decode steps, overlapped steps.
    pub fn new(kernel_cache_dir: PathBuf) -> CudaOptions {
        CudaOptions {
            device_ordinal: 0,
            dtype: CudaDtype::Bf16,
            block_size: 16,
            kv: KvBudget::default(),
            kernel_cache_dir,
            max_batch_tokens: 2048,
            cuda_graphs: true,
            batch_invariant: false,
            weights: CudaWeights::Dense,
            tensor_core_attention: false,
            overlap_steps: true,
        }
    }

    /// Checks the values that do not depend on the device.
    pub fn validate(&self) -> Result<(), CudaError> {
        let bad = |m: String| Err(CudaError::Unsupported(m));
        if self.block_size == 0 || self.block_size > 1 << 16 {
            return bad(format!(
                "block size {} must be in 1..=65536",
                self.block_size
            ));
        }
        if self.max_batch_tokens == 0 {
            return bad("max_batch_tokens must be positive".into());
        }
        match self.kv {
            KvBudget::Blocks(0) => bad("the KV pool needs at least one block".into()),
            KvBudget::MemoryFraction(f) if !(f > 0.0 && f <= 1.0) => {
                bad(format!("gpu memory fraction {f} must be in (0, 1]"))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_empty_and_out_of_range_values() {
        let ok = CudaOptions::new(PathBuf::from("cache"));
        assert!(ok.validate().is_ok());
        for kv in [
            KvBudget::Blocks(0),
            KvBudget::MemoryFraction(0.0),
            KvBudget::MemoryFraction(1.5),
            KvBudget::MemoryFraction(f64::NAN),
        ] {
            let o = CudaOptions { kv, ..ok.clone() };
            assert!(o.validate().is_err(), "{kv:?}");
        }
        let o = CudaOptions {
            block_size: 0,
            ..ok.clone()
        };
        assert!(o.validate().is_err());
        assert_eq!(CudaDtype::Bf16.kv_dtype(), KvDtype::Bf16);
    }
}
