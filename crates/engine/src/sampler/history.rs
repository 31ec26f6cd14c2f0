//! The penalties' part of a request's processors, kept from step to step: every token of
//! the prompt (for the repetition penalty) and of the output (for all three penalties) with
//! what the penalties need of it, ascending by id (`processors.rs` adds the bias and the
//! suppressed stop tokens). Built once when the request starts and updated by one entry per
//! generated token, instead of merged anew from the prompt and the output counts every
//! step: a long prompt then costs one copy per step, not a merge.

use tandem_model::logit_processing::TokenAdjustment;

use super::params::SamplingParams;

/// Which penalties a request has, so which tokens its history lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PenaltyKinds {
    /// The repetition penalty: prompt and output tokens are seen.
    pub(crate) repetition: bool,
    /// The presence or frequency penalty: output tokens are counted.
    pub(crate) counted: bool,
}

impl PenaltyKinds {
    pub(crate) fn of(params: &SamplingParams) -> PenaltyKinds {
        PenaltyKinds {
            repetition: params.repetition_penalty != 1.0,
            counted: params.presence_penalty != 0.0 || params.frequency_penalty != 0.0,
        }
    }

    /// Whether any penalty applies (an empty history otherwise).
    pub(crate) fn any(self) -> bool {
        self.repetition || self.counted
    }
}

/// One request's penalty list, for the kinds it was made for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct History {
    pub(crate) kinds: PenaltyKinds,
    /// Ascending by id, each once.
    pub(crate) tokens: Vec<TokenAdjustment>,
}

impl History {
    /// The list of `kinds` for the distinct sorted `prompt` and the output `counts`
    /// (ascending by id).
    pub(crate) fn new(
        kinds: PenaltyKinds,
        prompt: &[u32],
        counts: impl Iterator<Item = (u32, u32)>,
    ) -> History {
        let mut h = History {
            kinds,
            tokens: Vec::new(),
        };
        if kinds.repetition {
            h.tokens = prompt.iter().map(|&id| entry(id, true, 0)).collect();
        }
        for (id, count) in counts {
            h.set(id, prompt.binary_search(&id).is_ok(), count);
        }
        h
    }

    /// Records that `id`, in the prompt or not (`in_prompt`), now occurs `count` times in the
    /// output: its entry is updated, added or dropped.
    pub(crate) fn set(&mut self, id: u32, in_prompt: bool, count: u32) {
        let at = self.tokens.binary_search_by_key(&id, |t| t.id);
        let seen = self.kinds.repetition && (in_prompt || count > 0);
        let counted = if self.kinds.counted { count } else { 0 };
        match (at, seen || counted > 0) {
            (Ok(i), true) => self.tokens[i] = entry(id, seen, counted),
            (Ok(i), false) => {
                self.tokens.remove(i);
            }
            (Err(i), true) => self.tokens.insert(i, entry(id, seen, counted)),
            (Err(_), false) => {}
        }
    }
}

fn entry(id: u32, seen: bool, count: u32) -> TokenAdjustment {
    TokenAdjustment {
        id,
        bias: 0.0,
        count,
        seen,
        suppressed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::state::SamplerState;

    /// The kept list after any appends and retractions is the one built from scratch.
    #[test]
    fn the_kept_list_equals_the_list_built_from_scratch() {
        let mut rng = 0x1234_5678_u64;
        let mut next = |below: u64| {
            rng = rng
                .wrapping_mul(0x5851_f42d_4c95_7f2d)
                .wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) % below
        };
        for case in 0..200 {
            let params = SamplingParams {
                repetition_penalty: [1.0, 1.2][case % 2],
                presence_penalty: [0.0, 0.5, 0.0][case / 2 % 3],
                frequency_penalty: [0.0, 0.0, 0.3][case / 2 % 3],
                ..SamplingParams::default()
            };
            let kinds = PenaltyKinds::of(&params);
            let prompt: Vec<u32> = (0..next(20)).map(|_| next(30) as u32).collect();
            let mut state = SamplerState::new(0, &prompt).with_penalties(&params);
            let mut appended = Vec::new();
            for _ in 0..next(40) {
                if !appended.is_empty() && next(4) == 0 {
                    let at = next(appended.len() as u64) as usize;
                    state.retract_output(appended.swap_remove(at));
                } else {
                    let t = next(30) as u32;
                    state.append_output(t);
                    appended.push(t);
                }
                let scratch = History::new(kinds, state.prompt_tokens(), state.output_counts());
                let kept = state.history(kinds).unwrap_or(&[]);
                assert_eq!(kept, scratch.tokens.as_slice(), "case {case}");
                assert_eq!(kinds.any(), state.history(kinds).is_some(), "case {case}");
            }
        }
    }
}
