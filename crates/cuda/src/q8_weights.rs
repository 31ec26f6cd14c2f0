//! Q8_0 matrices for the device (`--cuda-weights q8_0`; kernels/q8.cu): every row cut into
//! blocks of 32 values, each stored as 32 int8 codes and one f32 scale, `d = max|x| / 127`
//! and `q = round(x / d)`, so a weight is `q * d` within `d / 2` of its value. The weights
//! are quantized from whatever the model file holds, dequantized to f32 first.

/// Values per block.
pub(crate) const Q8_BLOCK: usize = 32;

/// Appends the codes and scales of `values` (rows of `cols` values, `cols` a multiple of
/// [`Q8_BLOCK`]): codes row-major, one byte each; scales one per block, row-major.
pub(crate) fn quantize(values: &[f32], codes: &mut Vec<u8>, scales: &mut Vec<f32>) {
    for block in values.chunks(Q8_BLOCK) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        scales.push(d);
        for &v in block {
            let q = if d > 0.0 {
                (v / d).round().clamp(-127.0, 127.0) as i8
            } else {
                0
            };
            codes.push(q as u8);
        }
    }
}

/// The weight a code and its block's scale stand for, as the kernels compute it.
#[cfg(test)]
pub(crate) fn dequantize(code: u8, d: f32) -> f32 {
    f32::from(code as i8) * d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_within_half_a_step_and_zeros_stay_zero() {
        let values: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let mut row = values.clone();
        row[32..64].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
        let (mut codes, mut scales) = (Vec::new(), Vec::new());
        quantize(&row, &mut codes, &mut scales);
        assert_eq!((codes.len(), scales.len()), (96, 3));
        assert_eq!(scales[1], 0.0);
        for (i, (&v, &c)) in row.iter().zip(&codes).enumerate() {
            let d = scales[i / Q8_BLOCK];
            let back = dequantize(c, d);
            assert!((back - v).abs() <= d / 2.0 * 1.0001, "{i}: {v} -> {back}");
        }
        // The largest magnitude of a block maps to ±127 exactly.
        let top = (0..32)
            .max_by(|&a, &b| row[a].abs().total_cmp(&row[b].abs()))
            .unwrap();
        assert_eq!((codes[top] as i8).unsigned_abs(), 127);
    }
}
