//! GGUF (v2, v3) reading. (Being written: see the GGUF work item.)

/// Errors from reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("bad magic: not a GGUF file")]
    BadMagic,
}
