//! Q4_1 matrices for the device (`--cuda-weights q4_1`; kernels/q4.cu): every row cut into
//! blocks of 32 values, each stored as 32 unsigned 4-bit codes `q`, an f16 scale `d` and an
//! f16 minimum `m`; the weight is `q * d + m`. The blocks are quantized by the CPU's own
//! Q4_1 quantizer (`tandem_kernels::quant`, ggml's reference rounding: `d = (max − min) /
//! 15`, `m = min`, `q = round((x − min) / d)`), so the device holds the CPU's Q4_1 weights
//! value for value; only the layout differs: a ggml block's 4 bytes of `d, m` and 16 bytes of
//! codes go to two arrays, so that the kernels load a block's codes with one aligned 16-byte
//! load. The weights are quantized from whatever the model file holds, dequantized to f32
//! first; blocks that ggml's quantizer wrote come back unchanged (the default model's, byte
//! for byte: tested below).

use tandem_kernels::quant::quantize_row;
use tandem_kernels::DType;

/// Values per block.
pub(crate) const Q4_BLOCK: usize = 32;
/// Bytes of one block's codes.
pub(crate) const Q4_CODE_BYTES: usize = Q4_BLOCK / 2;
/// Bytes of one ggml Q4_1 block: f16 `d`, f16 `m`, the codes.
const GGML_BLOCK_BYTES: usize = 4 + Q4_CODE_BYTES;

/// Appends the codes and scales of `values` (rows of a multiple of [`Q4_BLOCK`] values):
/// per block, 16 code bytes (byte `t` holds value `t` in its low nibble and value `t + 16`
/// in its high nibble, ggml's order), and one u32 holding `d` (f16 bits, low half) and `m`
/// (f16 bits, high half); both block-major, in row order.
pub(crate) fn quantize(values: &[f32], codes: &mut Vec<u8>, scales: &mut Vec<u32>) {
    let mut blocks = vec![0u8; values.len() / Q4_BLOCK * GGML_BLOCK_BYTES];
    quantize_row(DType::Q4_1, values, &mut blocks);
    for b in blocks.chunks_exact(GGML_BLOCK_BYTES) {
        scales.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        codes.extend_from_slice(&b[4..]);
    }
}

/// The weights the codes and scales stand for, dequantized by the CPU's Q4_1 code from the
/// ggml blocks they came from: the reference the kernels must match bitwise.
#[cfg(test)]
pub(crate) fn dequantize(codes: &[u8], scales: &[u32]) -> Vec<f32> {
    let mut blocks = Vec::with_capacity(scales.len() * GGML_BLOCK_BYTES);
    for (s, c) in scales.iter().zip(codes.chunks_exact(Q4_CODE_BYTES)) {
        blocks.extend_from_slice(&s.to_le_bytes());
        blocks.extend_from_slice(c);
    }
    let mut out = vec![0.0f32; scales.len() * Q4_BLOCK];
    tandem_kernels::quant::dequantize_row(DType::Q4_1, &blocks, &mut out);
    out
}

/// The f32 values of a block's `d` and `m`.
#[cfg(test)]
pub(crate) fn scale_and_min(scale: u32) -> (f32, f32) {
    let half = |bits: u32| half::f16::from_bits(bits as u16).to_f32();
    (half(scale & 0xffff), half(scale >> 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_within_half_a_step_and_flat_blocks_are_kept() {
        let mut row: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0 + 0.3)
            .collect();
        row[32..64].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
        row[64..96].iter_mut().for_each(|v| *v = -1.375); // a constant block (f16-exact)
        let (mut codes, mut scales) = (Vec::new(), Vec::new());
        quantize(&row, &mut codes, &mut scales);
        assert_eq!((codes.len(), scales.len()), (64, 4));
        let back = dequantize(&codes, &scales);
        assert_eq!(&back[32..64], &[0.0; 32]);
        assert_eq!(&back[64..96], &[-1.375; 32]);
        assert_eq!(scales[1], 0, "zero block: d = m = 0");
        for (b, block) in row.chunks(Q4_BLOCK).enumerate() {
            let (d, m) = scale_and_min(scales[b]);
            // The exact step and minimum; `d` and `m` are stored as f16 (11 significant
            // bits), which moves a weight by at most 15 · |Δd| + |Δm|.
            let min = block.iter().fold(f32::INFINITY, |a, &v| a.min(v));
            let max = block.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let step = (max - min) / 15.0;
            let f16_slack = 15.0 * (d - step).abs() + (m - min).abs();
            assert!(f16_slack <= (15.0 * step + min.abs()) / 2048.0 + 1e-7);
            for (i, &v) in block.iter().enumerate() {
                let w = back[b * Q4_BLOCK + i];
                assert!(
                    (w - v).abs() <= step / 2.0 + f16_slack + 1e-6,
                    "block {b} [{i}]: {v} -> {w} (step {step})"
                );
            }
            // The block's minimum and maximum take codes 0 and 15.
            if step > 0.0 {
                let code = |i: usize| {
                    let byte = codes[b * Q4_CODE_BYTES + i % 16];
                    if i < 16 {
                        byte & 15
                    } else {
                        byte >> 4
                    }
                };
                let (lo, hi) = (0..Q4_BLOCK).fold((0, 0), |(lo, hi), i| {
                    let pick = |a: usize, better: bool| if better { i } else { a };
                    (
                        pick(lo, block[i] < block[lo]),
                        pick(hi, block[i] > block[hi]),
                    )
                });
                assert_eq!((code(lo), code(hi)), (0, 15), "block {b}");
            }
        }
    }

    /// Quantizing the dequantized weights of Q4_1 blocks gives back the same weights.
    #[test]
    fn requantizing_q4_1_weights_gives_them_back() {
        let values: Vec<f32> = (0..32 * 512)
            .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.45) * 0.08 * (1.0 + (i % 5) as f32))
            .collect();
        let (mut codes, mut scales) = (Vec::new(), Vec::new());
        quantize(&values, &mut codes, &mut scales);
        let file_weights = dequantize(&codes, &scales);
        let (mut codes2, mut scales2) = (Vec::new(), Vec::new());
        quantize(&file_weights, &mut codes2, &mut scales2);
        assert_eq!(dequantize(&codes2, &scales2), file_weights);
    }

    /// The default model stores its layers' matrices in Q4_1 (ggml's quantizer): under
    /// `--cuda-weights q4_1` they reach the device as the file's own blocks, byte for byte.
    #[test]
    fn the_default_models_q4_1_blocks_come_back_byte_for_byte() {
        let path = tandem_model::default_model::test_model_path()
            .expect("the default model is needed; this test does not skip");
        let loaded = tandem_model::loader::load_model(&path).expect("loading the default model");
        let tensors = &loaded.host.tensors;
        let (mut matrices, mut blocks, mut differing) = (0, 0, 0);
        for name in tensors.names() {
            let t = tensors.get(name).expect("a listed tensor");
            if t.dtype != DType::Q4_1 {
                continue;
            }
            let mut values = vec![0.0f32; t.shape.iter().product()];
            tandem_kernels::quant::dequantize_row(DType::Q4_1, t.data, &mut values);
            let (mut codes, mut scales) = (Vec::new(), Vec::new());
            quantize(&values, &mut codes, &mut scales);
            for (b, file) in t.data.chunks_exact(GGML_BLOCK_BYTES).enumerate() {
                let ours = &codes[b * Q4_CODE_BYTES..(b + 1) * Q4_CODE_BYTES];
                if file[..4] != scales[b].to_le_bytes() || &file[4..] != ours {
                    differing += 1;
                }
                blocks += 1;
            }
            matrices += 1;
        }
        assert_eq!(matrices, 30 * 7, "q, k, v, o, gate, up, down of 30 layers");
        assert_eq!(differing, 0, "blocks of {blocks} changed by requantization");
    }
}
