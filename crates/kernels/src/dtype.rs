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
    Q4_K,
    Q6_K,
}

impl DType {
    /// All supported types, for tests and listings.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4_K,
        DType::Q6_K,
    ];

    /// The type for a ggml type id as stored in GGUF tensor infos, if supported.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            8 => DType::Q8_0,
            12 => DType::Q4_K,
            14 => DType::Q6_K,
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
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q6_K => 14,
            DType::BF16 => 30,
        }
    }

    /// Number of elements encoded by one block.
    pub fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => 32,
            DType::Q4_K | DType::Q6_K => 256,
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
            DType::Q4_K => 144,
            DType::Q6_K => 210,
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
            DType::Q4_K => "Q4_K",
            DType::Q6_K => "Q6_K",
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
        assert_eq!(DType::from_ggml_id(6), None); // Q5_0 is not supported
    }

    #[test]
    fn sizes_reject_partial_blocks_and_overflow() {
        assert_eq!(DType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(DType::Q4_K.bytes_for(100), None);
        assert_eq!(DType::F32.bytes_for(usize::MAX), None);
    }
}
