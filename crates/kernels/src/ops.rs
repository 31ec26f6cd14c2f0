//! Row-wise operations of the transformer: RMSNorm, SwiGLU, RoPE, softmax and friends.
//!
//! Each function works on one row (one token) and has a fixed reduction order, so a row's
//! result never depends on what other rows are in the batch. The element-wise ones a layer
//! runs on every token (RMSNorm, SwiGLU, GeGLU, the residual add) are compiled for the
//! process's [`isa::active`] vector width too (every variant gives the same bits; `*_with`
//! picks one).

use crate::attention::exp_fixed;
use crate::isa;
use crate::isa_dispatch::with_isa;

/// Sums `x` in a fixed order: 8 interleaved partial sums combined pairwise.
/// The order depends only on `x.len()`, which keeps results batch-invariant.
#[inline]
pub fn sum_fixed(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    for (a, v) in acc.iter_mut().zip(tail) {
        *a += v;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// Dot product with the same fixed order as [`sum_fixed`].
#[inline]
pub fn dot_fixed(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_fixed: length mismatch");
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    for i in 0..ta.len() {
        acc[i] += ta[i] * tb[i];
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// `out = x / sqrt(mean(x^2) + eps) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_with(isa::active(), x, weight, eps, out)
}

with_isa! {
    /// [`rms_norm`] with an explicit variant (all give the same bits).
    rms_norm_with => rms_norm_portable(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> ()
}

#[inline(always)]
fn rms_norm_portable(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == weight.len() && x.len() == out.len(),
        "rms_norm: length mismatch"
    );
    let scale = rms_scale(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// RMSNorm's factor `1 / sqrt(mean(x^2) + eps)`: element `i` of the normed row is then
/// `x[i] * scale * weight[i]` (in that order), as [`rms_norm`] computes it.
#[inline]
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mean_sq = dot_fixed(x, x) / x.len() as f32;
    1.0 / (mean_sq + eps).sqrt()
}

/// In-place RMSNorm.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    rms_norm_inplace_with(isa::active(), x, weight, eps)
}

with_isa! {
    /// [`rms_norm_inplace`] with an explicit variant (all give the same bits).
    rms_norm_inplace_with => rms_norm_inplace_portable(x: &mut [f32], weight: &[f32], eps: f32) -> ()
}

#[inline(always)]
fn rms_norm_inplace_portable(x: &mut [f32], weight: &[f32], eps: f32) {
    assert_eq!(x.len(), weight.len(), "rms_norm_inplace: length mismatch");
    let scale = rms_scale(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = *v * scale * w;
    }
}

/// SwiGLU: `gate[i] = silu(gate[i]) * up[i]`, in place in `gate`, with
/// `silu(x) = x / (1 + e^(-x))`.
///
/// `e^x` is [`exp_fixed`] (about 2 ulp; plain multiplications and additions, no libm call), so
/// the loop vectorizes and gives the same bits everywhere.
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    swiglu_inplace_with(isa::active(), gate, up)
}

with_isa! {
    /// [`swiglu_inplace`] with an explicit variant (all give the same bits).
    swiglu_inplace_with => swiglu_portable(gate: &mut [f32], up: &[f32]) -> ()
}

#[inline(always)]
fn swiglu_portable(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: length mismatch");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_fixed(-*g)) * u;
    }
}

/// GeGLU with the tanh approximation of GELU (transformers' `gelu_pytorch_tanh`), in place in
/// `gate`: `gate[i] = 0.5 · g · (1 + tanh(y)) · up[i]`, `y = sqrt(2/π) · (g + 0.044715 · g³)`.
///
/// Computed as `g / (1 + e^(-2y)) · up[i]` (the same function: `1 + tanh(y) = 2 / (1 +
/// e^(-2y))`), with `e^x` by [`exp_fixed`] as in [`swiglu_inplace`]: the loop vectorizes
/// instead of calling libm's `tanhf` per element, gives the same bits everywhere, and
/// loses nothing to cancellation where `tanh(y)` nears −1.
pub fn geglu_tanh_inplace(gate: &mut [f32], up: &[f32]) {
    geglu_tanh_inplace_with(isa::active(), gate, up)
}

with_isa! {
    /// [`geglu_tanh_inplace`] with an explicit variant (all give the same bits).
    geglu_tanh_inplace_with => geglu_tanh_portable(gate: &mut [f32], up: &[f32]) -> ()
}

#[inline(always)]
fn geglu_tanh_portable(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: length mismatch");
    const TWO_SQRT_2_OVER_PI: f32 = 1.595_769_2;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let two_y = TWO_SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = x / (1.0 + exp_fixed(-two_y)) * u;
    }
}

/// Soft-capping: `x[i] = cap · tanh(x[i] / cap)`.
pub fn softcap_inplace(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = (*v / cap).tanh() * cap;
    }
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    add_inplace_with(isa::active(), x, y)
}

with_isa! {
    /// [`add_inplace`] with an explicit variant (all give the same bits).
    add_inplace_with => add_portable(x: &mut [f32], y: &[f32]) -> ()
}

#[inline(always)]
fn add_portable(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add_inplace: length mismatch");
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `x += a · y`, a multiply then an add per element (never fused), so every variant gives
/// the same bits.
pub fn add_scaled_inplace(x: &mut [f32], a: f32, y: &[f32]) {
    add_scaled_inplace_with(isa::active(), x, a, y)
}

with_isa! {
    /// [`add_scaled_inplace`] with an explicit variant (all give the same bits).
    add_scaled_inplace_with => add_scaled_portable(x: &mut [f32], a: f32, y: &[f32]) -> ()
}

#[inline(always)]
fn add_scaled_portable(x: &mut [f32], a: f32, y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add_scaled_inplace: length mismatch");
    for (v, &w) in x.iter_mut().zip(y) {
        *v += a * w;
    }
}

/// `x[i] += a * y[i]` with `y` given as bf16 bit patterns, widened exactly: bitwise
/// [`add_scaled_inplace`] of the widened values, in every variant.
pub fn add_scaled_bf16_inplace(x: &mut [f32], a: f32, y: &[u16]) {
    add_scaled_bf16_inplace_with(isa::active(), x, a, y)
}

with_isa! {
    /// [`add_scaled_bf16_inplace`] with an explicit variant (all give the same bits).
    add_scaled_bf16_inplace_with => add_scaled_bf16_portable(x: &mut [f32], a: f32, y: &[u16]) -> ()
}

#[inline(always)]
fn add_scaled_bf16_portable(x: &mut [f32], a: f32, y: &[u16]) {
    assert_eq!(x.len(), y.len(), "add_scaled_bf16_inplace: length mismatch");
    for (v, &w) in x.iter_mut().zip(y) {
        *v += a * f32::from_bits(u32::from(w) << 16);
    }
}

/// Rotates one head in place by the angles `position * inv_freq[i]`.
///
/// `neox == true` pairs dimension `i` with `i + d/2` (HF `rotate_half`);
/// otherwise dimension `2i` is paired with `2i + 1`. `cos`/`sin`: `[d / 2]`.
pub fn rope_head(head: &mut [f32], cos: &[f32], sin: &[f32], neox: bool) {
    let half = head.len() / 2;
    assert!(
        cos.len() == half && sin.len() == half,
        "rope: table length mismatch"
    );
    for i in 0..half {
        let (a, b) = if neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos[i] - x1 * sin[i];
        head[b] = x0 * sin[i] + x1 * cos[i];
    }
}

/// Log-softmax of one row, computed in f64 for accuracy: `out[i] = x[i] - logsumexp(x)`.
/// Returns `None` when the row holds a NaN or infinite value.
pub fn log_softmax(x: &[f32], out: &mut [f32]) -> Option<()> {
    assert_eq!(x.len(), out.len(), "log_softmax: length mismatch");
    let lse = row_log_sum_exp(x)?;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = log_prob(v, lse);
    }
    Some(())
}

/// `logsumexp(x)` of a row of logits as [`log_softmax`] forms it (every entry's logprob is
/// then [`log_prob`]`(x_i, lse)`); `None` when the row is empty or not finite.
pub fn row_log_sum_exp(x: &[f32]) -> Option<f64> {
    let max = crate::row_max::max_finite(x)?;
    Some(log_sum_exp(max, crate::exp_sum::exp_sum(x, max)))
}

/// `logsumexp(x)` of a row from its maximum and `Σ exp(x_i − max)` ([`crate::exp_sum`]).
pub fn log_sum_exp(max: f32, exp_sum: f64) -> f64 {
    max as f64 + exp_sum.ln()
}

/// The log-probability of a logit `v` in a row whose [`log_sum_exp`] is `lse`: how
/// [`log_softmax`] forms every entry (a device that computes the row's sums where the
/// logits are finishes with this, for the same bits).
pub fn log_prob(v: f32, lse: f64) -> f32 {
    (v as f64 - lse) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_sums_match_f64() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let exact: f64 = x.iter().map(|&v| v as f64).sum();
        assert!((sum_fixed(&x) as f64 - exact).abs() < 1e-5);
        let d: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        assert!((dot_fixed(&x, &x) as f64 - d).abs() < 1e-5);
    }

    #[test]
    fn rms_norm_has_unit_rms() {
        let x: Vec<f32> = (0..64).map(|i| i as f32 - 20.0).collect();
        let w = vec![1.0; 64];
        let mut out = vec![0.0; 64];
        rms_norm(&x, &w, 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 64.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-5);
    }

    #[test]
    fn swiglu_matches_its_definition() {
        let mut x = -120.0f32;
        while x < 120.0 {
            let mut gate = [x];
            swiglu_inplace(&mut gate, &[1.5]);
            let xd = f64::from(x);
            let want = xd / (1.0 + (-xd).exp()) * 1.5;
            // Relative to the result, or absolute where it underflows towards 0.
            let tol = 1e-6 * want.abs().max(1e-30);
            assert!(
                (f64::from(gate[0]) - want).abs() <= tol.max(1e-35),
                "silu({x}) * 1.5 = {}, want {want}",
                gate[0]
            );
            x += 0.0731;
        }
    }

    #[test]
    fn geglu_matches_its_definition_with_tanh() {
        let mut x = -30.0f32;
        while x < 30.0 {
            let mut gate = [x];
            geglu_tanh_inplace(&mut gate, &[1.5]);
            let xd = f64::from(x);
            let y = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044_715 * xd * xd * xd);
            // 0.5 x (1 + tanh y) = x / (1 + e^(-2y)); the second form keeps its precision
            // where tanh y rounds to -1 in f64 too.
            let want = xd / (1.0 + (-2.0 * y).exp()) * 1.5;
            if x.abs() < 3.0 {
                let by_tanh = 0.5 * xd * (1.0 + y.tanh()) * 1.5;
                assert!((by_tanh - want).abs() <= 1e-12, "{x}: {by_tanh} vs {want}");
            }
            // Relative to the result, widened by the f32 rounding of `y` where the result
            // is e^(2y) small (its relative error there is 2|y| times `y`'s); absolute where
            // it underflows towards 0.
            let tol = 1e-6 * want.abs() * (1.0 + 2.0 * y.abs());
            assert!(
                (f64::from(gate[0]) - want).abs() <= tol.max(1e-35),
                "gelu_tanh({x}) * 1.5 = {}, want {want}",
                gate[0]
            );
            x += 0.0173;
        }
        // Far out: x, and next to nothing (e^x's argument is clamped at 88, so the negative
        // side gives x / (1 + e^88)).
        let mut far = [1e4, -1e4, 0.0];
        geglu_tanh_inplace(&mut far, &[1.0, 1.0, 1.0]);
        assert_eq!(far[0], 1e4);
        assert!(far[1] <= 0.0 && far[1] > -1e-30, "{}", far[1]);
        assert_eq!(far[2], 0.0);
    }

    #[test]
    fn rope_styles_rotate_the_right_pairs() {
        let (cos, sin) = ([0.0f32, 1.0], [1.0f32, 0.0]); // pair 0 by 90 degrees, pair 1 fixed
        let mut neox = [1.0, 2.0, 3.0, 4.0];
        rope_head(&mut neox, &cos, &sin, true);
        assert_eq!(neox, [-3.0, 2.0, 1.0, 4.0]);
        let mut inter = [1.0, 2.0, 3.0, 4.0];
        rope_head(&mut inter, &cos, &sin, false);
        assert_eq!(inter, [-2.0, 1.0, 3.0, 4.0]);
    }

    #[test]
    fn log_softmax_normalises_and_rejects_nan() {
        let x = [1.0f32, 2.0, 3.0];
        let mut out = [0.0; 3];
        log_softmax(&x, &mut out).expect("finite row");
        let total: f64 = out.iter().map(|&v| (v as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(log_softmax(&[1.0, f32::NAN, 0.0], &mut out).is_none());
    }
}
