//! The output processor: the one place that turns a step's [`EngineEvent`]s into
//! per-request outputs, for the CLI and the server alike.
//!
//! Per request it keeps a [`RequestState`] (text stream with stop strings, prompt scores
//! until the first delta) and the caller's tag (the CLI: a result slot; the server: the
//! request's channel and choice index). For each event it hands the caller the request's
//! tag and a [`RequestOutput`]:
//!
//! - `Token` → a delta with the text that became safe to show (possibly empty) and the
//!   token. When a stop string matches (or the token has no text) the delta is the last
//!   one, and the request is ended in the engine at once, within the step that produced
//!   the token: later events of that request are ignored.
//! - `PromptLogprobs` → nothing yet: the scores go out with the request's first delta.
//!   Scores that skip a position, or arrive after the first delta, end the request with an
//!   error.
//! - `Admitted` → passed on (prefix-cache use, for usage reports).
//! - `Finished` → the last delta: the held-back text (which can still complete a stop
//!   string, then the finish is `Stop`), the finish reason, and for a beam search its
//!   hypotheses as text.
//!
//! The engine is reached only through [`RequestControl`] while processing events, so the
//! processor can be driven by scripted events in tests.

use std::collections::HashMap;
use std::sync::Arc;

use tandem_engine::beam_search::{BeamHypothesis, BeamParams};
use tandem_engine::engine::{Engine, EngineEvent, GenerationRequest};
use tandem_engine::{EngineError, FinishReason, SeqId};
use tandem_model::tokenizer::Tokenizer;

use crate::request_state::RequestState;
use crate::{BeamText, Finish, GeneratedToken, RequestDelta, RequestOutput, TextOptions};

/// What the output processor needs from the engine while it processes events.
pub trait RequestControl {
    /// Ends request `id` now (its stop string matched). A request that has already
    /// finished (in the very step being processed) needs nothing.
    fn end(&mut self, id: SeqId);
    /// The hypotheses of finished beam search `id`, best first; `None` for any other
    /// request.
    fn take_beam_result(&mut self, id: SeqId) -> Option<Vec<BeamHypothesis>>;
}

impl RequestControl for Engine {
    fn end(&mut self, id: SeqId) {
        // `abort` fails only for an id the engine no longer knows: one already finished.
        if let Err(e) = self.abort(id) {
            debug_assert!(matches!(e, EngineError::UnknownSeq(_)), "{e}");
        }
    }

    fn take_beam_result(&mut self, id: SeqId) -> Option<Vec<BeamHypothesis>> {
        Engine::take_beam_result(self, id)
    }
}

/// One prompt to run and how its output becomes text.
#[derive(Debug, Clone)]
pub struct TextRequest {
    pub request: GenerationRequest,
    /// Parallel samples of the prompt (`n`), sharing its KV blocks; ignored by beam search.
    pub samples: usize,
    /// Beam search instead of sampling (one request, its hypotheses on the last delta).
    pub beam: Option<BeamParams>,
    pub text: TextOptions,
    /// The request's own draft tokens per step with speculative decoding (`None`: the
    /// engine's setting; ignored by beam search).
    pub num_speculative_tokens: Option<usize>,
}

/// Turns engine events into per-request outputs; `T` is the caller's tag of a request.
#[derive(Debug)]
pub struct OutputProcessor<T> {
    tokenizer: Arc<Tokenizer>,
    requests: HashMap<SeqId, Tracked<T>>,
}

#[derive(Debug)]
struct Tracked<T> {
    tag: T,
    state: RequestState,
}

impl<T> OutputProcessor<T> {
    /// A processor turning tokens into text with `tokenizer`.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Self {
            tokenizer,
            requests: HashMap::new(),
        }
    }

    /// Adds `request` to `engine` and tracks its requests (one per sample, or the beam
    /// search), sample `k` tagged `tag(k)`. Nothing is added when the engine refuses it.
    pub fn add(
        &mut self,
        engine: &mut Engine,
        request: TextRequest,
        mut tag: impl FnMut(usize) -> T,
    ) -> Result<Vec<SeqId>, EngineError> {
        let TextRequest {
            request,
            samples,
            beam,
            text,
            num_speculative_tokens,
        } = request;
        let prompt_logprobs_start = request.prompt_logprobs_start;
        let ids = match beam {
            Some(b) => vec![engine.add_beam_request(request, b)?],
            None => engine.add_request_n(request, samples)?,
        };
        if let (Some(k), None) = (num_speculative_tokens, beam) {
            let set = ids
                .iter()
                .try_for_each(|&id| engine.set_num_speculative_tokens(id, k));
            if let Err(e) = set {
                ids.iter().for_each(|&id| engine.end(id));
                return Err(e);
            }
        }
        for (k, &id) in ids.iter().enumerate() {
            self.track(id, text.clone(), prompt_logprobs_start, tag(k));
        }
        Ok(ids)
    }

    /// Tracks request `id`, already in the engine (see [`RequestState`] for
    /// `prompt_logprobs_start`).
    pub fn track(&mut self, id: SeqId, text: TextOptions, prompt_logprobs_start: usize, tag: T) {
        let state = RequestState::new(self.tokenizer.clone(), text, prompt_logprobs_start);
        self.requests.insert(id, Tracked { tag, state });
    }

    /// Processes one step's events in order, handing `emit` each output with its request's
    /// id and tag. Requests are forgotten after their last delta.
    pub fn process<C: RequestControl + ?Sized>(
        &mut self,
        control: &mut C,
        events: Vec<EngineEvent>,
        mut emit: impl FnMut(SeqId, &T, RequestOutput),
    ) {
        for event in events {
            self.process_event(control, event, &mut emit);
        }
    }

    fn process_event<C: RequestControl + ?Sized>(
        &mut self,
        control: &mut C,
        event: EngineEvent,
        emit: &mut impl FnMut(SeqId, &T, RequestOutput),
    ) {
        match event {
            EngineEvent::Admitted {
                seq_id,
                cached_tokens,
            } => {
                if let Some(r) = self.requests.get(&seq_id) {
                    emit(seq_id, &r.tag, RequestOutput::Admitted { cached_tokens });
                }
            }
            EngineEvent::Finished { seq_id, reason } => {
                // Taken even for a request no longer tracked, so no result is left behind.
                let beams = control.take_beam_result(seq_id);
                if let Some(mut r) = self.requests.remove(&seq_id) {
                    let delta = self.last_delta(&mut r.state, reason, beams);
                    emit(seq_id, &r.tag, RequestOutput::Delta(delta));
                }
            }
            EngineEvent::Token { .. } | EngineEvent::PromptLogprobs { .. } => {
                if let Some((id, delta)) = self.apply(event) {
                    self.deliver(control, id, delta, emit);
                }
            }
        }
    }

    /// A token or prompt scores added to its request: the delta to hand out, if any.
    fn apply(&mut self, event: EngineEvent) -> Option<(SeqId, RequestDelta)> {
        match event {
            EngineEvent::Token {
                seq_id,
                token,
                logprob,
                top_logprobs,
            } => {
                let r = self.requests.get_mut(&seq_id)?;
                let token = GeneratedToken {
                    token,
                    logprob,
                    top_logprobs,
                };
                Some((seq_id, r.state.token(token)))
            }
            EngineEvent::PromptLogprobs {
                seq_id,
                start,
                entries,
            } => {
                let r = self.requests.get_mut(&seq_id)?;
                let message = r.state.prompt_logprobs(start, entries).err()?;
                Some((seq_id, r.state.fail(message)))
            }
            EngineEvent::Admitted { .. } | EngineEvent::Finished { .. } => None,
        }
    }

    /// Hands `delta` of request `id` out; a last delta (stop string, text error) also ends
    /// the request in the engine, which is still generating it.
    fn deliver<C: RequestControl + ?Sized>(
        &mut self,
        control: &mut C,
        id: SeqId,
        delta: RequestDelta,
        emit: &mut impl FnMut(SeqId, &T, RequestOutput),
    ) {
        if delta.finish.is_none() {
            if let Some(r) = self.requests.get(&id) {
                emit(id, &r.tag, RequestOutput::Delta(delta));
            }
        } else if let Some(r) = self.requests.remove(&id) {
            control.end(id);
            emit(id, &r.tag, RequestOutput::Delta(delta));
        }
    }

    /// The delta of a request the engine finished with `reason`.
    fn last_delta(
        &self,
        state: &mut RequestState,
        reason: FinishReason,
        beams: Option<Vec<BeamHypothesis>>,
    ) -> RequestDelta {
        let beams = beams
            .unwrap_or_default()
            .into_iter()
            .map(|h| BeamText::new(&self.tokenizer, state.options(), h))
            .collect::<Result<Vec<_>, _>>();
        match beams {
            Ok(beams) => state.finish(Finish::from(reason), beams),
            Err(e) => state.fail(format!("detokenizing a hypothesis: {e}")),
        }
    }

    /// Ends request `id` in `control` and forgets it without a last delta (its receiver is
    /// gone); returns its tag, or `None` when it is not tracked.
    pub fn abort<C: RequestControl + ?Sized>(&mut self, control: &mut C, id: SeqId) -> Option<T> {
        let r = self.requests.remove(&id)?;
        control.end(id);
        Some(r.tag)
    }

    /// Ends every tracked request with `reason` (cancelled, shutting down, a failed step):
    /// each gets its last delta, its held-back text included. With `control`, each is also
    /// ended in the engine (leave it out when the engine is unusable).
    pub fn finish_all<C: RequestControl + ?Sized>(
        &mut self,
        mut control: Option<&mut C>,
        reason: FinishReason,
        mut emit: impl FnMut(SeqId, &T, RequestOutput),
    ) {
        for (id, mut r) in std::mem::take(&mut self.requests) {
            if let Some(c) = control.as_deref_mut() {
                c.end(id);
            }
            let delta = r.state.finish(Finish::from(reason.clone()), Vec::new());
            emit(id, &r.tag, RequestOutput::Delta(delta));
        }
    }

    /// The tracked requests and their tags.
    pub fn requests(&self) -> impl Iterator<Item = (SeqId, &T)> {
        self.requests.iter().map(|(&id, r)| (id, &r.tag))
    }

    /// How many requests are tracked.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether no request is tracked.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}
