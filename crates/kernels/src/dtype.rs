//! Element types of weight tensors: the float formats and ggml's quantized block formats.
//!
//! A quantized tensor row is a sequence of fixed-size blocks; each block encodes
//! `block_len()` consecutive elements in `block_bytes()` bytes.

/// The tensor element types tandem can load and compute with (ggml names).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
}

impl DType {
    /// All supported types, for tests and listings.
    pub const ALL: [DType; 15] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
    ];

    /// The type for a ggml type id as stored in GGUF tensor infos, if supported.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            8 => DType::Q8_0,
            10 => DType::Q2_K,
            11 => DType::Q3_K,
            12 => DType::Q4_K,
            13 => DType::Q5_K,
            14 => DType::Q6_K,
            20 => DType::IQ4_NL,
            23 => DType::IQ4_XS,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// The ggml type id of this type.
    pub fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::IQ4_NL => 20,
            DType::IQ4_XS => 23,
            DType::BF16 => 30,
        }
    }

    /// Number of elements encoded by one block.
    pub fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4_NL => {
                32
            }
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => {
                256
            }
        }
    }

    /// Number of bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::IQ4_NL => 18,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::IQ4_XS => 136,
        }
    }

    /// Bytes taken by `n_elements` elements, or `None` when `n_elements` is not a whole
    /// number of blocks or the size overflows.
    pub fn bytes_for(self, n_elements: usize) -> Option<usize> {
        if !n_elements.is_multiple_of(self.block_len()) {
            return None;
        }
        (n_elements / self.block_len()).checked_mul(self.block_bytes())
    }

    /// Whether the type is a quantized block format.
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// The name used by ggml and llama.cpp (`"Q4_K"`, `"F16"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q2_K => "Q2_K",
            DType::Q3_K => "Q3_K",
            DType::Q4_K => "Q4_K",
            DType::Q5_K => "Q5_K",
            DType::Q6_K => "Q6_K",
            DType::IQ4_NL => "IQ4_NL",
            DType::IQ4_XS => "IQ4_XS",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_ggml_id(t.ggml_id()), Some(t));
        }
        assert_eq!(DType::from_ggml_id(16), None); // IQ2_XXS is not supported
    }

    #[test]
    fn sizes_reject_partial_blocks_and_overflow() {
        assert_eq!(DType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(DType::Q4_K.bytes_for(100), None);
        assert_eq!(DType::F32.bytes_for(usize::MAX), None);
    }
}
