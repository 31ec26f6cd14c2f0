//! The launches of the mixture-of-experts kernels (kernels/moe.cu) for `layer_program.rs`.
//! Like every launch they go through [`Kernels::launch`].

use crate::error::CudaError;
use crate::kernels::{Arg, DevPtr, Kernels, ROW_THREADS};
use crate::program_buffers::MatrixPtrs;

/// Outputs of one route that a block of `expert_matvec` computes: one per warp.
const MATVEC_OUTPUTS: u32 = 8;

/// Where a step's routes live: `[n, k]` expert ids (i32) and weights (f32), in ascending
/// expert order, and their grouping by expert (`groups`, i32: `[num_experts]` counts, then
/// `[num_experts + 1]` offsets into the `[n * k]` route order that follows).
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
        2 * num_experts + 1 + routes
    }

    fn counts(&self) -> DevPtr {
        self.groups
    }

    fn offsets(&self) -> DevPtr {
        self.groups + 4 * self.num_experts as u64
    }

    fn order(&self) -> DevPtr {
        self.groups + 4 * (2 * self.num_experts + 1) as u64
    }
}

impl Kernels {
    /// Routes `n` tokens from their router scores (`[n, num_experts]` f32) into `routes`:
    /// softmax, the `k` heaviest (ties to the lower index), renormalised if `normalize`.
    pub fn moe_route(
        &self,
        scores: DevPtr,
        routes: Routes,
        n: usize,
        normalize: bool,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(scores),
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
            Arg::Ptr(routes.counts()),
            Arg::Ptr(routes.offsets()),
            Arg::Ptr(routes.order()),
        ];
        self.launch("moe_group", (1, 1), ROW_THREADS, &args)
    }

    /// `y[r] = x[r / per_token] · W[experts[r]]ᵀ` for every route `r` (grouped by
    /// [`Kernels::moe_group`]). x: `[routes / per_token, width]` act; w: the experts'
    /// `[num_experts * m, width]` stacked matrix, in any of the layers' formats; y:
    /// `[routes, m]` f32.
    pub fn expert_matvec(
        &self,
        (x, w, y): (DevPtr, &MatrixPtrs, DevPtr),
        routes: Routes,
        per_token: usize,
        (m, width): (usize, usize),
    ) -> Result<(), CudaError> {
        let (name, weights) = match *w {
            MatrixPtrs::Dense(w) => ("expert_matvec", vec![Arg::Ptr(w)]),
            MatrixPtrs::Q8 { codes, scales } => {
                ("expert_matvec_q8", vec![Arg::Ptr(codes), Arg::Ptr(scales)])
            }
            MatrixPtrs::Q4 { codes, scales } => {
                ("expert_matvec_q4", vec![Arg::Ptr(codes), Arg::Ptr(scales)])
            }
        };
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
        self.launch(name, grid, 32 * MATVEC_OUTPUTS, &args)
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
            Arg::Ptr(routes.weights),
            Arg::Ptr(out),
            Arg::I32(routes.k as i32),
            Arg::I32(width as i32),
        ];
        self.launch("moe_combine", (n as u32, 1), ROW_THREADS, &args)
    }
}
