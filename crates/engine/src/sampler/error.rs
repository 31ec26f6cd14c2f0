//! The sampler's typed errors.

use thiserror::Error;

use crate::FinishReason;

/// Why a sampling parameter was rejected or a row could not be sampled.
///
/// `InvalidParam` is a client mistake (the server maps it to HTTP 400 naming `field`);
/// `NonFiniteLogits` and `NoCandidates` end only the request whose row produced them.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SamplerError {
    /// A field of [`super::SamplingParams`] is outside its documented range.
    #[error("invalid sampling parameter `{field}`: {reason}")]
    InvalidParam {
        /// The field's name as the OpenAI API spells it (`temperature`, `logit_bias`, ...).
        field: &'static str,
        /// The bound that was violated and the offending value.
        reason: String,
    },
    /// The logits row holds a NaN or an infinite value (a numerical fault of the model).
    #[error("the model produced NaN or infinite logits")]
    NonFiniteLogits,
    /// The logits row is empty (vocabulary of size 0).
    #[error("the logits row is empty")]
    EmptyLogits,
    /// Every token was suppressed (the min_tokens rule forbade the whole vocabulary).
    #[error("no token can be sampled: every token is suppressed")]
    NoCandidates,
    /// The request's grammar allows no token here (a dead end) or its parser failed.
    #[error("structured output constraint: {0}")]
    Constraint(String),
}

impl SamplerError {
    /// How a sequence whose row failed with this error ends: refused for what the request
    /// asked (a parameter, a grammar's dead end, every token suppressed), an error for what
    /// the model produced.
    pub fn finish_reason(&self) -> FinishReason {
        match self {
            SamplerError::InvalidParam { .. }
            | SamplerError::NoCandidates
            | SamplerError::Constraint(_) => FinishReason::Refused(self.to_string()),
            SamplerError::NonFiniteLogits | SamplerError::EmptyLogits => {
                FinishReason::Error(self.to_string())
            }
        }
    }

    /// Shorthand for [`SamplerError::InvalidParam`].
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> SamplerError {
        SamplerError::InvalidParam {
            field,
            reason: reason.into(),
        }
    }
}
