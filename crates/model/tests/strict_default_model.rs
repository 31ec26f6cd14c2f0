//! The corruptions of the default model that issue 21 found loading silently (perplexity
//! 9e7 with `llama.block_count` = 1, 166 to 5e7 with a norm retyped from F32 to Q4_0 or
//! BF16), made with the same byte patches, are now refused; the file itself still loads.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use tandem_kernels::DType;
use tandem_model::gguf::GgufError;
use tandem_model::loader::load_gguf_model;
use tandem_model::ModelError;

/// Offset of the first byte after the GGUF string `s` (its u64 length, then its bytes).
fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{s} not found"));
    at + needle.len()
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// Writes `bytes` to a temporary file and loads it.
fn load(bytes: &[u8], tag: &str) -> Result<(), ModelError> {
    let path =
        std::env::temp_dir().join(format!("tandem-strict-{tag}-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let result = load_gguf_model(&path).map(|_| ());
    std::fs::remove_file(&path).unwrap();
    result
}

#[test]
fn the_reported_corruptions_of_the_default_model_are_refused() {
    let path = tandem_model::default_model::test_model_path()
        .expect("the default model is needed; this test does not skip");
    let mut bytes = std::fs::read(&path).unwrap();
    load(&bytes, "unchanged").unwrap();

    // llama.block_count: u32 type id 4, then the value 30.
    let at = after_string(&bytes, "llama.block_count");
    assert_eq!((u32_at(&bytes, at), u32_at(&bytes, at + 4)), (4, 30));
    bytes[at + 4..at + 8].copy_from_slice(&1u32.to_le_bytes());
    let e = load(&bytes, "block-count").unwrap_err();
    assert!(
        matches!(&e, ModelError::LayerCount { key, declared: 1, .. } if key == "llama.block_count"),
        "{e:?}"
    );
    assert!(e.to_string().contains("30 layers (blk.0 to blk.29)"), "{e}");
    bytes[at + 4..at + 8].copy_from_slice(&30u32.to_le_bytes());

    // blk.0.attn_norm.weight's info: 1 dim of 576, then its type (F32).
    let at = after_string(&bytes, "blk.0.attn_norm.weight");
    assert_eq!(u32_at(&bytes, at), 1);
    let type_at = at + 4 + 8;
    assert_eq!(u32_at(&bytes, type_at), DType::F32.ggml_id());
    for dtype in [DType::Q4_0, DType::BF16] {
        bytes[type_at..type_at + 4].copy_from_slice(&dtype.ggml_id().to_le_bytes());
        let e = load(&bytes, "norm-type").unwrap_err();
        assert!(
            matches!(&e, ModelError::Gguf(GgufError::UnaccountedBytes { after, .. })
                if after == "`blk.0.attn_norm.weight`"),
            "{dtype}: {e:?}"
        );
    }
}
