//! `--speculative ngram[:MIN:MAX]` / `--speculative draft:PATH`, `--num-speculative-tokens K`
//! `--speculative-max-batch N` and `--speculative-draft-cost C`: the proposer and its
//! configuration.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use tandem_engine::engine::Engine;
use tandem_engine::speculative::{DraftModelProposer, NgramProposer, SpeculativeConfig};
use tandem_model::runner::ModelRunner;

use crate::args::{EngineArgs, ModelArgs};
use crate::runner_setup::PreparedModel;

/// Which proposer `--speculative` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecMethod {
    /// Prompt lookup with matches of `min..=max` tokens.
    Ngram { min: usize, max: usize },
    /// A draft model file or directory.
    Draft(PathBuf),
}

/// Parses `ngram`, `ngram:MIN:MAX` or `draft:PATH`.
pub fn parse_method(s: &str) -> Result<SpecMethod> {
    if let Some(path) = s.strip_prefix("draft:") {
        if path.is_empty() {
            bail!("--speculative draft:PATH needs a path");
        }
        return Ok(SpecMethod::Draft(PathBuf::from(path)));
    }
    if s == "ngram" {
        return Ok(SpecMethod::Ngram { min: 1, max: 3 });
    }
    if let Some(range) = s.strip_prefix("ngram:") {
        let (a, b) = range
            .split_once(':')
            .with_context(|| format!("--speculative {s}: expected ngram:MIN:MAX"))?;
        let min = a
            .parse()
            .with_context(|| format!("--speculative {s}: MIN"))?;
        let max = b
            .parse()
            .with_context(|| format!("--speculative {s}: MAX"))?;
        return Ok(SpecMethod::Ngram { min, max });
    }
    bail!("--speculative {s}: expected `ngram`, `ngram:MIN:MAX` or `draft:PATH`")
}

/// The method named by the flags, with the draft model loaded and prepared on the target's
/// device (its KV pool is sized with the target's).
pub fn load_method(
    args: &EngineArgs,
    model_args: &ModelArgs,
) -> Result<Option<(SpecMethod, Option<PreparedModel>)>> {
    let Some(s) = args.speculative.as_deref() else {
        if args.num_speculative_tokens.is_some() {
            bail!("--num-speculative-tokens needs --speculative");
        }
        return Ok(None);
    };
    let method = parse_method(s)?;
    let draft = match &method {
        SpecMethod::Draft(path) => {
            let lm = tandem_model::loader::load_model(path)
                .with_context(|| format!("loading the draft model {}", path.display()))?;
            Some(PreparedModel::new(
                lm.host,
                model_args,
                args.kv_cache_dtype,
            )?)
        }
        SpecMethod::Ngram { .. } => None,
    };
    Ok(Some((method, draft)))
}

/// Turns speculation on in `engine`; `draft`: the draft model's runner and its weight size
/// as a fraction of the target's.
pub fn enable(
    engine: &mut Engine,
    method: SpecMethod,
    draft: Option<(Box<dyn ModelRunner>, f64)>,
    args: &EngineArgs,
) -> Result<()> {
    let mut config = SpeculativeConfig::default();
    if let Some(k) = args.num_speculative_tokens {
        config.num_tokens = k;
    }
    if let Some(b) = args.speculative_max_batch {
        config.max_batch_size = b;
    }
    let vocab = engine.model_config().vocab_size;
    if let Some((_, ratio)) = &draft {
        config.draft_cost += ratio;
    }
    if let Some(c) = args.speculative_draft_cost {
        config.draft_cost = c;
        if c == 0.0 {
            config.verify_cost = 0.0;
        }
    }
    let (proposer, what): (Box<dyn tandem_engine::speculative::Proposer>, String) = match method {
        SpecMethod::Ngram { min, max } => (
            Box::new(NgramProposer::new(min, max)?),
            format!("n-gram lookup, n in [{min}, {max}]"),
        ),
        SpecMethod::Draft(path) => {
            let (runner, _) = draft.context("the draft model is loaded with its method")?;
            let p = DraftModelProposer::new(runner, vocab)?;
            (Box::new(p), format!("draft model {}", path.display()))
        }
    };
    eprintln!(
        "tandem: speculative decoding with {what}, up to {} tokens per step (draft cost {:.2}), while at most {} sequences run",
        config.num_tokens, config.draft_cost, config.max_batch_size
    );
    engine.enable_speculation(config, proposer)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_parse() {
        assert_eq!(
            parse_method("ngram").unwrap(),
            SpecMethod::Ngram { min: 1, max: 3 }
        );
        assert_eq!(
            parse_method("ngram:2:5").unwrap(),
            SpecMethod::Ngram { min: 2, max: 5 }
        );
        assert_eq!(
            parse_method("draft:m.gguf").unwrap(),
            SpecMethod::Draft(PathBuf::from("m.gguf"))
        );
        assert!(parse_method("draft:").is_err());
        assert!(parse_method("eagle").is_err());
        assert!(parse_method("ngram:3").is_err());
    }
}
