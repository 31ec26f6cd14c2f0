//! `tandem generate`'s structured-output flags: the output must match a JSON schema, a
//! regular expression, one of several strings, or a Lark grammar (compiled once, applied to
//! every sample; see `tandem_engine::sampler::constraint`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem_engine::sampler::{Constraint, ConstraintCompiler, GrammarSpec};
use tandem_model::tokenizer::Tokenizer;

/// The largest grammar file the CLI reads, in bytes.
const MAX_GRAMMAR_BYTES: usize = 1 << 20;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("structured").args(["json_schema", "regex", "choice", "grammar"])))]
pub struct StructuredArgs {
    /// Constrain the output to JSON matching the JSON schema in FILE.
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
    /// Constrain the output to match this regular expression (whole).
    #[arg(long, value_name = "RE")]
    regex: Option<String>,
    /// Constrain the output to one of these strings (repeat the flag).
    #[arg(long, value_name = "TEXT")]
    choice: Vec<String>,
    /// Constrain the output to the Lark grammar in FILE (llguidance's dialect).
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
}

impl StructuredArgs {
    /// Whether any structured-output flag was given.
    pub fn is_set(&self) -> bool {
        self.json_schema.is_some()
            || self.regex.is_some()
            || !self.choice.is_empty()
            || self.grammar.is_some()
    }

    /// The requested grammar, read from its file where it has one.
    fn spec(&self) -> Result<Option<(&'static str, GrammarSpec)>> {
        if let Some(path) = &self.json_schema {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--json-schema {}", path.display()))?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema {}: not JSON", path.display()))?;
            return Ok(Some(("--json-schema", GrammarSpec::JsonSchema(schema))));
        }
        if let Some(rx) = &self.regex {
            return Ok(Some(("--regex", GrammarSpec::Regex(rx.clone()))));
        }
        if !self.choice.is_empty() {
            return Ok(Some(("--choice", GrammarSpec::Choice(self.choice.clone()))));
        }
        if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--grammar {}", path.display()))?;
            return Ok(Some(("--grammar", GrammarSpec::Lark(text))));
        }
        Ok(None)
    }

    /// The compiled constraint for `tokenizer`, or `None` without a structured flag.
    pub fn compile(&self, tokenizer: &Tokenizer) -> Result<Option<Constraint>> {
        let Some((flag, spec)) = self.spec()? else {
            return Ok(None);
        };
        let compiler = ConstraintCompiler::new(tokenizer)?;
        match compiler.compile(&spec, flag, MAX_GRAMMAR_BYTES) {
            Ok(c) => Ok(Some(c)),
            Err(e) => bail!("{e}"),
        }
    }
}
