//! Structured-output request fields, in the OpenAI and vLLM spellings, turned into one
//! compiled constraint on the request's sampling parameters.
//!
//! - OpenAI: `response_format` `{"type": "json_object"}` or `{"type": "json_schema",
//!   "json_schema": {"name", "schema", "strict"}}` (`{"type": "text"}` is no constraint).
//! - vLLM: `structured_outputs` `{"json" | "regex" | "choice" | "grammar" | "json_object"}`,
//!   and the older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.
//!
//! At most one of them per request. The grammar is compiled here, in a blocking task with a
//! time limit and under `--max-grammar-bytes`, so the engine thread never compiles: a bad or
//! hostile schema is a 400 naming its field before anything runs. At most
//! `--max-grammar-compiles` compile at once, each holding its slot until it ends (a compile
//! past the time limit is refused but cannot be stopped), so hostile schemas cannot pile up
//! blocking threads.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tandem_engine::sampler::{ConstraintCompiler, ConstraintError, GrammarSpec};

use super::body::fields;
use super::sampling::GenerationPlan;
use super::App;
use crate::error::{ApiError, ApiResult};

/// The longest a grammar may take to compile before the request is refused (400), and the
/// longest a request waits for a compile slot (then 429).
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(10);

/// `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema` (`strict` is accepted: the output always follows the
/// schema).
#[derive(Debug, Deserialize)]
struct JsonSchemaFormat {
    #[allow(dead_code)]
    name: Option<String>,
    schema: Option<Value>,
    #[allow(dead_code)]
    strict: Option<bool>,
}

/// vLLM's `structured_outputs`.
#[derive(Debug, Default, Deserialize)]
struct StructuredOutputs {
    json: Option<Value>,
    regex: Option<String>,
    choice: Option<Vec<String>>,
    grammar: Option<String>,
    json_object: Option<bool>,
}

/// Every structured-output field of a request body.
#[derive(Debug, Default, Deserialize)]
struct StructuredFields {
    response_format: Option<ResponseFormat>,
    structured_outputs: Option<StructuredOutputs>,
    guided_json: Option<Value>,
    guided_regex: Option<String>,
    guided_choice: Option<Vec<String>>,
    guided_grammar: Option<String>,
}

/// The one constraint `body` asks for, with the field that named it; `None` for none.
pub fn requested(body: &Value) -> ApiResult<Option<(&'static str, GrammarSpec)>> {
    let f: StructuredFields = fields(body)?;
    let mut found: Vec<(&'static str, GrammarSpec)> = Vec::new();
    match f.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => {
            found.push(("response_format", GrammarSpec::JsonObject))
        }
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let schema = json_schema.schema.unwrap_or_else(|| serde_json::json!({}));
            found.push(("response_format", GrammarSpec::JsonSchema(schema)));
        }
    }
    if let Some(s) = f.structured_outputs {
        let field = "structured_outputs";
        if let Some(j) = s.json {
            found.push((field, json_spec(field, j)?));
        }
        if let Some(r) = s.regex {
            found.push((field, GrammarSpec::Regex(r)));
        }
        if let Some(c) = s.choice {
            found.push((field, GrammarSpec::Choice(c)));
        }
        if let Some(g) = s.grammar {
            found.push((field, GrammarSpec::Lark(g)));
        }
        if s.json_object == Some(true) {
            found.push((field, GrammarSpec::JsonObject));
        }
    }
    if let Some(j) = f.guided_json {
        found.push(("guided_json", json_spec("guided_json", j)?));
    }
    if let Some(r) = f.guided_regex {
        found.push(("guided_regex", GrammarSpec::Regex(r)));
    }
    if let Some(c) = f.guided_choice {
        found.push(("guided_choice", GrammarSpec::Choice(c)));
    }
    if let Some(g) = f.guided_grammar {
        found.push(("guided_grammar", GrammarSpec::Lark(g)));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(n, _)| *n).collect();
        return Err(ApiError::field(
            found[1].0,
            format!(
                "only one structured output constraint per request, got {}",
                names.join(", ")
            ),
        ));
    }
    Ok(found.pop())
}

/// A JSON schema given as an object or as JSON text.
fn json_spec(field: &'static str, v: Value) -> ApiResult<GrammarSpec> {
    match v {
        Value::String(text) => serde_json::from_str(&text)
            .map(GrammarSpec::JsonSchema)
            .map_err(|e| ApiError::field(field, format!("the schema is not JSON: {e}"))),
        other => Ok(GrammarSpec::JsonSchema(other)),
    }
}

/// Compiles the constraint `body` asks for (if any) into `plan.sampling.constraint` (beam
/// search requests take it too: every beam follows the grammar).
pub async fn attach(app: &App, body: &Value, plan: &mut GenerationPlan) -> ApiResult<()> {
    let Some((field, spec)) = requested(body)? else {
        return Ok(());
    };
    compile_into(app, field, spec, plan).await
}

/// Compiles `spec` (named `field` in errors) in a blocking task into the plan's constraint.
pub async fn compile_into(
    app: &App,
    field: &'static str,
    spec: GrammarSpec,
    plan: &mut GenerationPlan,
) -> ApiResult<()> {
    let owner = Arc::clone(app);
    let max_bytes = app.config.limits.max_grammar_bytes;
    let compiled = app
        .compile_slots
        .run(field, COMPILE_TIMEOUT, move || {
            let compiler = owner.constraint_compiler()?;
            compiler.compile(&spec, field, max_bytes)
        })
        .await?;
    match compiled {
        Ok(c) => {
            plan.sampling.constraint = Some(c);
            Ok(())
        }
        Err(e @ (ConstraintError::Vocabulary(_) | ConstraintError::Thread(_))) => {
            Err(ApiError::internal(e.to_string()))
        }
        Err(e @ (ConstraintError::Invalid { .. } | ConstraintError::TooLarge { .. })) => {
            Err(ApiError::field(field, e.to_string()))
        }
    }
}

/// Builds the model's constraint vocabulary (once, on first use).
pub(crate) fn build_compiler(app: &App) -> Result<Arc<ConstraintCompiler>, ConstraintError> {
    ConstraintCompiler::new(app.prompts.tokenizer()).map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_spelling_is_read() {
        let cases = [
            (
                json!({"response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema",
                       "json_schema": {"name": "x", "schema": {"type": "object"}}}}),
                "response_format",
            ),
            (
                json!({"structured_outputs": {"regex": "a+"}}),
                "structured_outputs",
            ),
            (
                json!({"guided_json": "{\"type\": \"string\"}"}),
                "guided_json",
            ),
            (json!({"guided_choice": ["a", "b"]}), "guided_choice"),
            (json!({"guided_grammar": "start: \"x\""}), "guided_grammar"),
        ];
        for (body, field) in cases {
            let got = requested(&body).expect("valid").expect("a constraint");
            assert_eq!(got.0, field, "{body}");
        }
        assert!(requested(&json!({"response_format": {"type": "text"}}))
            .expect("valid")
            .is_none());
    }

    #[test]
    fn two_constraints_or_bad_json_are_refused() {
        let e = requested(&json!({"guided_regex": "a", "guided_choice": ["b"]})).unwrap_err();
        assert_eq!(e.status, 400);
        let e = requested(&json!({"guided_json": "{not json"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("guided_json"));
        let e = requested(&json!({"response_format": {"type": "xml"}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format"));
    }
}
