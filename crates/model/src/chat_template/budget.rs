//! The budget of one chat-template rendering: MiniJinja fuel (about one unit per
//! instruction) in proportion to the conversation's size, and a cap on the text written.

use std::io;

use minijinja::value::Value;

use crate::error::{ModelError, Result};

/// Fuel every rendering gets, whatever its input: about 25 ms of MiniJinja on this
/// project's CPUs (it burns about 40 million units a second).
const BASE_FUEL: u64 = 1_000_000;

/// Fuel per byte of the conversation (its messages and tools as JSON). Gemma 3's template
/// spends under 3 units per byte of a conversation of short turns; 64 leaves room for
/// templates that do far more per message, while a template that never ends stops after
/// work in proportion to the request.
const FUEL_PER_BYTE: u64 = 64;

/// The most text one rendering may write: far beyond any context length's worth of
/// prompt, far below what would strain memory.
pub(super) const MAX_RENDERED_BYTES: usize = 64 << 20;

/// The fuel of a rendering whose messages and tools take `input_bytes` as JSON.
pub(super) fn render_fuel(input_bytes: usize) -> u64 {
    BASE_FUEL.saturating_add(FUEL_PER_BYTE.saturating_mul(input_bytes as u64))
}

/// The length of `value` written as JSON.
pub(super) fn json_bytes(value: &Value) -> usize {
    let mut counter = ByteCount(0);
    // A value that does not serialize counts as empty; the rendering reports it.
    serde_json::to_writer(&mut counter, value).ok();
    counter.0
}

struct ByteCount(usize);

impl io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The rendered text, refusing to grow past [`MAX_RENDERED_BYTES`].
#[derive(Default)]
pub(super) struct CappedText(Vec<u8>);

impl CappedText {
    pub(super) fn into_string(self) -> Result<String> {
        String::from_utf8(self.0).map_err(|e| ModelError::ChatTemplate(e.to_string()))
    }
}

impl io::Write for CappedText {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED_BYTES {
            return Err(io::Error::other(format!(
                "the rendered prompt would pass {MAX_RENDERED_BYTES} bytes"
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
