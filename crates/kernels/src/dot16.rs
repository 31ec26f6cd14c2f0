//! The scalar reference of the matmul's f32 dot product, with its fixed reduction order.
//!
//! `w · x` is accumulated in [`LANES`] independent f32 accumulators over the column index
//! (column `c` goes to accumulator `c % LANES`, in increasing `c`, each step a rounded
//! multiplication followed by a rounded addition — never a fused multiply-add), then the
//! accumulators are summed by the fixed pairwise tree of [`tree_sum`]. The order depends only
//! on the row length, so a row's result never depends on the batch or the thread split.
//!
//! The SIMD variants in [`crate::simd`] perform exactly these operations (one 16-lane
//! register, or two 8-lane ones, hold the accumulators) and are bitwise equal to this code.

/// Independent accumulators of the f32 dot product (fixed: part of the numeric contract).
pub const LANES: usize = 16;

/// `w · x` in the fixed reduction order of the module docs; `w.len() == x.len()`.
#[inline(never)]
pub(crate) fn dot_1(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot_1: length mismatch");
    let mut acc = [0.0f32; LANES];
    for (wc, xc) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        mac(&mut acc, wc, xc);
    }
    mac_tail(&mut acc, w, x);
    tree_sum(&acc)
}

/// `[w[0]·x, …, w[3]·x]`, each row bitwise equal to [`dot_1`] (same operations per row); the
/// activation chunk is loaded once for the four rows. Every `w[i]` has `x.len()` elements.
#[inline(never)]
pub(crate) fn dot_4(w: [&[f32]; 4], x: &[f32]) -> [f32; 4] {
    assert!(
        w.iter().all(|r| r.len() == x.len()),
        "dot_4: length mismatch"
    );
    let mut acc = [[0.0f32; LANES]; 4];
    let rows = w[0].chunks_exact(LANES).zip(w[1].chunks_exact(LANES));
    let rows = rows
        .zip(w[2].chunks_exact(LANES))
        .zip(w[3].chunks_exact(LANES));
    for ((((w0, w1), w2), w3), xc) in rows.zip(x.chunks_exact(LANES)) {
        mac(&mut acc[0], w0, xc);
        mac(&mut acc[1], w1, xc);
        mac(&mut acc[2], w2, xc);
        mac(&mut acc[3], w3, xc);
    }
    for (acc, w) in acc.iter_mut().zip(w) {
        mac_tail(acc, w, x);
    }
    acc.map(|a| tree_sum(&a))
}

/// `acc[l] += w[l] · x[l]` for the `LANES` lanes (`w`, `x` are one chunk of `LANES`).
#[inline(always)]
fn mac(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    let (w, x) = (&w[..LANES], &x[..LANES]);
    for l in 0..LANES {
        acc[l] += w[l] * x[l];
    }
}

/// The last `len % LANES` columns: column `full + l` goes to lane `l`.
#[inline(always)]
pub(crate) fn mac_tail(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    let full = x.len() - x.len() % LANES;
    for ((a, &wv), &xv) in acc.iter_mut().zip(&w[full..]).zip(&x[full..]) {
        *a += wv * xv;
    }
}

/// Pairwise sum of the lanes in a fixed order: halves added lane-wise until one is left
/// (`v[l] += v[l + 8]`, then `+ v[l + 4]`, `+ v[l + 2]`, `+ v[l + 1]`).
///
/// Not inlined on purpose: when LLVM sees this tree next to the accumulation loop, its SLP
/// vectorizer splits the accumulators into 2-lane vectors and the loop runs at half width.
#[inline(never)]
pub(crate) fn tree_sum(a: &[f32; LANES]) -> f32 {
    let mut v = *a;
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The multi-row kernel must give each row the bits of the single-row kernel, so the row
    /// grouping (which depends on the chunking) never changes a result.
    #[test]
    fn grouped_rows_match_single_rows_bitwise() {
        for n in [1, 15, 16, 17, 64, 100, 1536] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 1000) as f32 / 337.0 - 1.3)
                .collect();
            let w: Vec<Vec<f32>> = (0..4)
                .map(|r| {
                    (0..n)
                        .map(|i| ((i * 31 + r * 17) % 101) as f32 / 7.0 - 6.9)
                        .collect()
                })
                .collect();
            let grouped = dot_4(std::array::from_fn(|r| &w[r][..]), &x);
            for (r, g) in grouped.iter().enumerate() {
                let single = dot_1(&w[r], &x);
                assert_eq!(g.to_bits(), single.to_bits(), "n={n} row {r}");
                let exact: f64 = w[r]
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let mag: f64 = w[r]
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from((a * b).abs()))
                    .sum();
                assert!(
                    (f64::from(single) - exact).abs() <= 1e-6 * mag,
                    "n={n}: {single} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn tree_sum_adds_in_the_documented_order() {
        let a: [f32; LANES] = std::array::from_fn(|i| (i as f32 + 1.0) * 0.1);
        let mut h = a;
        for width in [8, 4, 2, 1] {
            for l in 0..width {
                h[l] += h[l + width];
            }
        }
        assert_eq!(tree_sum(&a).to_bits(), h[0].to_bits());
    }
}
