//! Reading request bodies: size limit (413), JSON objects whose keys are unique (400, see
//! `unique_keys.rs`), and field parsing whose errors name the field at fault (400).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::unique_keys::UniqueKeys;
use crate::error::{ApiError, ApiResult};

/// The body as a JSON object. `limit` is the configured body limit (for the 413 message).
pub fn json_object(body: Result<Bytes, BytesRejection>, limit: usize) -> ApiResult<Value> {
    let bytes = body.map_err(|rej| {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {rej}"), None)
        }
    })?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    serde_json::from_slice::<UniqueKeys>(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body repeats a key: {e}"), None))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the body must be a JSON object",
            None,
        ));
    }
    Ok(value)
}

/// Deserializes the fields `T` knows from `value` (unknown fields are ignored); a field of
/// the wrong type gives a 400 naming it.
pub fn fields<T: DeserializeOwned>(value: &Value) -> ApiResult<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let top = path
            .split(['.', '['])
            .next()
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        let inner = e.into_inner();
        match top {
            Some(field) => ApiError::bad_request(format!("{path}: {inner}"), Some(&field)),
            None => ApiError::bad_request(inner.to_string(), None),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct T {
        #[allow(dead_code)]
        temperature: Option<f32>,
        #[allow(dead_code)]
        stop: Option<Vec<String>>,
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = fields::<T>(&serde_json::json!({"temperature": "hot"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(
            e.message.starts_with("temperature: invalid type"),
            "{}",
            e.message
        );
        let e = fields::<T>(&serde_json::json!({"stop": ["a", 3]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stop"));
        assert!(fields::<T>(&serde_json::json!({"other": 1, "temperature": null})).is_ok());
    }
}
