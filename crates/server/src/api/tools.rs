//! Tool calling in chat: `tools`, `tool_choice` (`none`, `auto`, `required`, a named
//! function) and the `message.tool_calls` / `delta.tool_calls` of the answer.
//!
//! - The tools reach the model through the chat template's `tools` variable; a template that
//!   never mentions `tools` gets them as a system message in the Hermes format instead
//!   (`<tools>` JSON, calls as `<tool_call>{"name", "arguments"}</tool_call>`).
//! - `required`: the output is constrained to one Hermes `<tool_call>` block whose JSON is
//!   one of the tools with arguments matching its schema; `finish_reason: "tool_calls"`.
//!   A named function: the output is constrained to that function's arguments JSON;
//!   `finish_reason: "stop"` (as OpenAI answers).
//! - `auto`: the model's text is parsed for `<tool_call>` blocks; any found become
//!   `tool_calls` (`finish_reason: "tool_calls"`), the rest stays `content`.
//!
//! A streamed answer with tools holds the text back and sends it, or the calls, in the
//! choice's last chunk (the official client assembles `delta.tool_calls` from it).

use serde_json::{json, Value};
use tandem_engine::sampler::GrammarSpec;

use crate::error::{ApiError, ApiResult};

/// What the answer may or must contain.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolMode {
    /// Tools may be called; calls are parsed from the text.
    Auto,
    /// One call to one of the tools is required.
    Required,
    /// One call to this function is required.
    Named(String),
}

/// The request's tools (each `{"type": "function", "function": {"name", "parameters"}}`)
/// and mode; `None` without tools or with `tool_choice: "none"`.
pub fn mode(tools: Option<&Value>, choice: Option<&Value>) -> ApiResult<Option<ToolMode>> {
    let Some(tools) = tools else {
        return match choice {
            None => Ok(None),
            Some(_) => Err(ApiError::field("tool_choice", "needs `tools`")),
        };
    };
    let names = tool_names(tools)?;
    match choice {
        None => Ok(Some(ToolMode::Auto)),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(None),
            "auto" => Ok(Some(ToolMode::Auto)),
            "required" => Ok(Some(ToolMode::Required)),
            other => Err(ApiError::field(
                "tool_choice",
                format!("must be none, auto, required or a function, got `{other}`"),
            )),
        },
        Some(v) => {
            let name = v["function"]["name"]
                .as_str()
                .ok_or_else(|| ApiError::field("tool_choice", "a function needs a name"))?;
            if !names.iter().any(|n| n == name) {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("`{name}` is not one of the tools"),
                ));
            }
            Ok(Some(ToolMode::Named(name.to_string())))
        }
    }
}

/// The function names of `tools`, checked.
fn tool_names(tools: &Value) -> ApiResult<Vec<String>> {
    let list = tools
        .as_array()
        .filter(|l| !l.is_empty())
        .ok_or_else(|| ApiError::field("tools", "must be a non-empty list"))?;
    list.iter()
        .map(|t| {
            t["function"]["name"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| ApiError::field("tools", "every tool needs `function.name`"))
        })
        .collect()
}

/// A tool's parameter schema (any object when it gives none).
fn parameters(tool: &Value) -> Value {
    match &tool["function"]["parameters"] {
        Value::Null => json!({"type": "object"}),
        p => p.clone(),
    }
}

/// The constraint a mode puts on the output (none for `auto`).
pub fn constraint(tools: &Value, mode: &ToolMode) -> Option<GrammarSpec> {
    let list = tools.as_array()?;
    match mode {
        ToolMode::Auto => None,
        ToolMode::Named(name) => {
            let tool = list.iter().find(|t| t["function"]["name"] == **name)?;
            Some(GrammarSpec::JsonSchema(parameters(tool)))
        }
        ToolMode::Required => {
            let alternatives: Vec<String> = list
                .iter()
                .map(|t| {
                    let schema = json!({"type": "object", "properties": {
                        "name": {"const": t["function"]["name"]},
                        "arguments": parameters(t)},
                        "required": ["name", "arguments"], "additionalProperties": false});
                    format!("%json {schema}")
                })
                .collect();
            Some(GrammarSpec::Lark(format!(
                "start: \"<tool_call>\" call \"</tool_call>\"\ncall: {}\n",
                alternatives.join(" | ")
            )))
        }
    }
}

/// The system message that describes the tools to a template without a `tools` variable.
pub fn system_prompt(tools: &Value) -> String {
    let list: Vec<String> = tools
        .as_array()
        .map(|l| l.iter().map(Value::to_string).collect())
        .unwrap_or_default();
    format!(
        "You may call one or more functions. The functions are listed in <tools></tools>:\n\
         <tools>\n{}\n</tools>\n\
         To call a function, answer with a JSON object with the function name and its \
         arguments inside <tool_call></tool_call> tags:\n\
         <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
        list.join("\n")
    )
}

/// The parsed answer: its remaining text and its calls.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAnswer {
    pub content: Option<String>,
    /// `(name, arguments as JSON text)` per call.
    pub calls: Vec<(String, String)>,
}

/// Reads the calls out of `text` under `mode`.
pub fn parse(text: &str, mode: &ToolMode) -> ToolAnswer {
    if let ToolMode::Named(name) = mode {
        return ToolAnswer {
            content: None,
            calls: vec![(name.clone(), text.to_string())],
        };
    }
    let mut calls = Vec::new();
    let mut content = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("<tool_call>") {
        let after = &rest[start + "<tool_call>".len()..];
        let Some(end) = after.find("</tool_call>") else {
            break;
        };
        match serde_json::from_str::<Value>(after[..end].trim()) {
            Ok(v) if v["name"].is_string() => {
                let name = v["name"].as_str().unwrap_or_default().to_string();
                let args = match &v["arguments"] {
                    Value::Null => "{}".to_string(),
                    a => a.to_string(),
                };
                content.push_str(&rest[..start]);
                calls.push((name, args));
            }
            _ => content.push_str(&rest[..start + "<tool_call>".len() + end]),
        }
        rest = &after[end + "</tool_call>".len()..];
    }
    content.push_str(rest);
    let content = content.trim();
    ToolAnswer {
        content: (!content.is_empty() || calls.is_empty()).then(|| content.to_string()),
        calls,
    }
}

/// The `tool_calls` array of an answer; `index_field` adds each call's `index` (streaming).
pub fn calls_json(answer: &ToolAnswer, id_prefix: &str, index_field: bool) -> Value {
    let calls: Vec<Value> = answer
        .calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            let mut c = json!({"id": format!("call_{id_prefix}_{i}"), "type": "function",
                               "function": {"name": name, "arguments": args}});
            if index_field {
                c["index"] = json!(i);
            }
            c
        })
        .collect();
    Value::Array(calls)
}

/// The finish reason OpenAI gives: `tool_calls` when calls were made (`stop` for a named
/// function), else the engine's.
pub fn finish_reason<'a>(answer: &ToolAnswer, mode: &ToolMode, engine: &'a str) -> &'a str {
    match mode {
        ToolMode::Named(_) if engine == "stop" => "stop",
        _ if !answer.calls.is_empty() && engine == "stop" => "tool_calls",
        _ => engine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_calls_are_parsed_and_the_rest_is_content() {
        let a = parse(
            "Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
            &ToolMode::Auto,
        );
        assert_eq!(a.calls, vec![("f".to_string(), "{\"x\":1}".to_string())]);
        assert_eq!(a.content.as_deref(), Some("Sure."));
        let a = parse("no calls", &ToolMode::Auto);
        assert!(a.calls.is_empty());
        assert_eq!(a.content.as_deref(), Some("no calls"));
    }

    #[test]
    fn modes_are_checked() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        assert_eq!(mode(Some(&tools), None).ok(), Some(Some(ToolMode::Auto)));
        assert_eq!(mode(Some(&tools), Some(&json!("none"))).ok(), Some(None));
        let named = json!({"type": "function", "function": {"name": "g"}});
        let e = mode(Some(&tools), Some(&named)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(mode(None, Some(&json!("auto"))).is_err());
    }
}
