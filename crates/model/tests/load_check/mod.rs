//! Shared by the load-mutation tests: what a loaded model must do, and panics turned into
//! failure messages.

use std::panic::{catch_unwind, AssertUnwindSafe};

use tandem_kernels::Isa;
use tandem_model::batch::{BlockId, ForwardBatch, OutputSelection, TokenId};
use tandem_model::host_model::HostModel;
use tandem_model::kv_store::{KvDtype, KvStore};
use tandem_model::transformer::Model;

/// Runs five tokens through a model that loaded: the forward pass may fail with a typed
/// error, but logits it returns must be finite.
pub fn run_five_tokens(host: HostModel) -> Result<(), String> {
    let mut model = Model::with_kernels(host, 1, Isa::best());
    let Ok(mut kv) = KvStore::with_dtype(&model.config, 16, 1, KvDtype::F32) else {
        return Ok(());
    };
    let ids = (0..5).map(TokenId).collect();
    let batch = ForwardBatch::single(ids, 0, vec![BlockId(0)], OutputSelection::All);
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
