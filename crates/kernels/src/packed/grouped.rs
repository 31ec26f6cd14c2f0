//! Many int8 products with inputs of their own as one job on the pool: a mixture of experts
//! runs each chosen expert's matrices over the rows of its own tokens, and a decode step
//! gives each expert a row or two. As separate jobs, every product pays a start and a wait;
//! here all of them share one.

use std::ops::Range;

use super::{product_groups, PackedRows, QuantizedRows, GROUP_ROWS};
use crate::isa::Isa;
use crate::matmul::{ColumnsMut, SendPtr};
use crate::simd::Kernels;
use crate::ThreadPool;

/// One product of a grouped job: `y = xq · wᵀ` (`y`: `[xq.n_tokens(), w.rows()]`).
#[derive(Debug)]
pub struct GroupedProduct<'a> {
    pub w: PackedRows<'a>,
    pub xq: &'a QuantizedRows,
    pub y: &'a mut [f32],
}

/// Tasks per thread a job is cut into (smaller tasks balance better, larger ones cost less).
const TASKS_PER_THREAD: usize = 4;

/// Runs every product of `products` as one job on `pool` with the kernels of `isa`. Each
/// result is bitwise that of [`super::matmul_quantized`] (the same kernel per group of rows,
/// whatever the task it falls in).
pub fn matmuls_quantized_grouped(isa: Isa, pool: &ThreadPool, products: &mut [GroupedProduct<'_>]) {
    let kernels = Kernels::new(isa).unwrap_or_else(|| {
        panic!("matmuls_quantized_grouped: this CPU cannot run the {isa} kernels")
    });
    for p in products.iter() {
        assert_eq!(
            p.xq.cols(),
            p.w.cols(),
            "grouped product: x must have the matrix's columns"
        );
        assert_eq!(
            p.y.len(),
            p.xq.n_tokens() * p.w.rows,
            "grouped product: y must be [n_tokens, rows]"
        );
    }
    let groups: usize = products.iter().map(|p| p.w.rows.div_ceil(GROUP_ROWS)).sum();
    let per_task = groups
        .div_ceil(TASKS_PER_THREAD * pool.n_threads().max(1))
        .max(1);
    // (product, row groups) of every task, a product's groups cut into runs of `per_task`.
    let mut tasks: Vec<(usize, Range<usize>)> = Vec::new();
    for (i, p) in products.iter().enumerate() {
        let n = p.w.rows.div_ceil(GROUP_ROWS);
        if p.xq.n_tokens() == 0 {
            continue;
        }
        tasks.extend(
            (0..n)
                .step_by(per_task)
                .map(|g| (i, g..(g + per_task).min(n))),
        );
    }
    let bases: Vec<(SendPtr, PackedRows<'_>, &QuantizedRows)> = products
        .iter_mut()
        .map(|p| (SendPtr(p.y.as_mut_ptr()), p.w, p.xq))
        .collect();
    pool.run(tasks.len(), |task| {
        let (i, ref g) = tasks[task];
        let (base, w, xq) = (&bases[i].0, bases[i].1, bases[i].2);
        let n_tokens = xq.n_tokens();
        let columns = g.start * GROUP_ROWS..(g.end * GROUP_ROWS).min(w.rows);
        // SAFETY: each `y` is exclusively borrowed (through `products`) for this whole call;
        // the tasks of one product are disjoint runs of its row groups, so disjoint column
        // ranges of its output, and `ThreadPool::run` calls each task exactly once; every
        // write is bounds-checked against the range and `n_tokens`.
        let mut out = unsafe { ColumnsMut::new(SendPtr(base.0), n_tokens, w.rows, columns) };
        product_groups(&kernels, w, g.clone(), xq, &mut out);
    });
}
