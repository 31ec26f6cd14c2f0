//! Malformed GGUF input: each broken rule yields its specific error, and nothing panics.

mod gguf_corpus;

use gguf_corpus::{all_cases, small_valid, Enc};
use tandem_model::gguf::{GgufError, GgufFile};

#[test]
fn every_malformed_case_gives_its_specific_error() {
    let cases = all_cases();
    assert_eq!(
        cases.len(),
        37,
        "corpus size changed: update this count deliberately"
    );
    let mut failures = Vec::new();
    for case in cases {
        match GgufFile::parse_bytes(&case.bytes) {
            Err(e) if e == case.expected => {}
            other => failures.push(format!(
                "{}: expected {:?}, got {:?}",
                case.name,
                case.expected,
                other.map(|p| p.0)
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn small_valid_file_parses() {
    let bytes = small_valid();
    let (version, metadata, tensors, data_offset, alignment) =
        GgufFile::parse_bytes(&bytes).expect("valid");
    assert_eq!(version, 3);
    assert_eq!(metadata.len(), 6);
    assert_eq!(tensors.len(), 2);
    assert_eq!(alignment, 32);
    // q: 34 bytes padded to 64, then a: 32 bytes ending at the end of the file.
    assert_eq!(data_offset + 64 + 32, bytes.len());
}

/// Cutting the valid file at any byte gives a truncation-class error naming a position
/// inside the file, never a panic or success.
#[test]
fn every_truncation_is_rejected() {
    let bytes = small_valid();
    for cut in 0..bytes.len() {
        let err = GgufFile::parse_bytes(&bytes[..cut]).expect_err("truncated file accepted");
        let ok = match &err {
            GgufError::Truncated {
                offset,
                needed,
                available,
                ..
            } => offset + available == cut && needed > available,
            GgufError::StringTooLong {
                offset, remaining, ..
            } => offset + 8 + remaining == cut,
            GgufError::CountTooLarge {
                offset, remaining, ..
            } => offset + 8 + remaining <= cut,
            GgufError::TensorOutOfBounds { file_len, .. } => *file_len == cut,
            _ => false,
        };
        assert!(ok, "cut at {cut}: unexpected {err:?}");
    }
}

#[test]
fn truncation_inside_fixed_fields_names_the_field() {
    let bytes = small_valid();
    // (cut, field, field offset, field size)
    let cases = [
        (2, "magic", 0, 4),
        (6, "version", 4, 4),
        (12, "tensor count", 8, 8),
        (20, "metadata", 16, 8),
    ];
    for (cut, what, offset, needed) in cases {
        let err = GgufFile::parse_bytes(&bytes[..cut]).expect_err("truncated");
        let expected = gguf_corpus::truncated(what, offset, needed, cut - offset);
        assert_eq!(err, expected, "cut at {cut}");
    }
}

/// Flipping any single byte of the valid file must never panic (whatever it yields).
#[test]
fn single_byte_corruptions_never_panic() {
    let bytes = small_valid();
    for i in 0..bytes.len() {
        for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] = v;
            let _ = GgufFile::parse_bytes(&b);
        }
    }
}

#[test]
fn header_with_nothing_after_counts_is_truncated() {
    let bytes = Enc::header(3, 1, 1).0;
    let err = GgufFile::parse_bytes(&bytes).expect_err("no metadata bytes");
    assert!(
        matches!(
            err,
            GgufError::CountTooLarge {
                what: "metadata",
                count: 1,
                remaining: 0,
                ..
            }
        ),
        "{err:?}"
    );
}
