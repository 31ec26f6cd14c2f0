//! Shared by the load-mutation tests: what a loaded model must do, and panics turned into
//! failure messages.

use std::panic::{catch_unwind, AssertUnwindSafe};

use tandem_kernels::Isa;
use tandem_model::batch::{AdapterId, BlockId, ForwardBatch, OutputSelection, TokenId};
use tandem_model::host_model::HostModel;
use tandem_model::kv_store::{KvDtype, KvStore};
use tandem_model::tokenizer::Tokenizer;
use tandem_model::transformer::Model;

/// Runs five tokens through a model that loaded: the forward pass may fail with a typed
/// error, but logits it returns must be finite.
pub fn run_five_tokens(host: HostModel) -> Result<(), String> {
    run_five_tokens_on(&mut Model::with_kernels(host, 1, Isa::best()), None)
}

/// [`run_five_tokens`] on a prepared model, the sequence running with `adapter`.
pub fn run_five_tokens_on(model: &mut Model, adapter: Option<AdapterId>) -> Result<(), String> {
    let Ok(mut kv) = KvStore::with_dtype(&model.config, 16, 1, KvDtype::F32) else {
        return Ok(());
    };
    let ids = (0..5).map(TokenId).collect();
    let mut batch = ForwardBatch::single(ids, 0, vec![BlockId(0)], OutputSelection::All);
    batch.seqs[0].adapter = adapter;
    match model.forward(&batch, &mut kv) {
        Ok(logits) if !logits.as_slice().iter().all(|x| x.is_finite()) => {
            Err("the forward pass gave logits that are not finite".into())
        }
        _ => Ok(()),
    }
}

/// Runs `f`; a problem it reports or a panic becomes a line of `failures`.
pub fn no_panic<T>(
    label: &str,
    failures: &mut Vec<String>,
    f: impl FnOnce() -> Result<T, String>,
) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Some(v),
        Ok(Err(problem)) => {
            failures.push(format!("{label}: {problem}"));
            None
        }
        Err(panic) => {
            let msg = (panic.downcast_ref::<String>().cloned())
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{label}: panicked: {msg}"));
            None
        }
    }
}

/// Uses a tokenizer that built: encodes and decodes texts with special-token text, controls
/// and emoji, and looks up ids inside and outside its vocabulary. Errors are allowed, panics
/// are not.
pub fn exercise(t: &Tokenizer) {
    let texts = [
        "Hello world! 123 <|im_start|>user\n ünï 🤖\t\t x",
        "",
        " ",
        "<s></s>",
        "\0",
    ];
    for text in texts {
        let _ = t.special_text_in(text);
        let _ = t.encode_with_literals(text, std::slice::from_ref(&(0..text.len())));
        if let Ok(ids) = t.encode(text, true) {
            let _ = (t.decode(&ids, false), t.decode(&ids, true));
        }
    }
    let n = t.vocab_size() as u32;
    for id in [0, 1, n.saturating_sub(1), n, u32::MAX] {
        let _ = (
            t.decode(&[id], false),
            t.token_to_piece(id),
            t.is_special(id),
        );
    }
}
