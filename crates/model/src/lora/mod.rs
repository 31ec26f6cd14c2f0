//! LoRA adapters applied at run time, per sequence (multi-LoRA serving): a projection `W` of
//! a layer computes `y = W x + s · B (A x)` for the tokens of a sequence that names an
//! adapter, and `y = W x` for every other token of the same batch. `A` is `[r, in]`, `B` is
//! `[out, r]` and `s` the adapter's scale (`alpha / r`, or `alpha / √r` for rsLoRA). The base
//! weights are never changed, so any number of adapters share one copy of the model, and a
//! token's result depends only on its own row and its sequence's adapter (batch invariance
//! holds across adapters).
//!
//! `A` stays in the dtype of the file (f32, f16 or bf16) and runs through the exact float
//! product of the kernels crate, rows of the same adapter together: `T = X Aᵀ` (`[m, r]`),
//! `T *= s`. Then each row adds `T[t, k] · Bᵀ[k]` for `k` in order, `Bᵀ` kept in f32, or in
//! bf16 with [`LoraDtype::Bf16`] (`dtype.rs`). A product of length `r` per output would spend
//! more on its reduction than on the `r` multiply-adds. Both steps are per row and in a fixed order, so the correction of a row is
//! the same whatever rows run beside it. It costs `r · (in + out)` multiply-adds a
//! row against the projection's `in · out`, and `r · (in + out)` weights to read a step.
//! Adapters are read from PEFT's directories (`peft.rs`).

mod dtype;
mod peft;
mod peft_config;

use std::ops::Range;

use tandem_kernels::matmul::{matmul_with, WeightView};
use tandem_kernels::parallel::for_each_chunk_mut;
use tandem_kernels::{DType, Isa, ThreadPool};

use crate::config::ModelConfig;

pub use dtype::LoraDtype;
pub use peft::load_peft_adapter;

use dtype::BRows;

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

    /// `(in, out)` of this projection in a model of `config`.
    pub fn shape(self, config: &ModelConfig) -> (usize, usize) {
        let (h, q, kv, ff) = (
            config.hidden_size,
            config.q_dim(),
            config.kv_dim(),
            config.intermediate_size,
        );
        match self {
            Projection::Q => (h, q),
            Projection::K | Projection::V => (h, kv),
            Projection::O => (q, h),
            Projection::Gate | Projection::Up => (h, ff),
            Projection::Down => (ff, h),
        }
    }
}

/// One projection's low-rank correction, its matrices as stored in the adapter's file.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair {
    rank: usize,
    /// f32, f16 or bf16.
    dtype: DType,
    /// `[rank, in]`: PEFT's `lora_A`.
    a: Vec<u8>,
    /// `[rank, out]`: PEFT's `lora_B` (`[out, rank]`) transposed, in f32 (or bf16, see
    /// [`LoraDtype`]).
    b_t: BRows,
    scale: f32,
}

impl LoraPair {
    /// Bytes of a row of `cols` elements.
    fn row_bytes(&self, cols: usize) -> usize {
        self.dtype.bytes_for(cols).expect("a float dtype")
    }

    /// `A` as `[rank, in]`.
    fn a_view(&self) -> WeightView<'_> {
        let a = WeightView::new(self.dtype, self.rank, self.in_dim(), &self.a);
        a.expect("shapes checked at load")
    }

    fn in_dim(&self) -> usize {
        self.a.len() / self.row_bytes(1) / self.rank
    }

    fn out_dim(&self) -> usize {
        self.b_t.len() / self.rank
    }

    /// `y += s · B (A x)` for the `m` rows of `x` (`[m, in]`) and `y` (`[m, out]`), with `t`
    /// as working memory.
    fn add_to(&self, (isa, pool): (Isa, &ThreadPool), x: &[f32], y: &mut [f32], t: &mut Vec<f32>) {
        let a = self.a_view();
        let (m, r, out) = (x.len() / a.cols, self.rank, self.out_dim());
        t.resize(m * r, 0.0);
        matmul_with(isa, pool, &a, x, t, m);
        t.iter_mut().for_each(|v| *v *= self.scale);
        let t = &*t;
        for_each_chunk_mut(pool, y, out, |row, y_row| {
            for (k, &tk) in t[row * r..(row + 1) * r].iter().enumerate() {
                self.b_t.add_row(isa, y_row, tk, k);
            }
        });
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

    /// Checks that every correction fits its projection in a model of `config`: `A` is
    /// `[r, in]` and `B` `[out, r]` of the projection's sizes, `0 < r <= MAX_RANK`.
    pub fn check(&self, config: &ModelConfig) -> Result<(), String> {
        if self.layers.len() != config.num_layers {
            let n = self.layers.len();
            return Err(format!(
                "an adapter of {n} layers for a model of {} layers",
                config.num_layers
            ));
        }
        for (l, pairs) in self.layers.iter().enumerate() {
            for (p, pair) in Projection::ALL.iter().zip(pairs) {
                let Some(pair) = pair else { continue };
                let (want_in, want_out) = p.shape(config);
                let fits = |n: usize, cols: usize, len: usize| {
                    pair.dtype.bytes_for(cols).and_then(|b| b.checked_mul(n)) == Some(len)
                };
                let moe = config.features.moe.is_some() && p.index() >= Projection::Gate.index();
                let float = matches!(pair.dtype, DType::F32 | DType::F16 | DType::BF16);
                if moe
                    || !float
                    || pair.rank == 0
                    || pair.rank > MAX_RANK
                    || !fits(pair.rank, want_in, pair.a.len())
                    || pair.b_t.len() != pair.rank * want_out
                {
                    return Err(format!(
                        "layer {l} {p:?}: the correction does not fit the model"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Multiplies every correction's scale by `factor` (PEFT's `scale_layer`: 0 turns the
    /// adapter off, 1 leaves it as trained).
    pub fn scale_all(&mut self, factor: f32) {
        for pair in self.layers.iter_mut().flatten().flatten() {
            pair.scale *= factor;
        }
    }

    /// Bytes of its matrices.
    pub fn bytes(&self) -> usize {
        (self.layers.iter().flatten().flatten())
            .map(|p| p.a.len() + p.b_t.bytes())
            .sum()
    }

    /// A hash of everything the adapter computes with (targets, ranks, dtypes, matrices,
    /// scales): equal on two processes that loaded the same adapter with the same build, so
    /// that KV blocks computed under it are recognised elsewhere (`KvBlockFormat`).
    pub fn digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for (l, layer) in self.layers.iter().enumerate() {
            for (p, pair) in layer.iter().enumerate() {
                let Some(pair) = pair else { continue };
                (l, p, pair.rank, format!("{:?}", pair.dtype)).hash(&mut h);
                pair.a.hash(&mut h);
                pair.b_t.hash_into(&mut h);
                pair.scale.to_bits().hash(&mut h);
            }
        }
        h.finish()
    }
}

/// The adapters registered with a model, by id, with their digests; an id is never given to
/// another adapter (cached blocks and requests keyed by it stay unambiguous after a removal).
#[derive(Debug, Default)]
pub struct AdapterSet(Vec<Option<(LoraAdapter, u64)>>);

impl AdapterSet {
    pub fn add(&mut self, adapter: LoraAdapter) -> AdapterId {
        let digest = adapter.digest();
        self.0.push(Some((adapter, digest)));
        AdapterId(self.0.len() as u32 - 1)
    }

    /// Takes adapter `id` out; `None` when it is not registered.
    pub fn remove(&mut self, id: AdapterId) -> Option<LoraAdapter> {
        self.0.get_mut(id.0 as usize)?.take().map(|(a, _)| a)
    }

    pub fn get(&self, id: AdapterId) -> Option<&LoraAdapter> {
        self.0.get(id.0 as usize)?.as_ref().map(|(a, _)| a)
    }

    /// [`LoraAdapter::digest`] of adapter `id`, computed when it was added.
    pub fn digest(&self, id: AdapterId) -> Option<u64> {
        self.0.get(id.0 as usize)?.as_ref().map(|&(_, d)| d)
    }
}

/// Which rows of a batch run with which adapter: runs of consecutive rows, in order (a
/// sequence's rows, or neighbouring sequences' with the same adapter).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AdapterRows(Vec<(Range<usize>, AdapterId)>);

impl AdapterRows {
    /// The runs of `spans` (row range, adapter), merging neighbours of one adapter.
    pub fn new(spans: impl IntoIterator<Item = (Range<usize>, AdapterId)>) -> AdapterRows {
        let mut runs: Vec<(Range<usize>, AdapterId)> = Vec::new();
        for (rows, id) in spans {
            match runs.last_mut() {
                Some((last, last_id)) if *last_id == id && last.end == rows.start => {
                    last.end = rows.end
                }
                _ => runs.push((rows, id)),
            }
        }
        AdapterRows(runs)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether row `row` runs with an adapter.
    pub fn contains(&self, row: usize) -> bool {
        let i = self.0.partition_point(|(rows, _)| rows.end <= row);
        self.0.get(i).is_some_and(|(rows, _)| rows.contains(&row))
    }
}

/// Working memory of the corrections: `[m, r]`.
#[derive(Debug, Default)]
pub struct LoraScratch {
    t: Vec<f32>,
}

/// Adds the corrections of projection `p` of layer `l` to `y` (`[n, out]`) for the rows
/// `rows` assigns an adapter that targets it; `x` (`[n, in]`) is the projection's input.
#[allow(clippy::too_many_arguments)] // the kernels, the adapters, the rows and their buffers
pub fn add_corrections(
    kernels: (Isa, &ThreadPool),
    adapters: &AdapterSet,
    rows: &AdapterRows,
    (l, p): (usize, Projection),
    x: &[f32],
    y: &mut [f32],
    scratch: &mut LoraScratch,
) {
    for (range, id) in &rows.0 {
        let Some(pair) = adapters.get(*id).and_then(|a| a.get(l, p)) else {
            continue;
        };
        let (width_in, width_out) = (pair.in_dim(), pair.out_dim());
        let x_rows = &x[range.start * width_in..range.end * width_in];
        let y_rows = &mut y[range.start * width_out..range.end * width_out];
        pair.add_to(kernels, x_rows, y_rows, &mut scratch.t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn pair(a: &[f32], b: &[f32], scale: f32) -> LoraPair {
        LoraPair {
            rank: 1,
            dtype: DType::F32,
            a: f32_bytes(a),
            b_t: BRows::F32(b.to_vec()),
            scale,
        }
    }

    /// `y` plus the corrections of projection `target` of `adapter` (registered as adapter
    /// 0) for the rows `rows` assigns it, with the kernels of `isa`.
    fn corrected(
        isa: Isa,
        adapter: &LoraAdapter,
        (rows, target): (&AdapterRows, (usize, Projection)),
        x: &[f32],
        mut y: Vec<f32>,
    ) -> Vec<f32> {
        let pool = ThreadPool::new(1);
        let mut adapters = AdapterSet::default();
        adapters.add(adapter.clone());
        let mut scratch = LoraScratch::default();
        add_corrections(
            (isa, &pool),
            &adapters,
            rows,
            target,
            x,
            &mut y,
            &mut scratch,
        );
        y
    }

    #[test]
    fn a_row_gets_scale_times_b_a_x() {
        // A = [[1, 2]], B = [[3], [4], [5]], scale 0.5, x = [1, 1]: A x = 3, y += 0.5·3·B.
        let mut adapter = LoraAdapter::empty(1);
        adapter.set(0, Projection::Up, pair(&[1.0, 2.0], &[3.0, 4.0, 5.0], 0.5));
        let rows = AdapterRows::new([(0..1, AdapterId(0))]);
        let at = (&rows, (0, Projection::Up));
        let y = corrected(Isa::Scalar, &adapter, at, &[1.0, 1.0], vec![1.0; 3]);
        assert_eq!(y, vec![5.5, 7.0, 8.5]);
    }

    #[test]
    fn bf16_holds_values_bf16_can_hold_exactly() {
        // Every value below has at most 8 significant bits: rounding to bf16 keeps it.
        let (a, b) = ([1.5, -2.25, 0.125], [3.0, -4.5, 5.0, 0.75]);
        let mut adapter = LoraAdapter::empty(1);
        adapter.set(0, Projection::Up, pair(&a, &b, 0.5));
        let rounded = adapter.clone().with_dtype(LoraDtype::Bf16);
        let (halved, whole) = (rounded.bytes() * 2, adapter.bytes());
        assert_eq!(halved, whole, "every value in 2 bytes");
        let x = [0.3, -1.7, 2.9, 0.01, 5.0, -0.25];
        let rows = AdapterRows::new([(0..2, AdapterId(0))]);
        let run = |adapter: &LoraAdapter, isa: Isa| {
            let y = corrected(isa, adapter, (&rows, (0, Projection::Up)), &x, vec![0.5; 8]);
            y.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        for isa in Isa::available() {
            assert_eq!(run(&rounded, isa), run(&adapter, isa), "{}", isa.name());
        }
        let mut inexact = LoraAdapter::empty(1);
        inexact.set(0, Projection::Up, pair(&a, &[3.0, -4.5, 5.0, 0.1], 0.5));
        let rounded = inexact.clone().with_dtype(LoraDtype::Bf16);
        let (got, exact) = (run(&rounded, Isa::Scalar), run(&inexact, Isa::Scalar));
        assert_ne!(got, exact, "0.1 rounds");
    }

    #[test]
    fn only_the_rows_of_an_adapter_change() {
        let mut adapter = LoraAdapter::empty(1);
        adapter.set(0, Projection::Down, pair(&[1.0], &[2.0], 1.0));
        let rows = AdapterRows::new([(1..2, AdapterId(0)), (3..4, AdapterId(0))]);
        let x = [1.0, 2.0, 3.0, 4.0];
        let down = (&rows, (0, Projection::Down));
        let y = corrected(Isa::Scalar, &adapter, down, &x, vec![0.0; 4]);
        assert_eq!(y, [0.0, 4.0, 0.0, 8.0]);
        // A projection the adapter does not target changes nothing.
        let up = (&rows, (0, Projection::Up));
        let y = corrected(Isa::Scalar, &adapter, up, &x, vec![0.0; 4]);
        assert_eq!(y, [0.0; 4]);
    }

    #[test]
    fn neighbouring_runs_of_one_adapter_merge() {
        let (a, b) = (AdapterId(0), AdapterId(1));
        let rows = AdapterRows::new([(0..2, a), (2..3, a), (4..5, a), (5..6, b)]);
        assert_eq!(rows.0, vec![(0..3, a), (4..5, a), (5..6, b)]);
        let covered: Vec<usize> = (0..8).filter(|&r| rows.contains(r)).collect();
        assert_eq!(covered, vec![0, 1, 2, 4, 5]);
    }
}
