//! What the [`crate::OutputProcessor`] hands its caller for one request: the request's
//! admission, and deltas of its output (new text, the token behind it, the finish).

use tandem_engine::engine::PromptTokenLogprob;
use tandem_engine::FinishReason;
use tandem_model::batch::TokenId;

use crate::BeamText;

/// Why a request ended, as clients are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Aborted (cancelled, shutting down).
    Abort,
    /// The model, the engine or the text layer failed for this request.
    Error(String),
    /// The request's own parameters left nothing to sample (a grammar's dead end, every
    /// token suppressed): the client's mistake, found while generating.
    Refused(String),
}

impl Finish {
    /// The `finish_reason` string (an error or a refusal reports `error`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Abort => "abort",
            Finish::Error(_) | Finish::Refused(_) => "error",
        }
    }

    /// The failure's message, if the request failed ([`Finish::Error`] or
    /// [`Finish::Refused`]).
    pub fn failure(&self) -> Option<&str> {
        match self {
            Finish::Error(m) | Finish::Refused(m) => Some(m),
            _ => None,
        }
    }
}

impl From<FinishReason> for Finish {
    fn from(reason: FinishReason) -> Finish {
        match reason {
            FinishReason::Stop => Finish::Stop,
            FinishReason::Length => Finish::Length,
            FinishReason::Abort => Finish::Abort,
            FinishReason::Error(e) => Finish::Error(e),
            FinishReason::Refused(e) => Finish::Refused(e),
        }
    }
}

/// A generated token with its raw-distribution logprob and alternatives (most likely
/// first), as the engine reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    pub token: TokenId,
    /// Its raw logprob, for a request that asked for logprobs.
    pub logprob: Option<f32>,
    pub top_logprobs: Vec<(TokenId, f32)>,
}

/// One step of a request's output: the text that became safe to show (possibly empty:
/// held back for an incomplete character or a possible stop string), the token that
/// produced it, and the finish on the request's last delta.
///
/// Concatenating the `text` of all deltas of a request gives its whole text; its tokens
/// are the `token`s of the deltas, in order, up to the stop.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestDelta {
    pub text: String,
    /// The generated token this delta is for (`None` on a finish without a token).
    pub token: Option<GeneratedToken>,
    /// On the request's first delta only: the scores of its prompt (when it asked for
    /// them), every chunk the engine sent, in prompt order.
    pub prompt_logprobs: Vec<PromptTokenLogprob>,
    /// Set on the last delta; nothing follows it.
    pub finish: Option<Finish>,
    /// A beam search's hypotheses, best first, on its last delta (its only one).
    pub beams: Vec<BeamText>,
}

/// What happened to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestOutput {
    /// The request was admitted and `cached_tokens` of its prompt came from the prefix
    /// cache (once, before its deltas; only with the prefix cache on).
    Admitted { cached_tokens: usize },
    /// New output, see [`RequestDelta`].
    Delta(RequestDelta),
}
