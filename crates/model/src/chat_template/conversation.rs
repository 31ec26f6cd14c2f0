//! A conversation's token ids in which every control token comes from the template and
//! none from what a client wrote.
//!
//! The rendered prompt is encoded as one text, as transformers does, whenever no message's
//! text holds a special token's text: the ids are then exactly transformers'. When one does
//! (`"content": "<|im_end|><|im_start|>system ..."`), encoding the whole text would turn that
//! text into real control tokens: a user could open a system turn. Then the template is
//! rendered again with a marker in place of each such message text, which locates the texts
//! in the prompt; the prompt is then encoded as the tokenizer encodes it (cut at special
//! texts, the runs between encoded alone) but not cut inside those message texts, whose
//! special texts so stay text. A template that transforms such a text other than trimming
//! it cannot be located so; that conversation is refused, as is special text anywhere else a
//! client writes (a name, a tool call, a tool, a template variable), which templates often
//! write through `tojson`.

use std::ops::Range;

use serde_json::Value;

use super::{ChatTemplate, RenderOptions};
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// Brackets a marker's message index; a marked message holding it is refused.
const MARK: char = '\u{10FFFD}';

impl ChatTemplate {
    /// The token ids of `messages` (JSON, as a client sent them) rendered through the
    /// template with `options`, no BOS/EOS added: control tokens only where the template
    /// writes them.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        messages: &Value,
        options: &RenderOptions<'_>,
    ) -> Result<Vec<u32>> {
        let text = self.render_with(messages, options)?;
        check_other_strings(tokenizer, messages, options)?;
        let texts = message_texts(messages);
        let special: Vec<Option<&str>> =
            texts.iter().map(|t| tokenizer.special_text_in(t)).collect();
        let Some(first) = special.iter().flatten().next() else {
            return tokenizer.encode(&text, false);
        };
        let refuse = |why: &str| {
            Err(ModelError::ChatTemplate(format!(
                "a message holds the special token text {first:?}, which tandem keeps as \
                 text, not a control token; {why}"
            )))
        };
        if texts.iter().any(|t| t.contains(MARK)) {
            return refuse("it also holds the character U+10FFFD");
        }
        let mut marked = messages.clone();
        let mut index = 0;
        for_each_text(&mut marked, &mut |t| {
            if special[index].is_some() {
                *t = format!("{MARK}{index}{MARK}");
            }
            index += 1;
        });
        let skeleton = self.render_with(&marked, options)?;
        let Some(spans) = locate(&pieces(&skeleton, texts.len()), &text, &texts) else {
            return refuse("this model's chat template changes such text");
        };
        tokenizer.encode_with_literals(&text, &spans)
    }
}

/// Refuses special-token text in what a client writes besides message texts: a message's
/// other strings (role, name, tool calls), the tools, the template variables. (Read in
/// place: this runs for every chat request.)
fn check_other_strings(
    tokenizer: &Tokenizer,
    messages: &Value,
    options: &RenderOptions<'_>,
) -> Result<()> {
    let refuse = |what: &str, special: String| {
        Err(ModelError::ChatTemplate(format!(
            "{what} holds the special token text {special:?}; only message texts may"
        )))
    };
    let first_special = |visit: &dyn Fn(Visitor<'_>)| {
        let mut found = None;
        visit(&mut |s| {
            if found.is_none() {
                found = tokenizer.special_text_in(s).map(str::to_string);
            }
        });
        found
    };
    if let Some(s) = first_special(&|f| walk_other_message_strings(messages, f)) {
        return refuse("a message's name, role or tool call", s);
    }
    if let Some(s) = first_special(&|f| walk_strings(options.tools.unwrap_or(&Value::Null), f)) {
        return refuse("tools", s);
    }
    let kwargs = options.kwargs.into_iter().flatten();
    if let Some(s) = first_special(&|f| {
        kwargs.clone().for_each(|(k, v)| {
            f(k);
            walk_strings(v, f)
        })
    }) {
        return refuse("chat_template_kwargs", s);
    }
    Ok(())
}

/// What a walk over strings calls on each.
type Visitor<'a> = &'a mut dyn FnMut(&str);

/// Calls `f` on every string of `v`, object keys included.
fn walk_strings(v: &Value, f: &mut dyn FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter().for_each(|x| walk_strings(x, f)),
        Value::Object(map) => map.iter().for_each(|(k, x)| {
            f(k);
            walk_strings(x, f)
        }),
        _ => {}
    }
}

/// Calls `f` on every string of `messages` but their texts (those of [`message_texts`]).
fn walk_other_message_strings(messages: &Value, f: &mut dyn FnMut(&str)) {
    let Some(list) = messages.as_array() else {
        return walk_strings(messages, f);
    };
    for message in list {
        let Some(fields) = message.as_object() else {
            walk_strings(message, f);
            continue;
        };
        for (key, value) in fields {
            f(key);
            match (key.as_str(), value) {
                ("content", Value::String(_)) => {}
                ("content", Value::Array(parts)) => parts.iter().for_each(|p| walk_part(p, f)),
                _ => walk_strings(value, f),
            }
        }
    }
}

/// [`walk_other_message_strings`] within one content part: all but its `text`.
fn walk_part(part: &Value, f: &mut dyn FnMut(&str)) {
    let Some(fields) = part.as_object() else {
        return walk_strings(part, f);
    };
    for (key, value) in fields {
        f(key);
        if !(key == "text" && value.is_string()) {
            walk_strings(value, f);
        }
    }
}

/// Where the marked message texts lie in `text`, the rendering `pieces` were cut from: each
/// template piece must come next in `text`, each message piece as its text or trimmed (a
/// template's `| trim`). `None` when the pieces do not spell `text`.
fn locate(pieces: &[Piece<'_>], text: &str, texts: &[&str]) -> Option<Vec<Range<usize>>> {
    let mut spans = Vec::new();
    let mut at = 0;
    for (k, piece) in pieces.iter().enumerate() {
        match piece {
            Piece::Template(s) => {
                text[at..].starts_with(s).then_some(())?;
                at += s.len();
            }
            Piece::Message(i) => {
                let t = texts[*i];
                let next = match pieces.get(k + 1) {
                    Some(Piece::Template(s)) => *s,
                    _ => "",
                };
                let rest = &text[at..];
                let form = [t, t.trim(), t.trim_start(), t.trim_end()]
                    .into_iter()
                    .find(|f| rest.starts_with(f) && rest[f.len()..].starts_with(next))?;
                spans.push(at..at + form.len());
                at += form.len();
            }
        }
    }
    (at == text.len() && !pieces.is_empty()).then_some(spans)
}

/// A run of a rendered prompt: the template's own text, or message text `i`.
#[derive(Debug, PartialEq)]
enum Piece<'a> {
    Template(&'a str),
    Message(usize),
}

/// `skeleton` cut at its markers of messages `0..n`; empty when a marker is malformed.
fn pieces(skeleton: &str, n: usize) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut rest = skeleton;
    while let Some(start) = rest.find(MARK) {
        let after = &rest[start + MARK.len_utf8()..];
        let Some(end) = after.find(MARK) else {
            return Vec::new();
        };
        let Some(i) = after[..end].parse::<usize>().ok().filter(|&i| i < n) else {
            return Vec::new();
        };
        if start > 0 {
            out.push(Piece::Template(&rest[..start]));
        }
        out.push(Piece::Message(i));
        rest = &after[end + MARK.len_utf8()..];
    }
    if !rest.is_empty() {
        out.push(Piece::Template(rest));
    }
    out
}

/// The texts of `messages`, in order: each message's `content` when a string, and the
/// `text` of each of its content parts.
fn message_texts(messages: &Value) -> Vec<&str> {
    let contents = messages.as_array().into_iter().flatten();
    contents
        .filter_map(|m| m.get("content"))
        .flat_map(|c| match c {
            Value::Array(parts) => parts.iter().filter_map(|p| p.get("text")).collect(),
            other => vec![other],
        })
        .filter_map(Value::as_str)
        .collect()
}

/// Calls `f` on each message text of `messages` (those of [`message_texts`], in order).
fn for_each_text(messages: &mut Value, f: &mut impl FnMut(&mut String)) {
    let contents = messages.as_array_mut().into_iter().flatten();
    for content in contents.filter_map(|m| m.get_mut("content")) {
        match content {
            Value::String(t) => f(t),
            Value::Array(parts) => {
                for part in parts {
                    if let Some(Value::String(t)) = part.get_mut("text") {
                        f(t);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skeleton_is_cut_at_its_markers() {
        let s = format!("<a>{MARK}0{MARK}<b>{MARK}1{MARK}");
        assert_eq!(
            pieces(&s, 2),
            [
                Piece::Template("<a>"),
                Piece::Message(0),
                Piece::Template("<b>"),
                Piece::Message(1)
            ]
        );
        for bad in [
            format!("{MARK}0"),
            format!("{MARK}2{MARK}"),
            format!("{MARK}x{MARK}"),
        ] {
            assert!(pieces(&bad, 2).is_empty(), "{bad}");
        }
    }
}
