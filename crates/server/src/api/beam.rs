//! Beam search over HTTP (vLLM's `use_beam_search: true` extension) for one prompt, on
//! `/v1/completions` and `/v1/chat/completions`: `n` is the beam width and the number of
//! choices returned, best hypothesis first; `length_penalty` (default 1.0) normalises
//! scores by length. Sampling fields are ignored (the search is deterministic);
//! `max_tokens`, `stop`, `stop_token_ids`, `ignore_eos`, `skip_special_tokens` and
//! `include_stop_str_in_output` apply. Refused with 400: streaming, `logprobs`, `echo`,
//! `prompt_logprobs`, several prompts, a width above the engine's `max_num_seqs`.
//!
//! Each hypothesis's tokens go through the same text layer as sampled output (stop strings
//! cut the text there); its `finish_reason` is `stop` when it ended on a stop token or
//! string, else `length`.

use axum::response::{IntoResponse, Response};
use tandem_engine::beam_search::BeamParams;
use tandem_engine::EngineError;
use tandem_model::batch::TokenId;
use tandem_text::{BeamText, Finish, RequestOutput};

use super::format::{usage, ChoiceResult, Endpoint, ResponseMeta};
use super::respond::submit_error;
use super::sampling::GenerationPlan;
use super::App;
use crate::engine_thread::SubmitError;
use crate::error::{ApiError, ApiResult};

/// Refuses what beam search cannot combine with; `conflicts` are `(field, present)` pairs.
pub fn check(plan: &GenerationPlan, conflicts: &[(&str, bool)]) -> ApiResult<()> {
    if plan.stream {
        return Err(ApiError::field(
            "stream",
            "streaming is not supported with use_beam_search",
        ));
    }
    match conflicts.iter().find(|(_, present)| *present) {
        Some((field, _)) => Err(ApiError::field(
            field,
            "is not supported with use_beam_search",
        )),
        None => Ok(()),
    }
}

/// What one beam search request answers.
#[derive(Debug)]
pub struct BeamRequest<'a> {
    pub endpoint: Endpoint,
    pub prompt: &'a [TokenId],
    pub max_tokens: usize,
    pub length_penalty: f32,
    pub model: String,
}

/// Runs the search and answers one JSON body with `plan.n` choices.
pub async fn run(app: &App, plan: &GenerationPlan, req: BeamRequest<'_>) -> ApiResult<Response> {
    let (request, width) = plan.request(req.prompt, req.max_tokens);
    let beam = BeamParams {
        width,
        length_penalty: req.length_penalty,
    };
    let (_, mut events) = app
        .engine
        .submit_beam(request, beam, &plan.text)
        .await
        .map_err(|e| match e {
            SubmitError::Refused(EngineError::InvalidParams(m)) if m.contains("width") => {
                ApiError::field("n", m)
            }
            SubmitError::Refused(EngineError::InvalidParams(m)) if m.contains("length_penalty") => {
                ApiError::field("length_penalty", m)
            }
            e => submit_error(e, "prompt"),
        })?;
    let beams = loop {
        let Some(event) = events.recv().await else {
            return Err(ApiError::unavailable("the engine stopped"));
        };
        let RequestOutput::Delta(delta) = event.event else {
            continue;
        };
        if let Some(err) = delta
            .finish
            .as_ref()
            .and_then(|f| ApiError::failed("beam search failed", f))
        {
            return Err(err);
        }
        match delta.finish {
            Some(Finish::Abort) => return Err(ApiError::unavailable("the request was aborted")),
            Some(_) => break delta.beams,
            None => {}
        }
    };
    let tokenizer = app.prompts.tokenizer().clone();
    let mut stops: Vec<u32> = plan.sampling.stop_token_ids.clone();
    if !plan.sampling.ignore_eos {
        stops.extend(&app.limits.eos_token_ids);
    }
    let choices: Vec<ChoiceResult> = beams.iter().map(|b| choice(b, &stops)).collect();
    let completion_tokens = beams.iter().map(|b| b.tokens.len()).sum();
    let prefix = match req.endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let meta = ResponseMeta {
        endpoint: req.endpoint,
        id: app.response_id(prefix),
        created: super::unix_time(),
        model: req.model,
        logprobs: None,
        prompt_logprobs: None,
        tools: None,
    };
    let body = meta.response(
        &tokenizer,
        &choices,
        // Beams are driven inside the engine and do not report their prefix-cache use.
        usage(req.prompt.len(), completion_tokens, 0),
    );
    Ok(axum::Json(body).into_response())
}

/// One hypothesis as a choice: its text (made by the output processor), and why it ended.
fn choice(beam: &BeamText, stops: &[u32]) -> ChoiceResult {
    let on_stop_token = beam.tokens.last().is_some_and(|t| stops.contains(&t.0));
    ChoiceResult {
        text: beam.text.clone(),
        finish: Some(if beam.stopped || on_stop_token {
            Finish::Stop
        } else {
            Finish::Length
        }),
        ..ChoiceResult::default()
    }
}
