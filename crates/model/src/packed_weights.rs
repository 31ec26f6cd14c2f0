//! The model's matrices repacked for the int8 kernels (`tandem_kernels::packed`), built at
//! load time when the process runs an int8 kernel variant; the stored bytes they came from are
//! then released from resident memory (they stay mapped, and the embedding lookup still reads
//! its rows there).

use std::collections::HashMap;

use tandem_kernels::packed::{matmul_quantized, QuantizedRows};
use tandem_kernels::{isa, matmul, matmul_packed, PackedMatrix, ThreadPool};

use crate::transformer::ModelWeights;
use crate::weights::{TensorHandle, TensorSet};

/// Packed copies of the matrices whose type has int8 kernels, by tensor.
#[derive(Debug, Default)]
pub(crate) struct PackedWeights {
    by_tensor: HashMap<TensorHandle, PackedMatrix>,
}

impl PackedWeights {
    /// Packs every matrix of `w` that the int8 kernels handle, if the active kernel variant
    /// is an int8 one ([`tandem_kernels::Isa::is_exact`] false); otherwise packs nothing.
    pub(crate) fn prepare(tensors: &TensorSet, w: &ModelWeights, pool: &ThreadPool) -> Self {
        let mut by_tensor = HashMap::new();
        if isa::active().is_exact() {
            return PackedWeights { by_tensor };
        }
        let layers = w
            .layers
            .iter()
            .flat_map(|l| [l.q, l.k, l.v, l.o, l.gate, l.up, l.down]);
        for h in layers.chain([w.lm_head]) {
            if by_tensor.contains_key(&h) {
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
        PackedWeights { by_tensor }
    }

    /// `y = x · Wᵀ` for the matrix `h` (`x`: `[n, cols]`, `y`: `[n, rows]`): the int8 kernels
    /// if it was packed, else the exact product of its stored form.
    pub(crate) fn matmul(
        &self,
        tensors: &TensorSet,
        pool: &ThreadPool,
        h: TensorHandle,
        x: &[f32],
        y: &mut [f32],
        n: usize,
    ) {
        match self.by_tensor.get(&h) {
            Some(p) => matmul_packed(pool, p, x, y, n),
            None => {
                let view = tensors
                    .by_handle(h)
                    .matrix()
                    .expect("matrix shapes are validated at load time");
                matmul(pool, &view, x, y, n);
            }
        }
    }

    /// [`PackedWeights::matmul`] of several matrices with the same input `x`: when all of
    /// them are packed, `x` is quantized once for all.
    #[allow(clippy::too_many_arguments)] // the operands of N products
    pub(crate) fn matmuls<const N: usize>(
        &self,
        tensors: &TensorSet,
        pool: &ThreadPool,
        hs: [TensorHandle; N],
        x: &[f32],
        ys: [&mut [f32]; N],
        n: usize,
    ) {
        let packed: Option<Vec<&PackedMatrix>> = hs.iter().map(|h| self.by_tensor.get(h)).collect();
        match packed {
            Some(ws) if n > 0 && ws.iter().all(|w| w.cols() == ws[0].cols()) => {
                let xq = QuantizedRows::quantize(pool, x, n, ws[0].cols());
                for (w, y) in ws.into_iter().zip(ys) {
                    matmul_quantized(pool, w, &xq, y);
                }
            }
            _ => {
                for (h, y) in hs.into_iter().zip(ys) {
                    self.matmul(tensors, pool, h, x, y, n);
                }
            }
        }
    }

    /// Bytes held by the packed copies.
    pub(crate) fn bytes(&self) -> usize {
        self.by_tensor.values().map(PackedMatrix::bytes).sum()
    }
}
