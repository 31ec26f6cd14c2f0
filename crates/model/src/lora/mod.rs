//! LoRA adapters applied at run time, per sequence (multi-LoRA serving): a projection `W` of
//! a layer computes `y = W x + s · B (A x)` for the tokens of a sequence that names an
//! adapter, and `y = W x` for every other token of the same batch. `A` is `[r, in]`, `B` is
//! `[out, r]` and `s` the adapter's scale (`alpha / r`, or `alpha / √r` for rsLoRA). The base
//! weights are never changed, so any number of adapters share one copy of the model, and a
//! token's result depends only on its own row and its sequence's adapter (batch invariance
//! holds across adapters).
//!
//! The correction is computed exactly in f32 (the rank is small: `r · (in + out)`
//! multiply-adds a row, against the projection's `in · out`). Adapters are read from PEFT's
//! directories (`peft.rs`).

mod peft;

use std::ops::Range;

use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_kernels::ThreadPool;

pub use peft::load_peft_adapter;

/// Index of an adapter registered with a model ([`crate::transformer::Model::add_adapter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterId(pub u32);

/// The projections of a layer an adapter may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Projection {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Projection {
    pub const ALL: [Projection; 7] = [
        Projection::Q,
        Projection::K,
        Projection::V,
        Projection::O,
        Projection::Gate,
        Projection::Up,
        Projection::Down,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// One projection's low-rank correction.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair {
    pub rank: usize,
    /// `[rank, in]`.
    pub a: Vec<f32>,
    /// `[out, rank]`.
    pub b: Vec<f32>,
    pub scale: f32,
}

impl LoraPair {
    fn in_dim(&self) -> usize {
        self.a.len() / self.rank
    }

    fn out_dim(&self) -> usize {
        self.b.len() / self.rank
    }

    /// `y += scale · B (A x)` for one row.
    fn add_to(&self, x: &[f32], y: &mut [f32]) {
        let mut ax = [0f32; MAX_RANK];
        let ax = &mut ax[..self.rank];
        for (v, a_row) in ax.iter_mut().zip(self.a.chunks_exact(x.len())) {
            *v = self.scale * a_row.iter().zip(x).map(|(a, x)| a * x).sum::<f32>();
        }
        for (y, b_row) in y.iter_mut().zip(self.b.chunks_exact(self.rank)) {
            *y += b_row.iter().zip(ax.iter()).map(|(b, v)| b * v).sum::<f32>();
        }
    }
}

/// The largest rank an adapter may have (PEFT's usual ranks are 8 to 64; vLLM's
/// `--max-lora-rank` goes to 512).
pub const MAX_RANK: usize = 512;

/// An adapter: for each layer, the corrections of the projections it targets.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraAdapter {
    /// `[num_layers][Projection::ALL.len()]`.
    layers: Vec<[Option<LoraPair>; 7]>,
}

impl LoraAdapter {
    /// An adapter for `num_layers` layers that changes nothing yet.
    pub fn empty(num_layers: usize) -> LoraAdapter {
        LoraAdapter {
            layers: (0..num_layers).map(|_| Default::default()).collect(),
        }
    }

    /// Sets the correction of projection `p` of layer `l`.
    pub fn set(&mut self, l: usize, p: Projection, pair: LoraPair) {
        self.layers[l][p.index()] = Some(pair);
    }

    /// The correction of projection `p` of layer `l`, if the adapter targets it.
    pub fn get(&self, l: usize, p: Projection) -> Option<&LoraPair> {
        self.layers.get(l)?[p.index()].as_ref()
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Number of (layer, projection) pairs the adapter changes.
    pub fn num_targets(&self) -> usize {
        self.layers.iter().flatten().flatten().count()
    }

    /// Multiplies every correction's scale by `factor` (PEFT's `scale_layer`: 0 turns the
    /// adapter off, 1 leaves it as trained).
    pub fn scale_all(&mut self, factor: f32) {
        for pair in self.layers.iter_mut().flatten().flatten() {
            pair.scale *= factor;
        }
    }

    /// Bytes of its f32 matrices.
    pub fn bytes(&self) -> usize {
        let floats: usize = (self.layers.iter().flatten().flatten())
            .map(|p| p.a.len() + p.b.len())
            .sum();
        floats * 4
    }
}

/// Which rows of a batch run with which adapter: runs of consecutive rows, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AdapterRows(pub Vec<(Range<usize>, AdapterId)>);

impl AdapterRows {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The adapter of each row of `[n, width]`-shaped `y`, or `None`.
    fn adapter_of(&self, row: usize) -> Option<AdapterId> {
        let i = self.0.partition_point(|(r, _)| r.end <= row);
        self.0.get(i).filter(|(r, _)| r.contains(&row)).map(|e| e.1)
    }
}

/// Adds the corrections of projection `p` of layer `l` to `y` (`[n, out]`) for the rows
/// `rows` assigns an adapter; `x` (`[n, in]`) is the projection's input.
pub fn add_corrections(
    pool: &ThreadPool,
    adapters: &[LoraAdapter],
    rows: &AdapterRows,
    (l, p): (usize, Projection),
    x: &[f32],
    y: &mut [f32],
) {
    let targets = |id: AdapterId| adapters[id.0 as usize].get(l, p);
    let Some(out) = (rows.0.iter()).find_map(|&(_, id)| targets(id).map(LoraPair::out_dim)) else {
        return;
    };
    for_each_chunk_mut(pool, y, out, |t, y_row| {
        if let Some(pair) = rows.adapter_of(t).and_then(targets) {
            let width = pair.in_dim();
            pair.add_to(&x[t * width..(t + 1) * width], y_row);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_gets_scale_times_b_a_x() {
        // A = [[1, 2]], B = [[3], [4], [5]], scale 0.5, x = [1, 1]: A x = 3, y += 0.5·3·B.
        let pair = LoraPair {
            rank: 1,
            a: vec![1.0, 2.0],
            b: vec![3.0, 4.0, 5.0],
            scale: 0.5,
        };
        let mut y = vec![1.0; 3];
        pair.add_to(&[1.0, 1.0], &mut y);
        assert_eq!(y, vec![5.5, 7.0, 8.5]);
    }

    #[test]
    fn only_the_rows_of_an_adapter_change() {
        let mut adapter = LoraAdapter::empty(1);
        let pair = LoraPair {
            rank: 1,
            a: vec![1.0],
            b: vec![2.0],
            scale: 1.0,
        };
        adapter.set(0, Projection::Down, pair);
        let rows = AdapterRows(vec![(1..2, AdapterId(0)), (3..4, AdapterId(0))]);
        let x = [1.0, 2.0, 3.0, 4.0];
        let mut y = [0.0; 4];
        let pool = ThreadPool::new(1);
        add_corrections(
            &pool,
            &[adapter.clone()],
            &rows,
            (0, Projection::Down),
            &x,
            &mut y,
        );
        assert_eq!(y, [0.0, 4.0, 0.0, 8.0]);
        // A projection the adapter does not target changes nothing.
        let mut y = [0.0; 4];
        add_corrections(&pool, &[adapter], &rows, (0, Projection::Up), &x, &mut y);
        assert_eq!(y, [0.0; 4]);
    }
}
