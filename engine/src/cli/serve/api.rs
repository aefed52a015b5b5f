//! The OpenAI API's requests and responses, as far as a greedy text engine serves them, and its
//! error bodies (`{"error": {"message", "type", "code"}}`).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kdtree_engine::text::Message;
use serde::Deserialize;
use serde_json::{Value, json};

/// An error answered to a client: a status and a message saying what was wrong.
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, kind: "invalid_request_error", message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "code": self.status.as_u16()}});
        (self.status, Json(body)).into_response()
    }
}

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

/// What both endpoints read besides the prompt. Sampling parameters (`temperature`, `top_p`) are
/// accepted and ignored: decoding is greedy.
#[derive(Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    /// The chat API's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    pub stop: Option<StopField>,
    /// Stop at the end of sequence or not (vLLM's extension, for benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
}

/// `POST /v1/completions`: `prompt` is text or token ids.
#[derive(Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    #[serde(flatten)]
    pub common: Common,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Ids(Vec<u32>),
}

/// `POST /v1/chat/completions`.
#[derive(Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(flatten)]
    pub common: Common,
}

/// `body` as a `T`, or a 400 naming what is wrong with it.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not a valid request: {e}")))
}

/// The usage counts of a response.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens})
}
