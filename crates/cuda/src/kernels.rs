//! The CUDA C kernels (`kernels/*.cu`, compiled at run time) and their launches.
//!
//! Every kernel takes raw device addresses (`u64`, a `CUdeviceptr`) rather than typed
//! slices: buffers of the storage type (`act_t`: bf16 or f32, chosen when the program is
//! compiled) and f32 buffers are passed alike. The launch wrappers below are the only place
//! kernels are started; each documents the shapes its caller must provide, and all of them
//! go through [`Kernels::launch`], the module's one `unsafe` block.

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::attention_kernels::TENSOR_CORE_KERNELS;
use crate::error::CudaError;
use crate::nvrtc_cache::load_or_compile;
use crate::options::CudaDtype;
use tandem_model::config::Activation;

/// A device address, as kernels receive it.
pub(crate) type DevPtr = u64;

/// The kernel files, in the order they are concatenated into one program.
const SOURCES: [(&str, &str); 15] = [
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("norm.cu", include_str!("../kernels/norm.cu")),
    ("elementwise.cu", include_str!("../kernels/elementwise.cu")),
    ("rope_kv.cu", include_str!("../kernels/rope_kv.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    ("tensor_core.cu", include_str!("../kernels/tensor_core.cu")),
    (
        "attention_tc.cu",
        include_str!("../kernels/attention_tc.cu"),
    ),
    ("logprobs.cu", include_str!("../kernels/logprobs.cu")),
    ("processing.cu", include_str!("../kernels/processing.cu")),
    ("sampling.cu", include_str!("../kernels/sampling.cu")),
    ("matmul.cu", include_str!("../kernels/matmul.cu")),
    ("q8.cu", include_str!("../kernels/q8.cu")),
    ("q4.cu", include_str!("../kernels/q4.cu")),
    ("moe.cu", include_str!("../kernels/moe.cu")),
    ("moe_gemm.cu", include_str!("../kernels/moe_gemm.cu")),
];

/// Names of the kernels the program defines.
pub const KERNEL_NAMES: [&str; 37] = [
    "embed_gather",
    "add_rms_norm",
    "final_norm_store",
    "qkv_rope_store",
    "paged_attention",
    "attention_merge",
    "attention_tc_64",
    "attention_tc_64_fold",
    "attention_tc_128",
    "attention_tc_128_fold",
    "attention_tc_256",
    "attention_tc_256_fold",
    "attention_tc_merge",
    "gated_activation",
    "soft_cap",
    "rms_norm_rows",
    "gather_hidden",
    "carry_tokens",
    "logit_exp_sums",
    "process_rows",
    "restore_rows",
    "sample_rows",
    "top_logits",
    "matmul_fixed",
    "q8_matvec",
    "q8_dequant",
    "q4_matvec",
    "q4_dequant",
    "moe_route",
    "moe_group",
    "expert_matvec",
    "expert_matvec_q8",
    "expert_matvec_q4",
    "moe_combine",
    "expert_gemm",
    "expert_gemm_q8",
    "expert_gemm_q4",
];

/// Index of kernel `name` in [`KERNEL_NAMES`].
fn kernel_index(name: &str) -> usize {
    KERNEL_NAMES
        .iter()
        .position(|n| *n == name)
        .expect("kernel names are the constants of KERNEL_NAMES")
}

/// Positions of the context one attention block covers (`ATTN_PARTITION` in attention.cu).
/// Fixed, so that a token's attention never depends on the batch it runs in.
pub(crate) const ATTN_PARTITION: usize = 128;
/// Partitions a `paged_attention` launch over tiles of up to `tile_tokens` tokens names on a
/// layer with a sliding `window` (`None` or 0: none), when `parts` cover its longest
/// context. The kernel counts a tile's partitions from that of its first token's window
/// start, and the windows of `tile_tokens` consecutive positions span at most
/// `(window + tile_tokens - 2) / ATTN_PARTITION + 2` partitions; naming all `parts` would
/// launch a block per partition of the longest context, nearly all of them with nothing to
/// do at long contexts.
pub(crate) fn window_parts(parts: usize, window: Option<usize>, tile_tokens: usize) -> usize {
    match window {
        Some(w) if w > 0 => {
            let spanned = w.saturating_add(tile_tokens.max(1)).saturating_sub(2);
            parts.min(spanned / ATTN_PARTITION + 2)
        }
        _ => parts,
    }
}

/// Largest head dimension the attention kernel handles (`32 * ATTN_MAX_PER_LANE`).
pub(crate) const MAX_HEAD_DIM: usize = 256;
/// Query rows of an `attention_tc_*` block (`TC_ROWS` in attention_tc.cu): (token, query
/// head) pairs of one kv head's group. Then the largest head dimension the kernels take
/// (`attention_tc_256`'s).
pub(crate) const TC_ROWS: usize = 64;
pub(crate) const TC_MAX_HEAD_DIM: usize = 256;

/// Tokens per tile of `attention_tc_*` for GQA groups of `group` query heads per kv head
/// (at most [`TC_ROWS`]): every head of the group takes a row for each token.
pub(crate) fn tc_tile_tokens(group: usize) -> usize {
    (TC_ROWS / group.max(1)).max(1)
}
/// Largest number of query heads per kv head (one warp each in an attention block).
pub(crate) const MAX_GQA_GROUP: usize = 32;
/// Threads of a row-wise kernel block.
pub(crate) const ROW_THREADS: u32 = 256;

/// The whole kernel program: every source file, concatenated.
pub fn program_source() -> String {
    let mut src = String::new();
    for (name, text) in SOURCES {
        src.push_str(&format!("// ---- {name} ----\n"));
        src.push_str(text);
        src.push('\n');
    }
    src
}

/// NVRTC options selecting the storage type of `dtype`.
pub fn program_options(dtype: CudaDtype) -> Vec<String> {
    let bf16 = matches!(dtype, CudaDtype::Bf16) as u8;
    vec![
        format!("-DTANDEM_ACT_BF16={bf16}"),
        format!("-DTANDEM_ATTN_PARTITION={ATTN_PARTITION}"),
    ]
}

/// Shape arguments of `qkv_rope_store` (`QkvShape` in rope_kv.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct QkvShape {
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub neox: i32,
    pub has_bias: i32,
    pub has_qk_norm: i32,
    pub eps: f32,
}

/// Shape arguments of `paged_attention` (`AttnShape` in attention.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnShape {
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub block_size: i32,
    pub max_blocks: i32,
    pub scale: f32,
    /// Partitions per (token, head) in the partials buffer; at least the longest context
    /// of the launch divided by [`ATTN_PARTITION`], rounded up.
    pub num_parts: i32,
    /// Most tokens in a tile (see [`crate::attention_tiles`]); 1 without a tile table.
    pub tile_tokens: i32,
    /// Positions a token sees on this layer, itself included (a sliding window); 0: all.
    pub window: i32,
}

// SAFETY: both are `repr(C)` structs of 4-byte integers and floats, laid out exactly as the
// C structs of the same fields in the kernel sources, with no padding and no pointers.
unsafe impl DeviceRepr for QkvShape {}
// SAFETY: as above.
unsafe impl DeviceRepr for AttnShape {}

/// One kernel argument.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    Ptr(DevPtr),
    I32(i32),
    F32(f32),
    Qkv(QkvShape),
    Attn(AttnShape),
}

/// Where launches run.
#[derive(Debug)]
enum Launcher {
    /// The device of the stream, with the program's functions in `KERNEL_NAMES` order.
    Device {
        stream: Arc<CudaStream>,
        functions: Vec<CudaFunction>,
    },
    /// The CPU (tests), with host addresses for device pointers.
    #[cfg(test)]
    Emulated(crate::emulator::Emulator),
}

/// The loaded kernel functions.
#[derive(Debug)]
pub(crate) struct Kernels {
    launcher: Launcher,
    /// Bytes of dynamic shared memory an attention block may take on this device.
    attention_shared_limit: usize,
    /// For each of [`TENSOR_CORE_KERNELS`], whether this device's blocks can take its
    /// `_fold` twin's shared memory.
    tensor_core_folds: [bool; TENSOR_CORE_KERNELS.len()],
    /// Bytes of the storage type (`act_t`).
    pub(crate) act_size: usize,
}

impl Kernels {
    /// Compiles (or loads from `cache_dir`) the program for the device of `stream` and
    /// `dtype`, and looks up every kernel.
    pub fn load(
        stream: &Arc<CudaStream>,
        dtype: CudaDtype,
        cache_dir: &Path,
    ) -> Result<Kernels, CudaError> {
        let ctx: &Arc<CudaContext> = stream.context();
        let (major, minor) = ctx.compute_capability()?;
        let arch = format!("sm_{major}{minor}");
        let cubin = load_or_compile(cache_dir, &program_source(), &arch, &program_options(dtype))?;
        let module = ctx.load_module(Ptx::from_binary(cubin))?;
        let functions = KERNEL_NAMES
            .iter()
            .map(|name| module.load_function(name))
            .collect::<Result<Vec<_>, _>>()?;
        // A block may take more than 48 KiB of shared memory, static and dynamic together,
        // only when its function is told so; allow the attention what the device offers.
        let optin = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
        let limit = ctx.attribute(optin)?.max(48 << 10);
        let dynamic = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        functions[kernel_index("paged_attention")].set_attribute(dynamic, limit)?;
        // The tensor-core blocks that fold their partitions keep the fold in shared memory
        // beside their static stages, a fixed need; a device whose blocks cannot take it
        // runs those steps a block per partition instead (the same bits).
        let mut tensor_core_folds = [false; TENSOR_CORE_KERNELS.len()];
        for ((_, k), folds) in TENSOR_CORE_KERNELS.iter().zip(&mut tensor_core_folds) {
            let function = &functions[kernel_index(k.fold_name)];
            let bytes = k.fold_shared_bytes as i32;
            *folds = function.shared_size_bytes()? + bytes <= limit;
            if *folds {
                function.set_attribute(dynamic, bytes)?;
            }
        }
        Ok(Kernels {
            launcher: Launcher::Device {
                stream: stream.clone(),
                functions,
            },
            attention_shared_limit: limit as usize,
            tensor_core_folds,
            act_size: dtype.size(),
        })
    }

    /// The program of `dtype` run on the CPU: every launch runs to completion before it
    /// returns, and device addresses are host addresses (see [`crate::emulator`]).
    #[cfg(test)]
    pub fn emulated(dtype: CudaDtype) -> Result<Kernels, CudaError> {
        let emulator = crate::emulator::Emulator::new(dtype)?;
        let mut names = emulator.kernel_names();
        let mut expected = KERNEL_NAMES.map(String::from).to_vec();
        names.sort();
        expected.sort();
        if names != expected {
            return Err(CudaError::Emulator(format!(
                "the emulated program defines {names:?}, the launches expect {KERNEL_NAMES:?}"
            )));
        }
        Ok(Kernels {
            launcher: Launcher::Emulated(emulator),
            attention_shared_limit: 232_448, // an H100's or H200's opt-in limit
            tensor_core_folds: [true; TENSOR_CORE_KERNELS.len()],
            act_size: dtype.size(),
        })
    }

    /// Bytes of dynamic shared memory an attention block may take.
    pub fn attention_shared_limit(&self) -> usize {
        self.attention_shared_limit
    }

    /// Whether the tensor-core attention of heads of `head_dim` can run blocks that fold
    /// their partitions themselves on this device (see [`TENSOR_CORE_KERNELS`]).
    pub(crate) fn tensor_core_folds(&self, head_dim: usize) -> bool {
        TENSOR_CORE_KERNELS
            .iter()
            .zip(self.tensor_core_folds)
            .find(|((bound, _), _)| head_dim <= *bound)
            .is_some_and(|(_, folds)| folds)
    }

    /// Launches kernel `name` on a `grid` of blocks of `block` threads.
    pub(crate) fn launch(
        &self,
        name: &str,
        grid: (u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        self.launch_3d(name, (grid.0, grid.1, 1), block, 0, args)
    }

    /// Launches kernel `name` on a 3-d `grid` with `shared` bytes of dynamic shared memory.
    pub(crate) fn launch_3d(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        shared: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let (stream, functions) = match &self.launcher {
            Launcher::Device { stream, functions } => (stream, functions),
            #[cfg(test)]
            Launcher::Emulated(e) => return e.launch(name, grid, block, shared, args),
        };
        let func = &functions[kernel_index(name)];
        let mut b = stream.launch_builder(func);
        for a in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::I32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
                Arg::Qkv(s) => b.arg(s),
                Arg::Attn(s) => b.arg(s),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: shared,
        };
        // SAFETY: every caller below passes the arguments of the kernel's C signature, in
        // order and of the right types, with device addresses of live allocations of this
        // context that hold at least the extents documented on the wrapper (the forward
        // pass sizes its buffers from the batch before launching). All work runs on the one
        // stream, so buffers freed later (asynchronously, on the same stream) outlive it.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `x[t] = table[tokens[t]] * scale`. table: `[vocab, h]` act; tokens: `[n]` i32;
    /// x: `[n, h]` f32.
    pub fn embed_gather(
        &self,
        table: DevPtr,
        tokens: DevPtr,
        x: DevPtr,
        (n, h): (usize, usize),
        scale: f32,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(table),
            Arg::Ptr(tokens),
            Arg::Ptr(x),
            Arg::I32(h as i32),
            Arg::F32(scale),
        ];
        self.launch("embed_gather", (n as u32, 1), ROW_THREADS, &args)
    }

    /// `x += delta` (when `delta` is `Some`), then `out = rms_norm(x) * weight`.
    /// x, delta: `[n, h]` f32; weight: `[h]` f32; out: `[n, h]` act.
    #[allow(clippy::too_many_arguments)] // the kernel's arguments
    pub fn add_rms_norm(
        &self,
        x: DevPtr,
        delta: Option<DevPtr>,
        weight: DevPtr,
        out: DevPtr,
        n: usize,
        h: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(delta.unwrap_or(0)),
            Arg::Ptr(weight),
            Arg::Ptr(out),
            Arg::I32(h as i32),
            Arg::F32(eps),
        ];
        self.launch("add_rms_norm", (n as u32, 1), ROW_THREADS, &args)
    }

    /// `x += delta`, then the normed row `t` goes to `hidden_store[slots[t]]`.
    /// x, delta: `[n, h]` f32; weight: `[h]`; slots: `[n]` i64; hidden_store: `[slots, h]` f32.
    #[allow(clippy::too_many_arguments)] // the kernel's arguments
    pub fn final_norm_store(
        &self,
        x: DevPtr,
        delta: DevPtr,
        weight: DevPtr,
        slots: DevPtr,
        hidden_store: DevPtr,
        n: usize,
        h: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(delta),
            Arg::Ptr(weight),
            Arg::Ptr(slots),
            Arg::Ptr(hidden_store),
            Arg::I32(h as i32),
            Arg::F32(eps),
        ];
        self.launch("final_norm_store", (n as u32, 1), ROW_THREADS, &args)
    }
}

/// Buffers of `qkv_rope_store` for one layer (n tokens).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QkvBuffers {
    /// `[n, q_dim + 2 * kv_dim]` f32: the fused projection output.
    pub qkv: DevPtr,
    /// `[q_dim + 2 * kv_dim]` f32, or `None` without bias.
    pub bias: Option<DevPtr>,
    /// `[2, head_dim]` f32 (q weights, then k weights), or `None`.
    pub qk_norm: Option<DevPtr>,
    /// `[n, head_dim / 2]` f32 each.
    pub cos: DevPtr,
    pub sin: DevPtr,
    /// `[n]` i64: each token's KV slot.
    pub slots: DevPtr,
    /// `[n, q_dim]` f32: rotated queries.
    pub q_out: DevPtr,
    /// `[num_slots, kv_dim]` act: this layer's key and value planes.
    pub k_cache: DevPtr,
    pub v_cache: DevPtr,
}

impl Kernels {
    /// Bias, q/k head norms, RoPE and the K/V store of `n` tokens (see rope_kv.cu).
    pub fn qkv_rope_store(
        &self,
        b: &QkvBuffers,
        shape: QkvShape,
        n: usize,
    ) -> Result<(), CudaError> {
        let heads = (shape.num_heads + 2 * shape.num_kv_heads) as u32;
        let threads = (shape.head_dim as u32).next_multiple_of(32);
        let args = [
            Arg::Ptr(b.qkv),
            Arg::Ptr(b.bias.unwrap_or(0)),
            Arg::Ptr(b.qk_norm.unwrap_or(0)),
            Arg::Ptr(b.cos),
            Arg::Ptr(b.sin),
            Arg::Ptr(b.slots),
            Arg::Ptr(b.q_out),
            Arg::Ptr(b.k_cache),
            Arg::Ptr(b.v_cache),
            Arg::Qkv(shape),
        ];
        self.launch("qkv_rope_store", (n as u32, heads), threads, &args)
    }

    /// `out = act(gate) * up`: SwiGLU or GeGLU. gate_up: `[n, 2 * ff]` f32; out: `[n, ff]`
    /// act.
    pub fn gated_activation(
        &self,
        gate_up: DevPtr,
        out: DevPtr,
        (n, ff): (usize, usize),
        act: Activation,
    ) -> Result<(), CudaError> {
        let gelu = i32::from(act == Activation::GeluTanh);
        let args = [
            Arg::Ptr(gate_up),
            Arg::Ptr(out),
            Arg::I32(ff as i32),
            Arg::I32(gelu),
        ];
        let per_row = (ff as u32).div_ceil(ROW_THREADS);
        self.launch("gated_activation", (n as u32, per_row), ROW_THREADS, &args)
    }

    /// `x = rms_norm(x) * weight` row by row, in place. x: `[n, h]` f32; weight: `[h]` f32.
    pub fn rms_norm_rows(
        &self,
        x: DevPtr,
        weight: DevPtr,
        (n, h): (usize, usize),
        eps: f32,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(weight),
            Arg::I32(h as i32),
            Arg::F32(eps),
        ];
        self.launch("rms_norm_rows", (n as u32, 1), ROW_THREADS, &args)
    }

    /// `x = cap * tanh(x / cap)`, in place. x: `[n, width]` f32.
    pub fn soft_cap(
        &self,
        x: DevPtr,
        (n, width): (usize, usize),
        cap: f32,
    ) -> Result<(), CudaError> {
        let args = [Arg::Ptr(x), Arg::I32(width as i32), Arg::F32(cap)];
        let per_row = (width as u32).div_ceil(ROW_THREADS);
        self.launch("soft_cap", (n as u32, per_row), ROW_THREADS, &args)
    }

    /// `out[r] = hidden_store[slots[r]]` for `rows` rows. slots: `[rows]` i64;
    /// hidden_store: `[num_slots, h]` f32; out: `[rows, h]` act.
    pub fn gather_hidden(
        &self,
        hidden_store: DevPtr,
        slots: DevPtr,
        out: DevPtr,
        rows: usize,
        h: usize,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(hidden_store),
            Arg::Ptr(slots),
            Arg::Ptr(out),
            Arg::I32(h as i32),
        ];
        self.launch("gather_hidden", (rows as u32, 1), ROW_THREADS, &args)
    }
}
