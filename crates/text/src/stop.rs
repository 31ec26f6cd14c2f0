//! Stop strings matched across chunk (token) boundaries, with hold-back.

/// The most stop strings a request may give (OpenAI allows 4; we are more generous).
pub const MAX_STOP_STRINGS: usize = 16;

/// The most bytes (UTF-8) one stop string may have.
pub const MAX_STOP_STRING_BYTES: usize = 256;

/// Why a list of stop strings was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopStringError {
    #[error("too many stop strings: {count} (at most {max})")]
    TooMany { count: usize, max: usize },
    #[error("stop string {index} is {len} bytes long (at most {max})")]
    TooLong {
        index: usize,
        len: usize,
        max: usize,
    },
    #[error("stop string {index} is empty")]
    Empty { index: usize },
}

/// A validated list of stop strings.
///
/// Invariants: at most [`MAX_STOP_STRINGS`] strings, each non-empty and at most
/// [`MAX_STOP_STRING_BYTES`] bytes (or the bounds given to [`StopStrings::with_limits`]);
/// `max_len` is the longest one's length in bytes (0 when
/// there are none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStrings {
    strings: Vec<String>,
    max_len: usize,
}

impl StopStrings {
    /// Validates `strings` (kept in the given order; duplicates are allowed) against the
    /// default bounds [`MAX_STOP_STRINGS`] and [`MAX_STOP_STRING_BYTES`].
    pub fn new<I, S>(strings: I) -> Result<Self, StopStringError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_limits(strings, MAX_STOP_STRINGS, MAX_STOP_STRING_BYTES)
    }

    /// Validates `strings` against at most `max_count` strings of at most `max_bytes` bytes.
    pub fn with_limits<I, S>(
        strings: I,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<Self, StopStringError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let strings: Vec<String> = strings.into_iter().map(Into::into).collect();
        if strings.len() > max_count {
            return Err(StopStringError::TooMany {
                count: strings.len(),
                max: max_count,
            });
        }
        for (index, s) in strings.iter().enumerate() {
            if s.is_empty() {
                return Err(StopStringError::Empty { index });
            }
            if s.len() > max_bytes {
                return Err(StopStringError::TooLong {
                    index,
                    len: s.len(),
                    max: max_bytes,
                });
            }
        }
        let max_len = strings.iter().map(String::len).max().unwrap_or(0);
        Ok(Self { strings, max_len })
    }

    /// No stop strings at all.
    pub fn none() -> Self {
        Self::default()
    }

    /// The stop strings, in the order given.
    pub fn as_slice(&self) -> &[String] {
        &self.strings
    }

    /// Whether there are no stop strings.
    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }

    /// The first stop-string occurrence in `text` by the rule of [`StopStringMatcher`]:
    /// `(start, end, index)` byte offsets into `text` and index into the list.
    pub fn first_match(&self, text: &str) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None;
        for (index, s) in self.strings.iter().enumerate() {
            let Some(start) = text.find(s.as_str()) else {
                continue;
            };
            let end = start + s.len();
            // Earliest end first; at the same end, the earliest start (the longest string);
            // then the first in the list (only duplicates can tie on both).
            let better = match best {
                None => true,
                Some((b_start, b_end, _)) => (end, start) < (b_end, b_start),
            };
            if better {
                best = Some((start, end, index));
            }
        }
        best
    }

    /// The smallest char-boundary offset `p` such that `text[p..]` is a non-empty proper
    /// prefix of some stop string (a match that more text could complete), or `text.len()`.
    fn partial_match_start(&self, text: &str) -> usize {
        if self.max_len == 0 {
            return text.len();
        }
        let lowest = text.len().saturating_sub(self.max_len - 1);
        text.char_indices()
            .map(|(p, _)| p)
            .filter(|&p| p >= lowest)
            .find(|&p| {
                let tail = &text[p..];
                self.strings
                    .iter()
                    .any(|s| s.len() > tail.len() && s.starts_with(tail))
            })
            .unwrap_or(text.len())
    }
}

/// Which stop string ended the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopMatch {
    /// Index into the list the [`StopStrings`] were built from.
    pub index: usize,
    /// The stop string itself.
    pub stop: String,
}

/// The text that may be emitted after one input (a text chunk for [`StopStringMatcher`], a
/// token for [`crate::TextStream`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextDelta {
    /// Text that is safe to emit now (possibly empty).
    pub text: String,
    /// Set once, on the input that completed a stop string; nothing is emitted after it.
    pub stopped: Option<StopMatch>,
}

/// Cuts a stream of text chunks at the first stop string.
///
/// **Which stop string is "first"**: the occurrence that is complete earliest in the text
/// (smallest end offset), which is the first one a streaming reader can see; among
/// occurrences ending at the same offset (one is a suffix of the other), the longest;
/// among equal strings, the first in the list. So with stops `["abcd", "bc"]` the text
/// `"xabcd"` stops at `"bc"` and emits `"xa"`. As in vLLM and OpenAI, the matched stop
/// string is not part of the output unless `include_stop_str_in_output`.
///
/// Invariants: the concatenation of all emitted text equals `text[..start]` (or
/// `text[..end]` with `include_stop_str_in_output`) where `text` is the concatenation of
/// all input chunks and `(start, end)` is [`StopStrings::first_match`] of `text`; or all of
/// `text` when it has no match. This holds for every way of cutting `text` into chunks,
/// because the held-back text is exactly the longest tail that is a proper prefix of some
/// stop string, so every occurrence is seen whole in the buffer the moment it completes.
/// Without `include_stop_str_in_output`, no byte of the matched occurrence is ever
/// emitted. Held-back text is shorter than the longest stop string between calls.
#[derive(Debug, Clone)]
pub struct StopStringMatcher {
    stops: StopStrings,
    include_stop_str_in_output: bool,
    /// Text received but not yet emitted (a possible start of a stop string).
    held: String,
    /// The match that ended the stream, once there is one.
    stopped: Option<StopMatch>,
}

impl StopStringMatcher {
    /// A matcher for `stops`; with `include_stop_str_in_output`, the matched stop string is
    /// emitted as the end of the text.
    pub fn new(stops: StopStrings, include_stop_str_in_output: bool) -> Self {
        Self {
            stops,
            include_stop_str_in_output,
            held: String::new(),
            stopped: None,
        }
    }

    /// The match that ended the stream, if any.
    pub fn stopped(&self) -> Option<&StopMatch> {
        self.stopped.as_ref()
    }

    /// Consumes `chunk` and returns what may be emitted now; once stopped, always empty.
    pub fn push(&mut self, chunk: &str) -> TextDelta {
        if self.stopped.is_some() {
            return TextDelta::default();
        }
        self.held.push_str(chunk);
        if let Some((start, end, index)) = self.stops.first_match(&self.held) {
            let cut = if self.include_stop_str_in_output {
                end
            } else {
                start
            };
            self.held.truncate(cut);
            let stop = StopMatch {
                index,
                stop: self.stops.as_slice()[index].clone(),
            };
            self.stopped = Some(stop.clone());
            return TextDelta {
                text: std::mem::take(&mut self.held),
                stopped: Some(stop),
            };
        }
        let keep_from = self.stops.partial_match_start(&self.held);
        let rest = self.held.split_off(keep_from);
        TextDelta {
            text: std::mem::replace(&mut self.held, rest),
            stopped: None,
        }
    }

    /// Ends the stream without a stop: returns the held-back text (empty once stopped).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(list: &[&str]) -> StopStrings {
        StopStrings::new(list.iter().copied()).expect("valid stop strings")
    }

    #[test]
    fn partial_match_start_finds_the_longest_live_tail() {
        let s = stops(&["abc", "bcd"]);
        assert_eq!(s.partial_match_start("xxab"), 2);
        assert_eq!(s.partial_match_start("xxb"), 2);
        assert_eq!(s.partial_match_start("xxbc"), 2);
        assert_eq!(s.partial_match_start("xxx"), 3);
        assert_eq!(s.partial_match_start(""), 0);
        assert_eq!(stops(&[]).partial_match_start("abc"), 3);
    }

    #[test]
    fn partial_match_respects_char_boundaries() {
        // "é" is C3 A9; a stop starting with "é" must hold the whole character.
        let s = stops(&["éx"]);
        assert_eq!(s.partial_match_start("aé"), 1);
        assert_eq!(s.partial_match_start("a\u{e8}"), 3);
    }

    #[test]
    fn first_match_prefers_the_earliest_end_then_the_longest() {
        let s = stops(&["abcd", "bc", "c"]);
        assert_eq!(s.first_match("xabcd"), Some((2, 4, 1)));
        let s = stops(&["c", "bc"]);
        assert_eq!(s.first_match("abc"), Some((1, 3, 1)));
        let s = stops(&["x", "x"]);
        assert_eq!(s.first_match("ax"), Some((1, 2, 0)));
        assert_eq!(s.first_match("ab"), None);
    }
}
