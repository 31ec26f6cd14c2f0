//! The LoRA corrections of a layer's projections (see `crate::lora`), for the rows of the
//! batch whose sequences run with an adapter.

use tandem_kernels::ops::rms_norm;
use tandem_kernels::parallel::for_each_chunk_mut;

use super::Model;
use crate::lora::{self, AdapterRows, LoraScratch, Projection};
use crate::scratch::LoraWork;

impl Model {
    /// The LoRA corrections of projection `at` = (layer, projection) for the rows that run
    /// with an adapter: `x` is the projection's input, `y` its output.
    pub(super) fn adapt(
        &self,
        rows: &AdapterRows,
        at: (usize, Projection),
        x: &[f32],
        y: &mut [f32],
        scratch: &mut LoraScratch,
    ) {
        if !rows.is_empty() {
            let kernels = (self.packed.isa(), &self.pool);
            lora::add_corrections(kernels, &self.adapters, rows, at, x, y, scratch);
        }
    }

    /// [`Model::adapt`] for projections of a sub-layer's normalised input (`norm` of layer
    /// `l` over `x`, `[n, hidden]`), which the int8 products never write out in f32.
    pub(super) fn adapt_normed<const N: usize>(
        &self,
        rows: &AdapterRows,
        (l, norm): (usize, &[f32]),
        x: &[f32],
        ys: [(Projection, &mut [f32]); N],
        work: &mut LoraWork,
    ) {
        if rows.is_empty() {
            return;
        }
        let (eps, h) = (self.config.rms_norm_eps, norm.len());
        // Only the adapters' rows are read: the others are left as they were.
        work.input.resize(x.len(), 0.0);
        for_each_chunk_mut(&self.pool, &mut work.input, h, |t, row| {
            if rows.contains(t) {
                rms_norm(&x[t * h..(t + 1) * h], norm, eps, row)
            }
        });
        for (p, y) in ys {
            self.adapt(rows, (l, p), &work.input, y, &mut work.scratch);
        }
    }
}
