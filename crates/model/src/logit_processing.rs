//! The logit processors a request applies before temperature (logit bias, stop tokens
//! suppressed by `min_tokens`, the repetition penalty, the presence and frequency
//! penalties), as one sparse list of adjusted tokens per row: what a runner drawing tokens
//! where its logits are needs to apply them there (`ModelRunner::forward_sample`), and what
//! the engine's sampler applies on the host, so that both paths draw from the same values.
//!
//! A token of the list gets, from its raw logit `l`, in f64:
//! 1. `l + bias` (the sum of the request's biases for it);
//! 2. `-inf` when it is suppressed;
//! 3. when it was seen (in the prompt or the output), `l / r` if `l > 0`, else `l * r`
//!    (the CTRL / Hugging Face repetition penalty `r`);
//! 4. `l - (presence + frequency * count)` for its `count` occurrences in the output
//!    (OpenAI's definition; nothing for a token not generated);
//! 5. the result rounded to f32, finite results clamped to f32's range: logits live in f32
//!    rows, on a device as on the host, and a processed row is one of them.
//!
//! Every other token keeps its raw logit.

/// One token of a row whose logit the processors change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenAdjustment {
    pub id: u32,
    /// Added to the raw logit: the sum, in f64, of the request's biases for this token.
    pub bias: f64,
    /// Occurrences in the output so far (presence and frequency penalties).
    pub count: u32,
    /// In the prompt or the output (repetition penalty).
    pub seen: bool,
    /// Never to be chosen now (a stop token before `min_tokens`).
    pub suppressed: bool,
}

/// The processors of one row.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitProcessing {
    /// `> 0`; 1 is neutral.
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// The tokens whose logit changes, ascending by id, each once.
    pub tokens: Vec<TokenAdjustment>,
}

impl Default for LogitProcessing {
    fn default() -> LogitProcessing {
        LogitProcessing {
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            tokens: Vec::new(),
        }
    }
}

impl LogitProcessing {
    /// Whether the row's processed logits are its raw logits.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The processed logit of token `t` whose raw logit is `raw` (see the module
    /// documentation).
    pub fn value(&self, t: &TokenAdjustment, raw: f32) -> f32 {
        if t.suppressed {
            return f32::NEG_INFINITY;
        }
        let mut v = raw as f64 + t.bias;
        if t.seen {
            let r = self.repetition_penalty as f64;
            v = if v > 0.0 { v / r } else { v * r };
        }
        if t.count > 0 {
            let presence = self.presence_penalty as f64;
            v -= presence + self.frequency_penalty as f64 * t.count as f64;
        }
        to_f32(v)
    }

    /// Applies the processors to `row` in place; ids outside it are ignored.
    pub fn apply(&self, row: &mut [f32]) {
        for t in &self.tokens {
            if let Some(v) = row.get_mut(t.id as usize) {
                *v = self.value(t, *v);
            }
        }
    }

    /// The processing of the same request's next row when `token` is generated in between:
    /// `token` counts once more for the penalties (seen, for the repetition penalty; one more
    /// occurrence, for the presence and frequency penalties), exactly the list the request's
    /// processors give once `token` is appended to its output. A runner applies it to a row
    /// whose input token it carries from an earlier step's pick
    /// (`ModelRunner::launch_sample`). Unchanged without a penalty.
    pub fn with_output(&self, token: u32) -> LogitProcessing {
        let repetition = self.repetition_penalty != 1.0;
        let counted = self.presence_penalty != 0.0 || self.frequency_penalty != 0.0;
        let mut next = self.clone();
        if !self.has_penalties() {
            return next;
        }
        match next.tokens.binary_search_by_key(&token, |t| t.id) {
            Ok(i) => {
                let t = &mut next.tokens[i];
                t.seen |= repetition;
                t.count += u32::from(counted);
            }
            Err(i) => next.tokens.insert(
                i,
                TokenAdjustment {
                    id: token,
                    bias: 0.0,
                    count: u32::from(counted),
                    seen: repetition,
                    suppressed: false,
                },
            ),
        }
        next
    }

    /// Whether a penalty reads the generated tokens (repetition, presence or frequency).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// Checks what a runner relies on: ids ascending, unique and below `vocab`; the
    /// repetition penalty finite and positive; the other penalties and the biases finite.
    pub fn validate(&self, vocab: usize) -> Result<(), String> {
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(format!(
                "repetition penalty must be finite and > 0, got {r}"
            ));
        }
        if !(self.presence_penalty.is_finite() && self.frequency_penalty.is_finite()) {
            return Err("presence and frequency penalties must be finite".into());
        }
        let mut previous: Option<u32> = None;
        for t in &self.tokens {
            if t.id as usize >= vocab || previous.is_some_and(|p| p >= t.id) {
                return Err(format!(
                    "processed token {} out of order or outside the vocabulary ({vocab})",
                    t.id
                ));
            }
            if !t.bias.is_finite() {
                return Err(format!("bias of token {} is not finite", t.id));
            }
            previous = Some(t.id);
        }
        Ok(())
    }
}

/// `v` rounded to f32, a finite value clamped to f32's range first.
fn to_f32(v: f64) -> f32 {
    if v.is_finite() {
        v.clamp(f32::MIN as f64, f32::MAX as f64) as f32
    } else {
        v as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: u32) -> TokenAdjustment {
        TokenAdjustment {
            id,
            bias: 0.0,
            count: 0,
            seen: false,
            suppressed: false,
        }
    }

    #[test]
    fn the_steps_run_in_order_on_each_token() {
        let p = LogitProcessing {
            repetition_penalty: 2.0,
            presence_penalty: 1.0,
            frequency_penalty: 0.25,
            tokens: vec![
                // 1 - 3 = -2, seen: * 2 = -4, twice in the output: - (1 + 0.5) = -5.5.
                TokenAdjustment {
                    bias: -3.0,
                    count: 2,
                    seen: true,
                    ..token(0)
                },
                TokenAdjustment {
                    bias: 100.0,
                    suppressed: true,
                    ..token(1)
                },
                // Seen in the prompt only: 6 / 2, no presence penalty.
                TokenAdjustment {
                    seen: true,
                    ..token(2)
                },
            ],
        };
        let mut row = vec![1.0, 5.0, 6.0, 7.0];
        p.apply(&mut row);
        assert_eq!(row, vec![-5.5, f32::NEG_INFINITY, 3.0, 7.0]);
    }

    #[test]
    fn results_are_rounded_and_clamped_to_f32() {
        let huge = LogitProcessing {
            repetition_penalty: 1e-30,
            tokens: vec![
                TokenAdjustment {
                    seen: true,
                    ..token(0)
                },
                TokenAdjustment {
                    bias: 1e-9,
                    ..token(1)
                },
            ],
            ..LogitProcessing::default()
        };
        let mut row = vec![1e20, 1.0];
        huge.apply(&mut row);
        assert_eq!(row[0], f32::MAX, "1e50 clamps to the largest f32");
        assert_eq!(row[1], (1.0f64 + 1e-9) as f32, "rounded once, from f64");
    }

    #[test]
    fn validation_names_what_a_runner_relies_on() {
        let ok = LogitProcessing {
            tokens: vec![token(1), token(4)],
            ..LogitProcessing::default()
        };
        assert!(ok.validate(5).is_ok());
        assert!(ok.validate(4).is_err(), "id 4 outside a vocabulary of 4");
        let unordered = LogitProcessing {
            tokens: vec![token(4), token(1)],
            ..LogitProcessing::default()
        };
        assert!(unordered.validate(9).is_err());
        let repeated = LogitProcessing {
            tokens: vec![token(2), token(2)],
            ..LogitProcessing::default()
        };
        assert!(repeated.validate(9).is_err());
        for r in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let bad = LogitProcessing {
                repetition_penalty: r,
                ..LogitProcessing::default()
            };
            assert!(bad.validate(9).is_err(), "{r}");
        }
    }
}
