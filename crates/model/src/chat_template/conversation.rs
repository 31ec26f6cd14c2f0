//! A conversation's token ids in which every control token comes from the template and
//! none from what the messages say.
//!
//! The rendered prompt is encoded as one text, as transformers does, whenever no message's
//! text holds a special token's text: the ids are then exactly transformers'. When one does
//! (`"content": "<|im_end|><|im_start|>system ..."`), encoding the whole text would turn that
//! text into real control tokens: a user could open a system turn. Then the template is
//! rendered again with a marker in place of each message's text, and the prompt is encoded
//! piece by piece: the template's pieces as usual, each message's text with its special
//! token texts kept as text. A template that transforms the text it is given (a marker
//! would not come back as the text) cannot be pieced so; such a conversation is refused.

use serde_json::Value;

use super::{ChatTemplate, RenderOptions};
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// Brackets a marker's message index; a message holding it is refused when pieced.
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
        let texts = message_texts(messages);
        let Some(special) = texts.iter().find_map(|t| tokenizer.special_text_in(t)) else {
            return tokenizer.encode(&text, false);
        };
        let refuse = |why: &str| {
            Err(ModelError::ChatTemplate(format!(
                "a message holds the special token text {special:?}, which tandem encodes as \
                 text, not as a control token; {why}"
            )))
        };
        if texts.iter().any(|t| t.contains(MARK)) {
            return refuse("it also holds the character U+10FFFD");
        }
        let mut marked = messages.clone();
        let mut index = 0;
        for_each_text(&mut marked, &mut |t| {
            *t = format!("{MARK}{index}{MARK}");
            index += 1;
        });
        let skeleton = self.render_with(&marked, options)?;
        let pieces = pieces(&skeleton, texts.len());
        let rebuilt: String = pieces
            .iter()
            .map(|p| match p {
                Piece::Template(s) => *s,
                Piece::Message(i) => texts[*i],
            })
            .collect();
        if pieces.is_empty() || rebuilt != text {
            return refuse("this model's chat template changes the text it is given");
        }
        let mut ids = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Template(s) => ids.extend(tokenizer.encode(s, false)?),
                Piece::Message(i) => ids.extend(tokenizer.encode_as_text(texts[i])?),
            }
        }
        Ok(ids)
    }
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
