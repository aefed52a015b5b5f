//! The HTTP endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (JSON or SSE),
//! `GET /v1/models`, `GET /health`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream;
use kdtree_engine::Config;
use kdtree_engine::text::{ChatTemplate, Finish, Stops, Tokenizer};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::api::{self, ApiError, ChatRequest, Common, CompletionRequest, PromptField};
use super::worker::{Event, Job, Queue};

/// What every handler shares.
pub struct AppState {
    /// The name clients give as `model`.
    pub name: String,
    pub config: Config,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    /// The model's end-of-sequence ids.
    pub eos: Vec<u32>,
    pub queue: Queue,
    pub queue_depth: usize,
    pub default_max_tokens: usize,
    pub next_id: AtomicU64,
}

type Shared = State<Arc<AppState>>;

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn models(State(s): Shared) -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": s.name, "object": "model", "owned_by": "kdtree"}]}))
}

pub async fn completions(State(s): Shared, body: Bytes) -> Result<Response, ApiError> {
    let req: CompletionRequest = api::parse(&body)?;
    let ids = match req.prompt {
        PromptField::Text(text) => s.tokenizer.encode(&text, true).map_err(|e| ApiError::bad_request(e.to_string()))?,
        PromptField::Ids(ids) => ids,
    };
    respond(&s, ids, req.common, Kind::Completion).await
}

pub async fn chat(State(s): Shared, body: Bytes) -> Result<Response, ApiError> {
    let req: ChatRequest = api::parse(&body)?;
    let template = s.template.as_ref().ok_or_else(|| {
        ApiError::bad_request("the model folder has no chat template: use /v1/completions with a prompt")
    })?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("`messages` is empty: a chat needs at least one message"));
    }
    let prompt = template.render(&req.messages).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let ids = s.tokenizer.encode(&prompt, false).map_err(|e| ApiError::bad_request(e.to_string()))?;
    respond(&s, ids, req.common, Kind::Chat).await
}

/// Which API a response speaks.
#[derive(Clone, Copy)]
enum Kind {
    Completion,
    Chat,
}

/// One response's identity and shape.
#[derive(Clone)]
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    /// A choice carrying `text`, with `finish_reason` once known.
    fn choice(&self, text: &str, finish: Option<Finish>, chunk: bool) -> Value {
        let finish = finish.map(Finish::reason);
        match (self.kind, chunk) {
            (Kind::Completion, _) => json!({"index": 0, "text": text, "finish_reason": finish}),
            (Kind::Chat, false) => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
            }
            (Kind::Chat, true) => {
                let delta = if finish.is_some() { json!({}) } else { json!({"role": "assistant", "content": text}) };
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            }
        }
    }

    fn body(&self, choice: Value, usage: Option<Value>, chunk: bool) -> Value {
        let mut body = json!({"id": self.id, "object": self.object(chunk), "created": self.created,
                              "model": self.model, "choices": [choice]});
        if let Some(usage) = usage {
            body["usage"] = usage;
        }
        body
    }
}

/// Checks the request, queues it, and answers: the whole text as JSON, or its pieces as SSE.
async fn respond(s: &AppState, prompt: Vec<u32>, common: Common, kind: Kind) -> Result<Response, ApiError> {
    if let Some(model) = common.model.as_deref().filter(|m| *m != s.name) {
        let message = format!("the model `{model}` does not exist: this server serves `{}`", s.name);
        return Err(ApiError { status: StatusCode::NOT_FOUND, kind: "model_not_found", message });
    }
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    let vocab = s.config.vocab_size;
    if let Some(id) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::bad_request(format!("token id {id} is outside the vocabulary of {vocab}")));
    }
    let max_new = common.max_completion_tokens.or(common.max_tokens).unwrap_or(s.default_max_tokens);
    if max_new == 0 {
        return Err(ApiError::bad_request("`max_tokens` is 0: ask for at least 1 token"));
    }
    s.config.check_context(prompt.len(), max_new).map_err(|e| ApiError {
        status: StatusCode::BAD_REQUEST,
        kind: "context_length_exceeded",
        message: e.to_string(),
    })?;
    let stops = Stops {
        ids: if common.ignore_eos { Vec::new() } else { s.eos.clone() },
        texts: common.stop.map(api::StopField::into_vec).unwrap_or_default(),
    };
    let (events, rx) = unbounded_channel();
    let prompt_tokens = prompt.len();
    s.queue.submit(Job { prompt, max_new, stops, events }).map_err(|_| ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "server_overloaded",
        message: format!("{} requests are already waiting: retry later", s.queue_depth),
    })?;
    let reply = Reply {
        kind,
        id: format!("cmpl-{}", s.next_id.fetch_add(1, Ordering::Relaxed)),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: s.name.clone(),
    };
    if common.stream {
        Ok(stream_reply(reply, prompt_tokens, rx).into_response())
    } else {
        whole_reply(reply, prompt_tokens, rx).await.map(|body| Json(body).into_response())
    }
}

/// Waits for the whole answer.
async fn whole_reply(reply: Reply, prompt_tokens: usize, mut rx: UnboundedReceiver<Event>) -> Result<Value, ApiError> {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(piece) => text += &piece,
            Event::Done { completion_tokens, finish } => {
                let usage = api::usage(prompt_tokens, completion_tokens);
                return Ok(reply.body(reply.choice(&text, Some(finish), false), Some(usage), false));
            }
            Event::Failed(message) => return Err(internal(message)),
        }
    }
    Err(internal("the generation stopped without an answer".into()))
}

fn internal(message: String) -> ApiError {
    ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, kind: "internal_error", message }
}

/// The answer as server-sent events: a chunk per piece of text, a last chunk with the finish
/// reason and the usage, then `[DONE]`, as OpenAI streams. Dropping the stream (the client went
/// away) closes the channel, which stops the generation.
fn stream_reply(
    reply: Reply,
    prompt_tokens: usize,
    rx: UnboundedReceiver<Event>,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let data = |body: Value| SseEvent::default().data(body.to_string());
    let events = UnboundedReceiverStream::new(rx).flat_map(move |event| {
        let events = match event {
            Event::Text(piece) => vec![data(reply.body(reply.choice(&piece, None, true), None, true))],
            Event::Done { completion_tokens, finish } => {
                let usage = api::usage(prompt_tokens, completion_tokens);
                let last = reply.body(reply.choice("", Some(finish), true), Some(usage), true);
                vec![data(last), SseEvent::default().data("[DONE]")]
            }
            Event::Failed(message) => {
                vec![data(json!({"error": {"message": message, "type": "internal_error", "code": 500}}))]
            }
        };
        stream::iter(events.into_iter().map(Ok))
    });
    Sse::new(events)
}
