//! Quantized block formats: scalar reference dequantization and dot products.
//! (Being written: see the kernels work item.)

use crate::DType;

/// Dequantizes `dst.len()` elements stored in `src` as `dtype`.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let _ = (dtype, src, dst);
    unimplemented!("kernels work item")
}
