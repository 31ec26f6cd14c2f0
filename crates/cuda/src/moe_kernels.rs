//! The launches of the mixture-of-experts kernels (kernels/moe.cu) for `layer_program.rs`.
//! Like every launch they go through [`Kernels::launch`].

use crate::error::CudaError;
use crate::kernels::{Arg, DevPtr, Kernels, ROW_THREADS};
use crate::program_buffers::MatrixPtrs;

/// Outputs of one route that a block of `expert_matvec` computes: one per warp.
const MATVEC_OUTPUTS: u32 = 8;
/// `expert_gemm`'s tile (kernels/moe_gemm.cu): routes, outputs and threads of a block, and
/// the columns it stages at a time (the width must be a multiple).
const GEMM_ROUTES: usize = 64;
const GEMM_OUTPUTS: u32 = 64;
const GEMM_THREADS: u32 = 128;
pub(crate) const GEMM_K: usize = 32;
/// Routes per expert, on average over a step, from which quantized experts run on tensor
/// cores rather than from their codes on CUDA cores: a quarter of a tile.
pub(crate) const GEMM_ROUTES_PER_EXPERT: usize = GEMM_ROUTES / 4;

/// Where a step's routes live: `[n, k]` expert ids (i32) and weights (f32), in ascending
/// expert order, and their grouping by expert (`groups`, i32: `[num_experts]` counts,
/// `[num_experts + 1]` offsets into the `[n * k]` route order at the end, and
/// `[num_experts + 1]` offsets of the experts' tiles for `expert_gemm` before it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Routes {
    pub experts: DevPtr,
    pub weights: DevPtr,
    pub groups: DevPtr,
    /// Experts per token.
    pub k: usize,
    pub num_experts: usize,
}

impl Routes {
    /// i32s of the `groups` buffer for `routes` routes of `num_experts` experts.
    pub fn group_words(num_experts: usize, routes: usize) -> usize {
        3 * num_experts + 2 + routes
    }

    /// Blocks of `expert_gemm` that cover every tile of `n` tokens' routes, whatever
    /// experts they chose: Σₑ ⌈countₑ / GEMM_ROUTES⌉ ≤ ⌈routes / GEMM_ROUTES⌉ + the experts
    /// with a route. The bound depends on `n` alone, as a graph's launch shapes must.
    fn tile_slots(&self, n: usize) -> usize {
        let routes = n * self.k;
        routes.div_ceil(GEMM_ROUTES) + routes.min(self.num_experts)
    }

    fn counts(&self) -> DevPtr {
        self.groups
    }

    fn offsets(&self) -> DevPtr {
        self.groups + 4 * self.num_experts as u64
    }

    fn tile_offsets(&self) -> DevPtr {
        self.groups + 4 * (2 * self.num_experts + 1) as u64
    }

    fn order(&self) -> DevPtr {
        self.groups + 4 * (3 * self.num_experts + 2) as u64
    }
}

/// The experts' kernels on CUDA cores and on tensor cores, by weight format (see
/// [`weight_args`]).
const MATVEC_KERNELS: [&str; 3] = ["expert_matvec", "expert_matvec_q8", "expert_matvec_q4"];
const GEMM_KERNELS: [&str; 3] = ["expert_gemm", "expert_gemm_q8", "expert_gemm_q4"];

/// A stacked expert matrix's format (0: the storage type, 1: Q8_0, 2: Q4_1) and its
/// buffers as kernel arguments.
fn weight_args(w: &MatrixPtrs) -> (usize, Vec<Arg>) {
    match *w {
        MatrixPtrs::Dense(w) => (0, vec![Arg::Ptr(w)]),
        MatrixPtrs::Q8 { codes, scales } => (1, vec![Arg::Ptr(codes), Arg::Ptr(scales)]),
        MatrixPtrs::Q4 { codes, scales } => (2, vec![Arg::Ptr(codes), Arg::Ptr(scales)]),
    }
}

impl Kernels {
    /// Routes `n` tokens from their router scores (`[n, num_experts]` f32) into `routes`:
    /// softmax, the `k` heaviest (ties to the lower index), renormalised if `normalize`.
    /// The rows from the device's `*live_rows` (i32) on pad a graph's batch and take no
    /// route.
    pub fn moe_route(
        &self,
        (scores, live_rows): (DevPtr, DevPtr),
        routes: Routes,
        n: usize,
        normalize: bool,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(scores),
            Arg::Ptr(live_rows),
            Arg::Ptr(routes.experts),
            Arg::Ptr(routes.weights),
            Arg::I32(routes.num_experts as i32),
            Arg::I32(routes.k as i32),
            Arg::I32(i32::from(normalize)),
        ];
        self.launch("moe_route", (n as u32, 1), 32, &args)
    }

    /// Groups the `n * k` routes by expert (`routes.groups`).
    pub fn moe_group(&self, routes: Routes, n: usize) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(routes.experts),
            Arg::I32((n * routes.k) as i32),
            Arg::I32(routes.num_experts as i32),
            Arg::I32(GEMM_ROUTES as i32),
            Arg::Ptr(routes.counts()),
            Arg::Ptr(routes.offsets()),
            Arg::Ptr(routes.tile_offsets()),
            Arg::Ptr(routes.order()),
        ];
        self.launch("moe_group", (1, 1), ROW_THREADS, &args)
    }

    /// `y[r] = x[r / per_token] · W[experts[r]]ᵀ` for every route `r` (grouped by
    /// [`Kernels::moe_group`]), on CUDA cores. x: `[routes / per_token, width]` act; w: the
    /// experts' `[num_experts * m, width]` stacked matrix, in any of the layers' formats
    /// (quantized ones from their codes); y: `[routes, m]` f32.
    pub fn expert_matvec(
        &self,
        (x, w, y): (DevPtr, &MatrixPtrs, DevPtr),
        routes: Routes,
        per_token: usize,
        (m, width): (usize, usize),
    ) -> Result<(), CudaError> {
        let (format, weights) = weight_args(w);
        let mut args = vec![Arg::Ptr(x)];
        args.extend(weights);
        args.extend([
            Arg::Ptr(routes.order()),
            Arg::Ptr(routes.offsets()),
            Arg::Ptr(y),
            Arg::I32(per_token as i32),
            Arg::I32(m as i32),
            Arg::I32(width as i32),
        ]);
        let grid = (
            routes.num_experts as u32,
            (m as u32).div_ceil(MATVEC_OUTPUTS),
        );
        self.launch(MATVEC_KERNELS[format], grid, 32 * MATVEC_OUTPUTS, &args)
    }

    /// The products of [`Kernels::expert_matvec`] over `n` tokens' routes on tensor cores
    /// (`expert_gemm`, `_q8`, `_q4`; quantized weights expanded to bf16 as they are
    /// staged). A route's result is the same whatever else the step routes. The width must
    /// be a multiple of [`GEMM_K`]; the program must be bf16 (in f32 the kernels do
    /// nothing).
    pub fn expert_gemm(
        &self,
        (x, w, y): (DevPtr, &MatrixPtrs, DevPtr),
        (routes, n): (Routes, usize),
        per_token: usize,
        (m, width): (usize, usize),
    ) -> Result<(), CudaError> {
        if width % GEMM_K != 0 {
            return Err(CudaError::Unsupported(format!(
                "expert products on tensor cores need a width that is a multiple of {GEMM_K}, \
                 not {width}"
            )));
        }
        let (format, weights) = weight_args(w);
        let mut args = vec![Arg::Ptr(x)];
        args.extend(weights);
        args.extend([
            Arg::Ptr(routes.order()),
            Arg::Ptr(routes.offsets()),
            Arg::Ptr(routes.tile_offsets()),
            Arg::Ptr(y),
            Arg::I32(routes.num_experts as i32),
            Arg::I32(per_token as i32),
            Arg::I32(m as i32),
            Arg::I32(width as i32),
        ]);
        let grid = (
            routes.tile_slots(n) as u32,
            (m as u32).div_ceil(GEMM_OUTPUTS),
        );
        self.launch(GEMM_KERNELS[format], grid, GEMM_THREADS, &args)
    }

    /// `out[t] = Σ weight · y[route]` over token `t`'s routes in ascending expert order.
    /// y: `[n * k, width]` f32; out: `[n, width]` f32.
    pub fn moe_combine(
        &self,
        y: DevPtr,
        routes: Routes,
        out: DevPtr,
        (n, width): (usize, usize),
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(y),
            Arg::Ptr(routes.experts),
            Arg::Ptr(routes.weights),
            Arg::Ptr(out),
            Arg::I32(routes.k as i32),
            Arg::I32(width as i32),
        ];
        self.launch("moe_combine", (n as u32, 1), ROW_THREADS, &args)
    }
}
