//! The model's matrices repacked for the int8 kernels (`tandem_kernels::packed`), built at
//! load time when the process runs an int8 kernel variant; the stored bytes they came from are
//! then released from resident memory (they stay mapped, and the embedding lookup still reads
//! its rows there).

use std::collections::HashMap;

use tandem_kernels::ops::rms_norm;
use tandem_kernels::packed::{
    matmuls_quantized_grouped, matmuls_quantized_with, GroupedProduct, QuantizedRows,
};
use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_kernels::{matmul, Isa, PackedMatrix, PackedRows, ThreadPool};

use crate::transformer::{FeedForward, GatedMlp, ModelWeights};
use crate::weights::{TensorHandle, TensorSet};

/// Packed copies of the matrices whose type has int8 kernels, by tensor.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    by_tensor: HashMap<TensorHandle, PackedMatrix>,
    /// A mixture of experts' matrices, one stack per layer and part (gate, up, down): all
    /// experts' matrices in one allocation that huge pages back
    /// ([`PackedMatrix::pack_stacked`]).
    stacks: Vec<PackedMatrix>,
    /// Where each stacked expert matrix lives: its stack, first row and rows.
    in_stack: HashMap<TensorHandle, (usize, usize, usize)>,
    /// The kernel variant every product of this model runs with.
    isa: Isa,
}

impl PackedWeights {
    /// Packs every matrix of `w` that the int8 kernels handle, if `isa` is an int8 variant
    /// ([`tandem_kernels::Isa::is_exact`] false); otherwise packs nothing. Every product then
    /// runs with `isa`.
    pub(crate) fn prepare(
        tensors: &TensorSet,
        w: &ModelWeights,
        pool: &ThreadPool,
        isa: Isa,
    ) -> Self {
        let mut packed = PackedWeights {
            by_tensor: HashMap::new(),
            stacks: Vec::new(),
            in_stack: HashMap::new(),
            isa,
        };
        if isa.is_exact() {
            return packed;
        }
        for layer in &w.layers {
            if let FeedForward::Experts(e) = &layer.mlp {
                let parts: [fn(&GatedMlp) -> TensorHandle; 3] = [|m| m.gate, |m| m.up, |m| m.down];
                for part in parts {
                    let hs: Vec<TensorHandle> = e.experts.iter().map(part).collect();
                    packed.stack(tensors, &hs, pool);
                }
            }
        }
        let PackedWeights {
            by_tensor,
            in_stack,
            ..
        } = &mut packed;
        let layers = w.layers.iter().flat_map(|l| l.projections());
        for h in layers.chain([w.lm_head]) {
            if by_tensor.contains_key(&h) || in_stack.contains_key(&h) {
                continue;
            }
            let view = tensors
                .by_handle(h)
                .matrix()
                .expect("matrix shapes are validated at load time");
            if let Some(packed) = PackedMatrix::pack(&view, pool) {
                tensors.release_pages(h);
                by_tensor.insert(h, packed);
            }
        }
        packed
    }

    /// Packs the matrices `hs` (one per expert) as one stack, if they stack (see
    /// [`PackedMatrix::pack_stacked`]); else leaves them to be packed one by one.
    fn stack(&mut self, tensors: &TensorSet, hs: &[TensorHandle], pool: &ThreadPool) {
        let views: Vec<_> = hs
            .iter()
            .map(|&h| {
                tensors
                    .by_handle(h)
                    .matrix()
                    .expect("matrix shapes are validated at load time")
            })
            .collect();
        let Some(stack) = PackedMatrix::pack_stacked(&views, pool) else {
            return;
        };
        let index = self.stacks.len();
        let mut first = 0;
        for (&h, view) in hs.iter().zip(&views) {
            tensors.release_pages(h);
            self.in_stack.insert(h, (index, first, view.rows));
            first += view.rows;
        }
        self.stacks.push(stack);
    }

    /// The kernel variant of this model's products.
    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    /// `y = x · Wᵀ` for the matrix `h` (`x`: `[n, cols]`, `y`: `[n, rows]`): the int8 kernels
    /// if it was packed (quantizing `x` into `xq`), else the exact product of its stored form.
    #[allow(clippy::too_many_arguments)] // the product's operands and its scratch
    pub(crate) fn matmul(
        &self,
        tensors: &TensorSet,
        pool: &ThreadPool,
        h: TensorHandle,
        x: &[f32],
        y: &mut [f32],
        n: usize,
        xq: &mut QuantizedRows,
    ) {
        if let Some(p) = self.by_tensor.get(&h) {
            xq.quantize_into_with(self.isa, pool, x, n, p.cols());
            matmuls_quantized_with(self.isa, pool, [p], xq, [y]);
        } else if let Some(w) = self.packed(h) {
            // A stacked expert (a mixture whose other matrices did not all pack).
            xq.quantize_into_with(self.isa, pool, x, n, w.cols());
            let product = GroupedProduct { w, xq, y };
            matmuls_quantized_grouped(self.isa, pool, &mut [product]);
        } else {
            exact_matmul(self.isa, tensors, pool, h, x, y, n);
        }
    }

    /// `ys[m] = x · W_mᵀ` for the matrices `hs`, which share the input `x` (`[n, cols]`):
    /// when all of them are packed, `x` is quantized once and the products run as one job.
    #[allow(clippy::too_many_arguments)] // the operands of N products and their scratch
    pub(crate) fn matmuls<const N: usize>(
        &self,
        tensors: &TensorSet,
        pool: &ThreadPool,
        hs: [TensorHandle; N],
        x: &[f32],
        ys: [&mut [f32]; N],
        n: usize,
        xq: &mut QuantizedRows,
    ) {
        if let Some(ws) = self.all_packed(hs) {
            let cols = ws[0].cols();
            if ws.iter().all(|w| w.cols() == cols) {
                xq.quantize_into_with(self.isa, pool, x, n, cols);
                matmuls_quantized_with(self.isa, pool, ws, xq, ys);
                return;
            }
        }
        for (h, y) in hs.into_iter().zip(ys) {
            self.matmul(tensors, pool, h, x, y, n, xq);
        }
    }

    /// `ys[m] = rms_norm(x) · W_mᵀ` for the matrices `hs` (the q/k/v or gate/up projections):
    /// when all of them are packed, the norm is fused with the activations' quantization and
    /// the products run as one job; otherwise the normed rows are written to `xn` and each
    /// matrix runs on its own.
    #[allow(clippy::too_many_arguments)] // the operands of N products and their scratch
    pub(crate) fn normed_matmuls<const N: usize>(
        &self,
        tensors: &TensorSet,
        pool: &ThreadPool,
        hs: [TensorHandle; N],
        input: NormedInput<'_>,
        scratch: (&mut [f32], &mut QuantizedRows),
        ys: [&mut [f32]; N],
    ) {
        let NormedInput { x, weight, eps } = input;
        let n = x.len() / weight.len().max(1);
        let (xn, xq) = scratch;
        if let Some(ws) = self.all_packed(hs) {
            if ws.iter().all(|w| w.cols() == weight.len()) {
                xq.rms_norm_quantize_into_with(self.isa, pool, x, weight, eps, n);
                matmuls_quantized_with(self.isa, pool, ws, xq, ys);
                return;
            }
        }
        let hidden = weight.len();
        for_each_chunk_mut(pool, xn, hidden, |t, row| {
            rms_norm(&x[t * hidden..(t + 1) * hidden], weight, eps, row)
        });
        self.matmuls(tensors, pool, hs, xn, ys, n, xq);
    }

    /// The packed copy of matrix `h`, alone or in a stack, if it was packed.
    pub(crate) fn packed(&self, h: TensorHandle) -> Option<PackedRows<'_>> {
        if let Some(m) = self.by_tensor.get(&h) {
            return Some(m.into());
        }
        let &(stack, first, rows) = self.in_stack.get(&h)?;
        Some(self.stacks[stack].row_range(first, rows))
    }

    /// Whether every matrix of every gated MLP in `mlps` was packed.
    pub(crate) fn all_packed_slice(&self, mlps: &[GatedMlp]) -> bool {
        mlps.iter()
            .flat_map(|m| [m.gate, m.up, m.down])
            .all(|h| self.by_tensor.contains_key(&h) || self.in_stack.contains_key(&h))
    }

    /// The packed copies of all of `hs`, if every one was packed.
    fn all_packed<const N: usize>(&self, hs: [TensorHandle; N]) -> Option<[&PackedMatrix; N]> {
        let found = hs.map(|h| self.by_tensor.get(&h));
        if found.iter().any(Option::is_none) {
            return None;
        }
        Some(found.map(|w| w.expect("every matrix was found just above")))
    }

    /// Bytes held by the packed copies.
    pub(crate) fn bytes(&self) -> usize {
        let stacks = self.stacks.iter().map(PackedMatrix::bytes);
        self.by_tensor
            .values()
            .map(PackedMatrix::bytes)
            .chain(stacks)
            .sum()
    }
}

/// The input of a sub-layer's projections: the rows `x` (`[n, hidden]`) RMS-normed with
/// `weight` (`[hidden]`) and `eps`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NormedInput<'a> {
    pub x: &'a [f32],
    pub weight: &'a [f32],
    pub eps: f32,
}

/// `y = x · Wᵀ` with the stored form of `h`, exactly, with kernel variant `isa`.
fn exact_matmul(
    isa: Isa,
    tensors: &TensorSet,
    pool: &ThreadPool,
    h: TensorHandle,
    x: &[f32],
    y: &mut [f32],
    n: usize,
) {
    let view = tensors
        .by_handle(h)
        .matrix()
        .expect("matrix shapes are validated at load time");
    matmul::matmul_with(isa, pool, &view, x, y, n);
}
