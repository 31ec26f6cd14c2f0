//! Rendering a conversation to prompt text with the model's Jinja chat template, the way
//! Hugging Face transformers' `apply_chat_template(..., tokenize=False)` does.
//!
//! The environment mirrors transformers': `trim_blocks` and `lstrip_blocks` on, Python string
//! and dict methods (`.strip()`, `.startswith()`, `.items()`, ...), `raise_exception(msg)`,
//! `strftime_now(fmt)`, a `tojson` filter that writes like Python's `json.dumps`, and the
//! variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.
//!
//! A template comes from the model file, which is untrusted input, and renders on a server's
//! request threads: each rendering runs on a budget (`budget.rs`: fuel in proportion to the
//! conversation's size, a cap on the text),
//! so a template that loops without end or writes without end fails that request
//! ([`ModelError::ChatTemplateBudget`]) instead of holding a thread. (The fuel bounds
//! instructions, not memory: a template that doubles a string in a loop can still grow it
//! within its fuel; MiniJinja has no hook to bound that.)

mod budget;
mod conversation;
mod py_json;
mod strftime;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
pub use py_json::{dumps as python_json_dumps, DumpOptions};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant", "tool", ...
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Gemma 3's chat template (as in Google's Gemma 3 `tokenizer_config.json`), for `gemma3`
/// GGUF files that carry none (the converted base models): the turns the model family was
/// trained with, rather than no chat at all.
pub const GEMMA3_TEMPLATE: &str = include_str!("gemma3.jinja");

/// The template used for a model of `architecture` whose file carries none, if any.
pub fn builtin_template(architecture: crate::config::Architecture) -> Option<&'static str> {
    match architecture {
        crate::config::Architecture::Gemma3 => Some(GEMMA3_TEMPLATE),
        _ => None,
    }
}

/// What a rendering is given besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// The request's tools (the template's `tools` variable; `none` when absent).
    pub tools: Option<&'a serde_json::Value>,
    /// Whether the prompt ends with the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// Extra template variables (a request's `chat_template_kwargs`, e.g. Qwen3's
    /// `enable_thinking`).
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// Name under which the template is stored in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template with the special-token texts it may print.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

fn jinja_err(context: &str, e: &JinjaError) -> ModelError {
    // `{:#}` includes the template location and the chain of causes.
    ModelError::ChatTemplate(format!("{context}: {e:#}"))
}

/// `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(message: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// `value | tojson(indent=None, sort_keys=False)`, as Python's `json.dumps`.
fn tojson(
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, JinjaError> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(usize::try_from(v)?),
        None => None,
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let options = DumpOptions { indent, sort_keys };
    Ok(Value::from(py_json::dumps(value, options)?))
}

impl ChatTemplate {
    /// Compiles `source`. `bos`/`eos` are the texts of the BOS/EOS tokens, exposed to the
    /// template as `bos_token`/`eos_token` (empty strings when absent).
    pub fn new(source: &str, bos: Option<String>, eos: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |fmt: String| strftime::strftime_now(&fmt));
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| jinja_err("cannot compile template", &e))?;
        Ok(Self {
            env,
            bos_token: bos,
            eos_token: eos,
        })
    }

    /// The prompt text for `messages`; with `add_generation_prompt`, ends with the opening
    /// of an assistant turn. Errors when the template raises or fails.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let no_extra = Value::from_serialize(serde_json::Map::new());
        self.render_values(
            Value::from_serialize(messages),
            None,
            add_generation_prompt,
            no_extra,
        )
    }

    /// Renders messages given as JSON (with `tool_calls`, `tool_call_id`, ... as the client
    /// sent them) and the request's `tools` (the template's `tools` variable).
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let options = RenderOptions {
            tools,
            add_generation_prompt,
            kwargs: None,
        };
        self.render_with(messages, &options)
    }

    /// [`ChatTemplate::render_json`] with every option. Extra variables may not replace the
    /// template's own inputs or functions ([`ModelError::ChatTemplateKwargs`]).
    pub fn render_with(
        &self,
        messages: &serde_json::Value,
        options: &RenderOptions<'_>,
    ) -> Result<String> {
        let no_kwargs = serde_json::Map::new();
        let kwargs = options.kwargs.unwrap_or(&no_kwargs);
        if let Some(name) = kwargs.keys().find(|k| self.is_reserved(k)) {
            return Err(ModelError::ChatTemplateKwargs(format!(
                "`{name}` is the template's own; it cannot be set"
            )));
        }
        let tools = options.tools.map(Value::from_serialize);
        let extra = Value::from_serialize(kwargs);
        self.render_values(
            Value::from_serialize(messages),
            tools,
            options.add_generation_prompt,
            extra,
        )
    }

    /// Whether `name` is one of the template's inputs or functions.
    fn is_reserved(&self, name: &str) -> bool {
        const INPUTS: [&str; 5] = [
            "messages",
            "tools",
            "add_generation_prompt",
            "bos_token",
            "eos_token",
        ];
        INPUTS.contains(&name) || self.env.globals().any(|(global, _)| global == name)
    }

    /// The one rendering: `tools` is `none` when absent, as transformers passes it; `extra`
    /// adds variables (none of the others' names).
    fn render_values(
        &self,
        messages: Value,
        tools: Option<Value>,
        add_generation_prompt: bool,
        extra: Value,
    ) -> Result<String> {
        let input = budget::json_bytes(&messages)
            + tools.as_ref().map_or(0, budget::json_bytes)
            + budget::json_bytes(&extra);
        let fuel = budget::render_fuel(input);
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| jinja_err("template missing", &e))?;
        let context = minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
            ..extra
        };
        let mut out = budget::CappedText::default();
        let rendered = template.render_captured_to(context, &mut out).map(drop);
        match rendered {
            Ok(()) => out.into_string(),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(ModelError::ChatTemplateBudget(
                format!("{fuel} units of fuel for a conversation of {input} bytes ran out"),
            )),
            Err(e) if e.kind() == ErrorKind::WriteFailure => Err(ModelError::ChatTemplateBudget(
                format!("the text passed {} bytes", budget::MAX_RENDERED_BYTES),
            )),
            Err(e) => Err(jinja_err("cannot render conversation", &e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &[ChatMessage], gen: bool) -> Result<String> {
        ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into()))?.render(messages, gen)
    }

    #[test]
    fn python_methods_filters_and_variables() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m.role.upper() }}:{{ m['content'].strip() }}|{{ m | tojson }}\n{% endfor %}{% if add_generation_prompt %}GO{{ eos_token }}{% endif %}";
        let msgs = [ChatMessage::new("user", "  hi <b>  ")];
        let out = render(src, &msgs, true).expect("renders");
        assert_eq!(
            out,
            "<s>USER:hi <b>|{\"role\": \"user\", \"content\": \"  hi <b>  \"}\nGO</s>"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        // With trim_blocks the newline after a block tag is dropped; with lstrip_blocks the
        // indentation before it is dropped.
        let src = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}";
        let msgs = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        assert_eq!(render(src, &msgs, false).expect("renders"), "[a]\n[b]\n");
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let src = "{% if messages[0].role != 'system' %}{{ raise_exception('need a system turn') }}{% endif %}";
        let err = render(src, &[ChatMessage::new("user", "x")], false).expect_err("raises");
        assert!(err.to_string().contains("need a system turn"), "{err}");
        assert!(ChatTemplate::new("{% if %}", None, None).is_err());
    }

    /// A template from a hostile or broken model file that never ends (10^10 iterations)
    /// or writes without end (10^13 bytes) fails within its budget, as a budget error.
    #[test]
    fn templates_that_never_end_stop_within_their_budget() {
        let msgs = [ChatMessage::new("user", "hi")];
        for src in [
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "{% for i in range(100000) %}{{ 'x' * 100000000 }}{% endfor %}",
        ] {
            match render(src, &msgs, true) {
                Err(ModelError::ChatTemplateBudget(m)) => eprintln!("{m}"),
                other => panic!("{src}: {other:?}"),
            }
        }
    }

    /// The budget grows with the conversation: Gemma 3's template renders 20,000 turns (a
    /// fixed budget fit for short conversations would refuse them).
    #[test]
    fn long_conversations_render_within_their_budget() {
        let msgs: Vec<ChatMessage> = (0..20_000)
            .map(|i| ChatMessage::new(["user", "assistant"][i % 2], "a short turn"))
            .collect();
        let out = render(GEMMA3_TEMPLATE, &msgs, true).expect("renders");
        assert_eq!(out.matches("<start_of_turn>").count(), 20_001);
    }

    #[test]
    fn strftime_now_prints_a_year() {
        let out = render("{{ strftime_now('%Y') }}", &[], false).expect("renders");
        let year: i32 = out.parse().expect("a number");
        assert!(year >= 2024, "{out}");
    }
}
