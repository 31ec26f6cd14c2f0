//! The GPT-2 "byte-level" alphabet: every byte 0..=255 is written as one printable Unicode
//! character, so that byte-level BPE vocabularies can be stored as ordinary strings.
//!
//! Printable bytes (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for themselves; the remaining 68
//! bytes are given the characters U+0100, U+0101, ... in increasing byte order.

use std::collections::HashMap;

/// Whether `byte` is one of the 188 bytes that the alphabet writes as itself.
fn is_self_mapped(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The character standing for each byte, indexed by byte value.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_extra = 0x100u32;
    for byte in 0..=255u8 {
        table[usize::from(byte)] = if is_self_mapped(byte) {
            char::from(byte)
        } else {
            let c = char::from_u32(next_extra).expect("U+0100..U+0144 are valid scalar values");
            next_extra += 1;
            c
        };
    }
    table
}

/// The inverse of [`byte_to_char_table`].
pub(crate) fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(byte, &c)| (c, u8::try_from(byte).expect("table has 256 entries")))
        .collect()
}

/// The bytes a byte-level vocabulary string stands for, or `None` when it contains a
/// character outside the alphabet (such a token is taken verbatim by the caller).
pub(crate) fn decode_piece(piece: &str, map: &HashMap<char, u8>) -> Option<Vec<u8>> {
    piece.chars().map(|c| map.get(&c).copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection_with_known_anchors() {
        let table = byte_to_char_table();
        let map = char_to_byte_map();
        assert_eq!(map.len(), 256);
        // Anchors from the GPT-2 vocabulary: space is `Ġ`, newline `Ċ`, tab `ĉ`.
        assert_eq!(table[usize::from(b' ')], 'Ġ');
        assert_eq!(table[usize::from(b'\n')], 'Ċ');
        assert_eq!(table[usize::from(b'\t')], 'ĉ');
        assert_eq!(table[usize::from(b'a')], 'a');
        assert_eq!(table[0xAD], 'Ń');
        assert_eq!(decode_piece("ĠHello", &map), Some(b" Hello".to_vec()));
        assert_eq!(
            decode_piece("<|im_start|>", &map),
            Some(b"<|im_start|>".to_vec())
        );
        assert_eq!(decode_piece("ő", &map), None);
    }
}
