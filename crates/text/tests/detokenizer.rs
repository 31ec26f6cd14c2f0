//! The incremental detokenizer on the default model's real tokenizer (byte-level BPE) and
//! on the model crate's SentencePiece fixtures (GGUF and Hugging Face, whose `decode` drops
//! the prepended space): streamed chunks concatenate to `Tokenizer::decode` for any id
//! sequence, characters split across byte tokens are held back (never U+FFFD), and nothing
//! else is held back.

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use tandem_model::gguf::GgufFile;
use tandem_model::tokenizer::Tokenizer;
use tandem_text::{IncrementalDetokenizer, TextError};

/// The default model's tokenizer, loaded once per test binary.
fn tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = tandem_model::default_model::test_model_path()
                .expect("the default model is needed (TANDEM_TEST_MODEL); this test does not skip");
            let file = GgufFile::open(&path).expect("the default model opens");
            Arc::new(Tokenizer::from_gguf_metadata(&file.metadata).expect("its tokenizer builds"))
        })
        .clone()
}

/// The model crate's SentencePiece fixtures: a GGUF vocabulary (llama.cpp's rule: a space
/// prefix on every stretch of text) and a Hugging Face directory (`tokenizer.json`).
fn sentencepiece_tokenizers() -> &'static [Arc<Tokenizer>] {
    static TOKENIZERS: OnceLock<Vec<Arc<Tokenizer>>> = OnceLock::new();
    TOKENIZERS.get_or_init(|| {
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures");
        let file =
            GgufFile::open(&fixtures.join("tokenizer_spm/vocab.gguf")).expect("fixture opens");
        let gguf = Tokenizer::from_gguf_metadata(&file.metadata).expect("tokenizer builds");
        let hf = Tokenizer::from_hf_dir(&fixtures.join("tokenizer_hf/sentencepiece"))
            .expect("tokenizer builds");
        vec![Arc::new(gguf), Arc::new(hf)]
    })
}

/// Ids whose token is a single byte (byte-level BPE has one for each of the 256 bytes).
fn single_byte_ids() -> Vec<u32> {
    let tok = tokenizer();
    (0..tok.vocab_size() as u32)
        .filter(|&id| !tok.is_special(id) && tok.token_bytes(id).is_some_and(|b| b.len() == 1))
        .collect()
}

/// Streams `ids` and checks, after every push, that the emitted text is exactly
/// `decode(ids so far)` minus an incomplete trailing character (which `decode` shows as one
/// U+FFFD). Returns the chunks, `finish` last.
fn stream_checked(ids: &[u32], skip_special: bool) -> Vec<String> {
    stream_checked_with(&tokenizer(), ids, skip_special)
}

fn stream_checked_with(tok: &Arc<Tokenizer>, ids: &[u32], skip_special: bool) -> Vec<String> {
    let mut detok = IncrementalDetokenizer::new(tok.clone(), skip_special);
    let mut chunks = Vec::new();
    let mut emitted = String::new();
    for (k, &id) in ids.iter().enumerate() {
        let chunk = detok.push(id).expect("ids are in the vocabulary");
        emitted.push_str(&chunk);
        chunks.push(chunk);
        let decoded = tok.decode(&ids[..=k], skip_special).expect("decodes");
        let expected_tail = if detok.has_pending() { "\u{FFFD}" } else { "" };
        assert_eq!(
            format!("{emitted}{expected_tail}"),
            decoded,
            "after {} of {ids:?}",
            k + 1
        );
    }
    chunks.push(detok.finish());
    assert!(!detok.has_pending());
    chunks
}

fn assert_streams_like_decode(ids: &[u32], skip_special: bool) {
    assert_streams_like_decode_with(&tokenizer(), ids, skip_special);
}

fn assert_streams_like_decode_with(tok: &Arc<Tokenizer>, ids: &[u32], skip_special: bool) {
    let decoded = tok.decode(ids, skip_special).expect("decodes");
    let chunks = stream_checked_with(tok, ids, skip_special);
    assert_eq!(chunks.concat(), decoded, "ids {ids:?}");
    if !decoded.contains('\u{FFFD}') {
        assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')));
    }
}

#[test]
fn emoji_and_cjk_split_across_byte_tokens_are_held_back() {
    let tok = tokenizer();
    let mut split_chars = 0;
    for text in [
        "🦀",
        "🎉🎉",
        "I ❤️ 🍣!",
        "日本語のテキスト",
        "naïve café",
        "𝔘𝔫𝔦",
    ] {
        let ids = tok.encode(text, false).expect("encodes");
        // Tokens that are not whole characters on their own: the interesting case.
        split_chars += ids
            .iter()
            .filter(|&&id| std::str::from_utf8(tok.token_bytes(id).expect("known id")).is_err())
            .count();
        let chunks = stream_checked(&ids, true);
        assert_eq!(chunks.concat(), text);
        assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
    }
    assert!(
        split_chars >= 6,
        "expected byte tokens holding partial characters"
    );
}

#[test]
fn a_four_byte_emoji_from_single_byte_tokens_appears_on_its_last_byte() {
    let tok = tokenizer();
    let byte_id = |b: u8| {
        (0..tok.vocab_size() as u32)
            .find(|&id| !tok.is_special(id) && tok.token_bytes(id) == Some(&[b][..]))
            .expect("every byte has a token")
    };
    let ids: Vec<u32> = "🦀".bytes().map(byte_id).collect();
    let mut detok = IncrementalDetokenizer::new(tok.clone(), false);
    let chunks: Vec<String> = ids
        .iter()
        .map(|&id| detok.push(id).expect("known"))
        .collect();
    assert_eq!(chunks, ["", "", "", "🦀"]);
    assert_eq!(detok.finish(), "");
}

#[test]
fn an_unfinished_character_becomes_one_replacement_char_only_at_finish() {
    let tok = tokenizer();
    let ids = tok.encode("ok🦀", false).expect("encodes");
    let mut detok = IncrementalDetokenizer::new(tok.clone(), false);
    let mut text = String::new();
    for &id in &ids[..ids.len() - 1] {
        text.push_str(&detok.push(id).expect("known"));
    }
    assert_eq!(text, "ok");
    assert!(detok.has_pending());
    assert_eq!(detok.finish(), "\u{FFFD}");
}

#[test]
fn special_tokens_are_skipped_or_kept() {
    let tok = tokenizer();
    let im_end = tok
        .token_to_id("<|im_end|>")
        .expect("SmolLM2 has <|im_end|>");
    assert!(tok.is_special(im_end));
    let ids = tok.encode("Hi there<|im_end|>", false).expect("encodes");
    assert_eq!(ids.last(), Some(&im_end));
    assert_eq!(stream_checked(&ids, true).concat(), "Hi there");
    assert_eq!(stream_checked(&ids, false).concat(), "Hi there<|im_end|>");
    // A skipped special token between the bytes of a character does not break it, as in
    // decode(.., true); kept, it does (decode shows U+FFFD there too).
    let crab = tok.encode("🦀", false).expect("encodes");
    assert!(crab.len() >= 2, "🦀 is split: {crab:?}");
    let mut ids = crab.clone();
    ids.insert(1, im_end);
    assert_eq!(stream_checked(&ids, true).concat(), "🦀");
    assert_streams_like_decode(&ids, false);
}

#[test]
fn unknown_ids_are_an_error() {
    let tok = tokenizer();
    let bad = tok.vocab_size() as u32;
    let mut detok = IncrementalDetokenizer::new(tok, false);
    assert_eq!(detok.push(bad), Err(TextError::UnknownToken(bad)));
}

#[test]
fn sentencepiece_prefix_spaces_are_dropped_like_decode() {
    for tok in sentencepiece_tokenizers() {
        let bos = tok.bos_id().expect("the fixtures have BOS");
        for text in ["Hello world", " two  spaces", "naïve 日本 🦀 text"] {
            let mut ids = tok.encode(text, true).expect("encodes");
            let first_text_token = *ids.iter().find(|&&id| !tok.is_special(id)).expect("text");
            assert_eq!(
                tok.token_bytes(first_text_token).and_then(|b| b.first()),
                Some(&b' ')
            );
            // Again after a special token, where llama.cpp's rule drops the space again.
            ids.push(bos);
            ids.extend(tok.encode(text, false).expect("encodes"));
            for skip in [true, false] {
                let chunks = stream_checked_with(tok, &ids, skip);
                assert_eq!(chunks.concat(), tok.decode(&ids, skip).expect("decodes"));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_ids_stream_like_decode(
        raw in proptest::collection::vec(any::<u32>(), 0..48),
        skip in any::<bool>(),
    ) {
        let n = tokenizer().vocab_size() as u32;
        let ids: Vec<u32> = raw.iter().map(|r| r % n).collect();
        assert_streams_like_decode(&ids, skip);
    }

    #[test]
    fn random_byte_token_sequences_stream_like_decode(
        picks in proptest::collection::vec(any::<proptest::sample::Index>(), 0..48),
        skip in any::<bool>(),
    ) {
        // Mostly single-byte tokens (partial and invalid UTF-8 everywhere), some specials.
        let bytes = single_byte_ids();
        let tok = tokenizer();
        let specials: Vec<u32> = (0..tok.vocab_size() as u32).filter(|&id| tok.is_special(id)).collect();
        let ids: Vec<u32> = picks
            .iter()
            .enumerate()
            .map(|(i, p)| if i % 11 == 10 { *p.get(&specials) } else { *p.get(&bytes) })
            .collect();
        assert_streams_like_decode(&ids, skip);
    }

    #[test]
    fn sentencepiece_random_ids_stream_like_decode(
        raw in proptest::collection::vec(any::<u32>(), 0..48),
        skip in any::<bool>(),
        which in 0usize..2,
    ) {
        let tok = &sentencepiece_tokenizers()[which];
        let n = tok.vocab_size() as u32;
        // Every third token special, so that stretches of text start often.
        let specials: Vec<u32> = (0..n).filter(|&id| tok.is_special(id)).collect();
        let ids: Vec<u32> = raw
            .iter()
            .enumerate()
            .map(|(i, r)| if i % 3 == 2 { specials[*r as usize % specials.len()] } else { r % n })
            .collect();
        assert_streams_like_decode_with(tok, &ids, skip);
    }

    #[test]
    fn random_unicode_text_streams_back_exactly(text in "(\\PC|[🦀🎉日本語éñ𝔘])*") {
        let ids = tokenizer().encode(&text, false).expect("encodes");
        let chunks = stream_checked(&ids, true);
        prop_assert_eq!(&chunks.concat(), &text);
        if !text.contains('\u{FFFD}') {
            prop_assert!(chunks.iter().all(|c| !c.contains(char::REPLACEMENT_CHARACTER)));
        }
    }
}

/// Padding rows past the vocabulary (a padded embedding) stream as no text and leave the text
/// around them as it was: byte-level and SentencePiece (whose space prefix a control token
/// would reset) alike, and the whole stream equals `decode` with or without them.
#[test]
fn padding_ids_stream_as_nothing() {
    let mut padded: Vec<Tokenizer> = vec![(*tokenizer()).clone()];
    padded.extend(sentencepiece_tokenizers().iter().map(|t| (**t).clone()));
    for mut tok in padded {
        let n = tok.vocab_size();
        tok.pad_to(n + 4);
        let tok = Arc::new(tok);
        let pad = n as u32 + 2;
        let ids = tok
            .encode("Hello world, and again: hello world!", true)
            .unwrap();
        let plain = tok.decode(&ids, true).unwrap();
        let mut with_pad = vec![pad];
        for &id in &ids {
            with_pad.extend([id, pad]);
        }
        for skip in [true, false] {
            assert_streams_like_decode_with(&tok, &with_pad, skip);
            assert_eq!(
                tok.decode(&with_pad, skip).unwrap(),
                tok.decode(&ids, skip).unwrap()
            );
        }
        let streamed = stream_checked_with(&tok, &with_pad, true).concat();
        assert_eq!(streamed, plain);
        let mut detok = IncrementalDetokenizer::new(tok.clone(), false);
        assert_eq!(
            detok.push(n as u32 + 4),
            Err(TextError::UnknownToken(n as u32 + 4))
        );
    }
}
