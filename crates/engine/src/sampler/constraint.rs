//! Structured-output constraints: a grammar that limits which tokens a request may sample.
//!
//! Three pieces, built at three times:
//!
//! - [`ConstraintCompiler`], once per model: the token trie of the model's tokenizer (the
//!   bytes of every id, special tokens marked) and an `llguidance` parser factory with bounded
//!   limits (lexer fuel, grammar size), so that no schema can make compiling or masking run
//!   away.
//! - [`Constraint`], once per request: a [`GrammarSpec`] (JSON schema, regex, choice, Lark
//!   grammar) compiled into a parser. Compiling can take milliseconds or more, so callers do
//!   it off the engine thread (the server in a blocking task) and hand the result to the
//!   engine in [`super::SamplingParams::constraint`].
//! - [`ConstraintState`], once per sequence (each `n > 1` sample its own, forked): the parser
//!   position after the committed output tokens. [`super::sample`] asks it for the mask of
//!   allowed tokens, disallowed tokens get `-inf` before temperature and truncation, and the
//!   engine advances it with each committed token ([`super::SamplerState::append_output`]).
//!
//! Stop tokens (EOS, end-of-turn, `stop_token_ids`) are allowed exactly when the grammar
//! accepts the output so far; they are never fed to the parser. A state with no allowed token
//! (a dead end) makes sampling fail with [`super::SamplerError::Constraint`], which ends that
//! request only. Preemption by recompute keeps the committed output, so the state stays
//! valid. Speculative verification advances the state through the drafts it accepts (each
//! target row is masked at its own position, so a draft the grammar forbids is rejected and
//! the replacement drawn from the masked distribution) and rolls them back afterwards; the
//! engine then commits what was emitted. Beam search keeps one state per beam.

use std::fmt;
use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use tandem_model::tokenizer::Tokenizer;
use thiserror::Error;

/// Why a constraint could not be built or compiled. `field` names the request field.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConstraintError {
    /// The grammar text or schema is larger than the configured limit.
    #[error("{field}: the grammar is {size} bytes, more than the limit of {limit}")]
    TooLarge {
        field: &'static str,
        size: usize,
        limit: usize,
    },
    /// The schema, regex or grammar does not compile (the message is llguidance's).
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// The tokenizer could not be turned into a token trie.
    #[error("cannot build the constraint vocabulary: {0}")]
    Vocabulary(String),
    /// No thread could be started for the compile (the system is out of threads or memory).
    #[error("cannot start a grammar compile: {0}")]
    Thread(String),
}

/// What a request asks its output to match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON matching this JSON schema.
    JsonSchema(serde_json::Value),
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A context-free grammar in llguidance's Lark syntax.
    Lark(String),
}

impl GrammarSpec {
    /// The size of the grammar's text, for the size limit.
    pub fn size(&self) -> usize {
        match self {
            GrammarSpec::JsonObject => 0,
            GrammarSpec::JsonSchema(v) => v.to_string().len(),
            GrammarSpec::Regex(s) | GrammarSpec::Lark(s) => s.len(),
            GrammarSpec::Choice(c) => c.iter().map(|s| s.len() + 1).sum(),
        }
    }

    /// The llguidance grammar; JSON schemas get compact separators unless they say
    /// otherwise (`x-guidance`), so that a model cannot wander off into whitespace.
    fn to_grammar(&self, field: &'static str) -> Result<TopLevelGrammar, ConstraintError> {
        let invalid = |message: &str| ConstraintError::Invalid {
            field,
            message: message.to_string(),
        };
        Ok(match self {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() {
                    return Err(invalid("the JSON schema must be an object"));
                }
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Choice(choices) => {
                if choices.is_empty() {
                    return Err(invalid("at least one choice is needed"));
                }
                let alternatives: Vec<String> = choices.iter().map(|c| escape_regex(c)).collect();
                TopLevelGrammar::from_regex(&alternatives.join("|"))
            }
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}

/// Adds compact JSON separators to an object schema without `x-guidance` options.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if schema.is_object() && schema.get("x-guidance").is_none() {
        let options = JsonCompileOptions {
            whitespace_flexible: false,
            ..JsonCompileOptions::default()
        };
        options.apply_to(&mut schema);
    }
    schema
}

/// `text` as a regex matching exactly itself.
fn escape_regex(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/\"".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The model's vocabulary as llguidance sees it, and the limits every compile runs under.
/// Build once per model; share by `Arc`.
pub struct ConstraintCompiler {
    factory: ParserFactory,
    /// The trie's id space (the tokenizer's, padding rows included when the loader padded
    /// it); logits rows may be longer (a tokenizer built otherwise); those ids get `-inf`.
    vocab_size: usize,
}

impl fmt::Debug for ConstraintCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConstraintCompiler")
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl ConstraintCompiler {
    /// The trie of `tokenizer` (special tokens behind llguidance's marker byte, so grammars
    /// never produce them) with bounded limits ([`bounded_limits`]).
    pub fn new(tokenizer: &Tokenizer) -> Result<ConstraintCompiler, ConstraintError> {
        let vocab_size = tokenizer.vocab_size();
        let n = u32::try_from(vocab_size)
            .map_err(|_| ConstraintError::Vocabulary("vocabulary too large".into()))?;
        let words: Vec<Vec<u8>> = (0..n).map(|id| token_word(tokenizer, id)).collect();
        let eos = tokenizer.eos_ids().first().copied().unwrap_or(0);
        let mut info = TokRxInfo::new(n, eos);
        info.tok_bos = tokenizer.bos_id();
        let trie = TokTrie::from(&info, &words);
        let env: Arc<dyn TokenizerEnv + Sync> = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = bounded_limits();
        Ok(ConstraintCompiler {
            factory,
            vocab_size,
        })
    }

    /// Compiles `spec` (the request's `field`) after checking its size against
    /// `max_bytes`. Bounded by the factory's limits; may still take a while for a large
    /// schema, so call it off the engine thread.
    pub fn compile(
        &self,
        spec: &GrammarSpec,
        field: &'static str,
        max_bytes: usize,
    ) -> Result<Constraint, ConstraintError> {
        let size = spec.size();
        if size > max_bytes {
            return Err(ConstraintError::TooLarge {
                field,
                size,
                limit: max_bytes,
            });
        }
        let grammar = spec.to_grammar(field)?;
        // llguidance walks a grammar's rules and a schema's references recursively, so a
        // hostile chain of them needs stack in proportion to its size: the compile gets a
        // thread of its own whose stack grows with the grammar, whatever thread calls.
        std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("grammar-compile".into())
                .stack_size(compile_stack_bytes(size))
                .spawn_scoped(s, || self.compile_grammar(grammar, field))
                .map_err(|e| ConstraintError::Thread(e.to_string()))?
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn compile_grammar(
        &self,
        grammar: TopLevelGrammar,
        field: &'static str,
    ) -> Result<Constraint, ConstraintError> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::Invalid {
                field,
                message: e.to_string(),
            })?;
        let mut matcher = Matcher::new(Ok(parser));
        // A grammar that allows nothing at all is a client error, found before anything runs.
        if let Err(e) = matcher.compute_mask() {
            return Err(ConstraintError::Invalid {
                field,
                message: e.to_string(),
            });
        }
        Ok(Constraint(Arc::new(Compiled {
            start: matcher,
            vocab_size: self.vocab_size,
        })))
    }
}

/// The stack of a compile of a `size`-byte grammar: 8 MiB and 1 KiB per byte, at most
/// 1 GiB (address space only: only the pages a compile touches are ever committed). A chain
/// of Lark rules or of schema `$ref`s 64 KiB long compiled in 9–17 MiB (release build), so
/// the default `--max-grammar-bytes` gets over 4 times what it needs.
fn compile_stack_bytes(size: usize) -> usize {
    ((8 << 20) + size.saturating_mul(1 << 10)).min(1 << 30)
}

/// The factory's limits: llguidance's defaults with a smaller lexer budget, so one mask
/// costs at most a few milliseconds and a compile at most a fraction of a second.
fn bounded_limits() -> ParserLimits {
    ParserLimits {
        initial_lexer_fuel: 500_000,
        step_lexer_fuel: 100_000,
        max_grammar_size: 200_000,
        max_lexer_states: 100_000,
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// The bytes of `id` for the trie: its text, special tokens (and padding rows, which no
/// grammar may produce either) behind the marker byte.
fn token_word(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let bytes = tokenizer.token_bytes(id).unwrap_or_default();
    if tokenizer.is_special(id) || tokenizer.is_padding(id) {
        let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        w.extend_from_slice(bytes);
        w
    } else {
        bytes.to_vec()
    }
}

struct Compiled {
    /// The parser at the start of the output; each sequence starts from a deep clone.
    start: Matcher,
    vocab_size: usize,
}

/// A compiled grammar, shared by every sample of a request. Equality is identity.
#[derive(Clone)]
pub struct Constraint(Arc<Compiled>);

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint")
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Constraint) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Constraint {
    /// A fresh per-sequence state at the start of the output.
    pub fn start(&self) -> ConstraintState {
        ConstraintState {
            matcher: self.0.start.deep_clone(),
            vocab_size: self.0.vocab_size,
            mask: None,
        }
    }
}

/// One sequence's position in its grammar (see the module documentation).
pub struct ConstraintState {
    matcher: Matcher,
    vocab_size: usize,
    /// The mask of the current position, kept until the next token is committed.
    mask: Option<SimpleVob>,
}

impl Clone for ConstraintState {
    fn clone(&self) -> ConstraintState {
        ConstraintState {
            matcher: self.matcher.deep_clone(),
            vocab_size: self.vocab_size,
            mask: self.mask.clone(),
        }
    }
}

impl fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConstraintState")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl ConstraintState {
    /// Sets every disallowed entry of `values` (`[row]`, the processed logits) to `-inf`;
    /// `stop_ids` keep their value only when the grammar accepts the output so far.
    /// Errors: the parser's error, or a dead end (no token left).
    pub fn apply(&mut self, values: &mut [f64], stop_ids: &[u32]) -> Result<(), String> {
        let accepting = self.matcher.is_accepting().map_err(|e| e.to_string())?;
        let saved: Vec<(usize, f64)> = stop_ids
            .iter()
            .filter_map(|&s| values.get(s as usize).map(|&v| (s as usize, v)))
            .collect();
        let vocab_size = self.vocab_size;
        let mask = self.current_mask()?;
        for (id, v) in values.iter_mut().enumerate() {
            if id >= vocab_size || !mask.is_allowed(id as u32) {
                *v = f64::NEG_INFINITY;
            }
        }
        for (id, v) in saved {
            values[id] = if accepting { v } else { f64::NEG_INFINITY };
        }
        if values.iter().any(|&v| v > f64::NEG_INFINITY) {
            Ok(())
        } else {
            Err("the output reached a point where the grammar allows no token".into())
        }
    }

    /// The mask of the current position, computed once per position (empty once the
    /// grammar has stopped: only a stop token may follow).
    fn current_mask(&mut self) -> Result<&SimpleVob, String> {
        if self.mask.is_none() {
            let mask = if self.matcher.is_stopped() {
                SimpleVob::alloc(self.vocab_size)
            } else {
                self.matcher.compute_mask().map_err(|e| e.to_string())?
            };
            self.mask = Some(mask);
        }
        self.mask.as_ref().ok_or_else(|| "no mask".to_string())
    }

    /// Whether the grammar accepts the output so far (a stop token may come now).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Advances past a committed token. A parser error is kept and reported by the next
    /// [`ConstraintState::apply`].
    pub fn commit(&mut self, token: u32) {
        self.mask = None;
        let _ = self.matcher.consume_token(token);
    }

    /// Undoes the last `n` commits (speculative drafts judged, then retracted). A parser
    /// error is kept and reported by the next [`ConstraintState::apply`].
    pub fn rollback(&mut self, n: usize) {
        if n > 0 {
            self.mask = None;
            let _ = self.matcher.rollback(n);
        }
    }
}
