//! Errors at the HTTP edge: every failure becomes an OpenAI-style body
//! `{"error": {"message", "type", "param", "code"}}` with a status that tells a client
//! mistake (4xx, naming the offending field) from a server fault (5xx).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tandem_engine::sampler::SamplerError;
use tandem_engine::EngineError;
use tandem_text::Finish;

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listening socket could not be bound or configured.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    /// The async runtime or a thread could not be created.
    #[error("cannot start the server: {0}")]
    Startup(String),
    /// The chat template does not compile.
    #[error("chat template: {0}")]
    ChatTemplate(String),
}

/// An error answered to one HTTP request.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, `server_error`...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: a field of the request is invalid.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// 400 naming `param` in the message too.
    pub fn field(param: &str, reason: impl std::fmt::Display) -> ApiError {
        ApiError::bad_request(format!("{param}: {reason}"), Some(param))
    }

    /// 404 for an unknown model.
    pub fn model_not_found(name: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{name}` does not exist"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404 for an unknown route.
    pub fn route_not_found(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("no route for {path}"),
            kind: "not_found_error",
            param: None,
            code: None,
        }
    }

    /// 404 for something the server does not have (`message` says what).
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: None,
            code: None,
        }
    }

    /// 405 for a known route with the wrong method.
    pub fn method_not_allowed() -> ApiError {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: "method not allowed on this route".into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or incorrect API key (send `Authorization: Bearer KEY`)".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 413 for a body over the limit.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body exceeds the limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 429 when the waiting queue is full (answered with `Retry-After`).
    pub fn queue_full(max_waiting: usize) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "the server is busy: {max_waiting} requests are already waiting; retry later"
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    /// 429 when every grammar compile slot stayed taken for the compile time limit (answered
    /// with `Retry-After`).
    pub fn compilers_busy(slots: usize) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "the server is busy: all {slots} grammar compile slots are taken; retry later"
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("grammar_compilers_busy"),
        }
    }

    /// The answer to a request that failed while generating (`what`: what failed), if
    /// `finish` is a failure: 400 when the request's own parameters left nothing to sample
    /// (a grammar's dead end, every token suppressed), 500 for a fault of the engine or model.
    pub fn failed(what: &str, finish: &Finish) -> Option<ApiError> {
        match finish {
            Finish::Refused(m) => Some(ApiError::bad_request(format!("{what}: {m}"), None)),
            Finish::Error(m) => Some(ApiError::internal(format!("{what}: {m}"))),
            _ => None,
        }
    }

    /// 503 when the engine is gone (shutting down or failed).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// 500 for a fault of the server or the model, never for a client mistake.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }

    /// This error with field `from` named `to` instead (in its message's start too): for a
    /// request field that stands in for another.
    pub fn renamed(mut self, from: &str, to: &str) -> ApiError {
        if self.param.as_deref() == Some(from) {
            self.param = Some(to.to_string());
            if let Some(rest) = self.message.strip_prefix(from) {
                self.message = format!("{to}{rest}");
            }
        }
        self
    }

    /// Maps an engine refusal of a request (`add_request`) to a 400 naming the field;
    /// `prompt_param` is `prompt` or `messages`.
    pub fn from_engine(e: &EngineError, prompt_param: &str) -> ApiError {
        match e {
            EngineError::Sampler(SamplerError::InvalidParam { field, reason }) => {
                ApiError::field(field, reason)
            }
            EngineError::EmptyPrompt
            | EngineError::PromptTooLong { .. }
            | EngineError::PromptExceedsPool { .. } => ApiError::field(prompt_param, e),
            EngineError::InvalidParams(m) if m.starts_with("prompt token") => {
                ApiError::field(prompt_param, m)
            }
            EngineError::InvalidParams(m) => ApiError::bad_request(m.clone(), named_field(m)),
            // The engine thread refuses everything once it has failed.
            EngineError::InvalidConfig(m) => ApiError::unavailable(m.clone()),
            other => ApiError::internal(other.to_string()),
        }
    }
}

/// The request field an engine refusal's message is about, from how it starts ("n must be
/// between 1 and max_num_seqs ..."; a beam search's width is its `n`).
fn named_field(message: &str) -> Option<&'static str> {
    const FIELDS: [(&str, &str); 5] = [
        ("max_tokens", "max_tokens"),
        ("n must ", "n"),
        ("beam width ", "n"),
        ("prompt_logprobs ", "prompt_logprobs"),
        ("length_penalty ", "length_penalty"),
    ];
    let field = FIELDS.iter().find(|(start, _)| message.starts_with(start));
    field.map(|&(_, name)| name)
}

/// Seconds a client should wait before retrying a 429 or 503.
pub const RETRY_AFTER_SECONDS: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() && self.status != StatusCode::SERVICE_UNAVAILABLE {
            // A fault of the server or the model (not a refusal while busy or draining): the
            // operator needs the message (the request's span adds its id).
            tracing::error!(status = self.status.as_u16(), message = %self.message, "request failed");
        }
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

/// Shorthand for handler results.
pub type ApiResult<T> = std::result::Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_refusals_name_their_field() {
        let param = |m: &str| {
            let e = ApiError::from_engine(&EngineError::InvalidParams(m.into()), "prompt");
            e.body()["error"]["param"].clone()
        };
        assert_eq!(
            param("n must be between 1 and max_num_seqs (4), got 9"),
            "n"
        );
        assert_eq!(
            param("beam width must be between 1 and max_num_seqs (4), got 9"),
            "n"
        );
        assert_eq!(
            param("max_tokens: the prompt (3 tokens) plus ..."),
            "max_tokens"
        );
        assert_eq!(
            param("prompt_logprobs must be at most 20, got 30"),
            "prompt_logprobs"
        );
        assert_eq!(
            param("length_penalty must be finite, got NaN"),
            "length_penalty"
        );
        assert_eq!(
            param("prompt token id 9 is outside the vocabulary of 5"),
            "prompt"
        );
        assert_eq!(param("something else"), serde_json::Value::Null);
    }
}
