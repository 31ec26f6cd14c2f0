//! The 8-bit format of a KV cache's rows ([`crate::attention::Q8Rows`]): every group of
//! [`Q8_GROUP`] consecutive elements shares one f32 scale, `max |x| / 127`, and each element
//! is stored as the integer nearest to `x / scale` (ties away from zero), in `−127..=127`.
//! Reading an element back is `code · scale`, rounded once to f32.
//!
//! A group is exact up to half a step of its scale: each element is off by at most
//! `max |x| / 254` (plus the rounding of the scale's product; for groups so small that the
//! scale is subnormal, `max |x| < 127 · f32::MIN_POSITIVE`, the bound is absolute instead). A group holding an infinity
//! reads back as NaN throughout (its scale is infinite), as a row of an f16 cache holds an
//! infinity where a value exceeds f16's range; NaN elements read back as 0.

use crate::attention::Q8_GROUP;

/// Quantizes `src` into `codes` (one per element) and `scales` (one per group of
/// [`Q8_GROUP`]).
///
/// Panics unless `src.len()` is a multiple of [`Q8_GROUP`], `codes` is as long and `scales`
/// has one entry per group (caller bugs: the KV store checks its rows' lengths once).
pub fn quantize_q8(src: &[f32], codes: &mut [i8], scales: &mut [f32]) {
    assert!(
        src.len().is_multiple_of(Q8_GROUP)
            && codes.len() == src.len()
            && scales.len() == src.len() / Q8_GROUP,
        "quantize_q8: {} values, {} codes, {} scales",
        src.len(),
        codes.len(),
        scales.len()
    );
    let groups = src
        .chunks_exact(Q8_GROUP)
        .zip(codes.chunks_exact_mut(Q8_GROUP));
    for ((x, q), scale) in groups.zip(scales.iter_mut()) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        *scale = amax / 127.0;
        for (q, &v) in q.iter_mut().zip(x) {
            *q = if *scale > 0.0 {
                round_code(v / *scale)
            } else {
                0
            };
        }
    }
}

/// `x` rounded to the nearest integer, ties away from zero (as [`f32::round`]), clamped to
/// `−127..=127`; NaN gives 0. Without `roundf`'s library call, which cost a call per element
/// of every key and value a q8 cache writes: `x − trunc(x)` is exact once `x` is clamped.
#[inline(always)]
fn round_code(x: f32) -> i8 {
    // Clamped first (NaN stays NaN); `as` truncates toward zero and maps NaN to 0.
    let x = x.clamp(-128.0, 128.0);
    let t = x as i32;
    let frac = x - t as f32;
    let r = t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5);
    r.clamp(-127, 127) as i8
}

/// The dequantized values of `codes` with `scales` (as the attention kernels read them).
pub fn dequantize_q8(codes: &[i8], scales: &[f32]) -> Vec<f32> {
    codes
        .iter()
        .enumerate()
        .map(|(i, &c)| f32::from(c) * scales[i / Q8_GROUP])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(x: &[f32]) -> Vec<f32> {
        let mut codes = vec![0i8; x.len()];
        let mut scales = vec![0.0f32; x.len() / Q8_GROUP];
        quantize_q8(x, &mut codes, &mut scales);
        dequantize_q8(&codes, &scales)
    }

    #[test]
    fn every_element_is_within_half_a_step_of_its_group() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * if i < 32 { 1e-3 } else { 7.5 })
            .collect();
        let y = round_trip(&x);
        for (g, (x, y)) in x.chunks(Q8_GROUP).zip(y.chunks(Q8_GROUP)).enumerate() {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let step = amax / 127.0;
            for (a, b) in x.iter().zip(y) {
                assert!(
                    (a - b).abs() <= step * 0.5 * (1.0 + 1e-5),
                    "group {g}: {a} -> {b}"
                );
            }
            // The largest magnitude comes back (to the scale's rounding).
            let top = x
                .iter()
                .zip(y)
                .find(|(a, _)| a.abs() == amax)
                .map(|(_, b)| b.abs());
            assert!((top.unwrap() - amax).abs() <= amax * 1e-6);
        }
    }

    #[test]
    fn codes_round_half_away_from_zero_as_f32_round_does() {
        let mut x = -140.0f32;
        while x < 140.0 {
            for v in [x, x.next_up(), x.next_down()] {
                let want = v.round().clamp(-127.0, 127.0) as i8;
                assert_eq!(round_code(v), want, "{v}");
            }
            x += 0.25;
        }
        assert_eq!(round_code(0.49999997), 0);
        assert_eq!(round_code(-0.5), -1);
        assert_eq!(round_code(f32::NAN), 0);
        assert_eq!(round_code(f32::INFINITY), 127);
        assert_eq!(round_code(f32::NEG_INFINITY), -127);
        assert_eq!(round_code(3e9), 127);
    }

    #[test]
    fn zeros_infinities_and_nan_are_defined() {
        assert!(round_trip(&[0.0; 32]).iter().all(|&v| v == 0.0));
        let mut x = [1.0f32; 32];
        x[3] = f32::INFINITY;
        assert!(round_trip(&x).iter().all(|v| v.is_nan()));
        let mut x = [2.0f32; 32];
        x[5] = f32::NAN;
        let y = round_trip(&x);
        assert_eq!(y[5], 0.0);
        assert!(y
            .iter()
            .enumerate()
            .all(|(i, &v)| i == 5 || (v - 2.0).abs() <= 2e-6));
    }
}
