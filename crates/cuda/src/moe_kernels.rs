//! The launches of the mixture-of-experts kernels (kernels/moe.cu) for `layer_program.rs`.
//! Like every launch they go through [`Kernels::launch`].

use crate::error::CudaError;
use crate::kernels::{Arg, DevPtr, Kernels, ROW_THREADS};

/// Outputs of one route that a block of `expert_matvec` computes: one per warp.
const MATVEC_OUTPUTS: u32 = 8;

/// Where a step's routes live: `[n, k]` expert ids (i32) and weights (f32), heaviest first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Routes {
    pub experts: DevPtr,
    pub weights: DevPtr,
    /// Experts per token.
    pub k: usize,
}

impl Kernels {
    /// Routes `n` tokens from their router scores (`[n, num_experts]` f32) into `routes`:
    /// softmax, the `k` heaviest (ties to the lower index), renormalised if `normalize`.
    pub fn moe_route(
        &self,
        scores: DevPtr,
        routes: Routes,
        (n, num_experts): (usize, usize),
        normalize: bool,
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(scores),
            Arg::Ptr(routes.experts),
            Arg::Ptr(routes.weights),
            Arg::I32(num_experts as i32),
            Arg::I32(routes.k as i32),
            Arg::I32(i32::from(normalize)),
        ];
        self.launch("moe_route", (n as u32, 1), 32, &args)
    }

    /// `y[r] = x[r / per_token] · W[experts[r]]ᵀ` for `rows` routes. x: `[rows / per_token,
    /// width]` act; w: `[num_experts, m, width]` act; y: `[rows, m]` f32.
    #[allow(clippy::too_many_arguments)] // the kernel's arguments
    pub fn expert_matvec(
        &self,
        x: DevPtr,
        w: DevPtr,
        experts: DevPtr,
        y: DevPtr,
        per_token: usize,
        (rows, m, width): (usize, usize, usize),
    ) -> Result<(), CudaError> {
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::Ptr(experts),
            Arg::Ptr(y),
            Arg::I32(per_token as i32),
            Arg::I32(m as i32),
            Arg::I32(width as i32),
        ];
        let grid = (rows as u32, (m as u32).div_ceil(MATVEC_OUTPUTS));
        self.launch("expert_matvec", grid, 32 * MATVEC_OUTPUTS, &args)
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
