//! The names of ggml's tensor types, including those tandem cannot compute with, so that an
//! error can say which type a file uses and which ones are supported.

use tandem_kernels::DType;

/// ggml's type ids and names (`enum ggml_type` in ggml.h; ids 4, 5 and 31..=33, 36..=38 were
/// removed from ggml and are unnamed).
const GGML_TYPES: [(u32, &str); 34] = [
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
    (40, "NVFP4"),
    (41, "Q1_0"),
];

/// `"IQ2_XXS (ggml type id 16)"`, or `"unknown ggml type id 99"`.
pub(crate) fn describe_type_id(type_id: u32) -> String {
    match GGML_TYPES.iter().find(|(id, _)| *id == type_id) {
        Some((_, name)) => format!("{name} (ggml type id {type_id})"),
        None => format!("unknown ggml type id {type_id}"),
    }
}

/// The tensor types tandem computes with, comma-separated (`"F32, F16, ..."`).
pub(crate) fn supported_types() -> String {
    let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_type_has_its_ggml_name() {
        for d in DType::ALL {
            assert_eq!(
                describe_type_id(d.ggml_id()),
                format!("{} (ggml type id {})", d.name(), d.ggml_id())
            );
        }
    }
}
