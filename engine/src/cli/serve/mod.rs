//! `kdtree-engine serve`: the model behind an OpenAI-compatible HTTP API.
//!
//! | module | what |
//! |---|---|
//! | `api` | the requests and responses, error bodies |
//! | `routes` | the endpoints |
//! | `worker` | the thread that owns the model and runs queued requests one at a time |

mod api;
mod routes;
mod worker;

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post};
use clap::Args;
use kdtree_engine::Config;
use kdtree_engine::cpu::CpuBackend;
use kdtree_engine::registry::Backend;
use kdtree_engine::spec::{DrafterKind, SpecArgs};
use kdtree_engine::text::{ChatTemplate, Tokenizer, eos_token_ids};

use super::backend::BackendArgs;
use routes::AppState;
use worker::Jobs;

/// Serve the model over an OpenAI-compatible HTTP API.
///
/// POST /v1/completions (a text `prompt`, or token ids) and /v1/chat/completions (`messages`,
/// rendered with the folder's chat template), each as one JSON answer or, with "stream": true, as
/// server-sent events; GET /v1/models and /health. Answers carry usage counts. Decoding is greedy:
/// sampling parameters (temperature, top_p) are accepted and ignored. Requests stop at the model's
/// end-of-sequence ids (unless "ignore_eos": true), at `max_tokens` (default --default-max-tokens)
/// and at `stop` strings.
///
/// One request is generated at a time; up to --max-queue more wait, and beyond that a request is
/// answered 503. A client that disconnects stops its generation, which frees its KV cache. Bad
/// requests (malformed JSON, an unknown model, a prompt too long for the context) are answered
/// with a 4xx JSON error.
///
/// With --spec, requests run through speculative decoding (the same tokens as greedy decoding,
/// fewer target forwards), each with a fresh drafter; the comparison with plain greedy decoding
/// that `generate --spec` adds is not run.
///
/// Once listening, one line on stdout gives the address: `listening on http://HOST:PORT`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model folder: config.json, safetensors shards, and the tokenizer (tokenizer.json or
    /// tiktoken.model); its chat template serves /v1/chat/completions.
    #[arg(long)]
    model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0: any free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The name requests give as "model" [default: the model folder's name].
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
    /// Requests that may wait while one is generated; more are answered 503.
    #[arg(long, default_value_t = 16)]
    max_queue: usize,
    /// Tokens a request generates at most when it gives no max_tokens.
    #[arg(long, default_value_t = 256)]
    default_max_tokens: usize,
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    backend: BackendArgs,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let dir = args.model.clone();
    let config = Config::load(&dir.join("config.json"))?;
    let tokenizer = Arc::new(Tokenizer::load(&dir).context("serve needs the model folder's tokenizer")?);
    if tokenizer.vocab_size() > config.vocab_size {
        anyhow::bail!(
            "{}: the tokenizer has {} ids, more than the model's vocabulary of {}",
            tokenizer.file(),
            tokenizer.vocab_size(),
            config.vocab_size
        );
    }
    let name = match &args.served_model_name {
        Some(name) => name.clone(),
        None => dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned()),
    };
    if args.spec.spec.is_some() && args.spec.drafter == DrafterKind::NoisyOracle {
        anyhow::bail!(
            "--drafter noisy-oracle replays greedy decoding's output for benchmarks: serve with lookup, model or block"
        );
    }
    let (queue, jobs) = worker::queue(args.max_queue);
    let state = Arc::new(AppState {
        name,
        config,
        tokenizer: tokenizer.clone(),
        template: ChatTemplate::load(&dir)?,
        eos: eos_token_ids(&dir)?,
        queue,
        queue_depth: args.max_queue,
        default_max_tokens: args.default_max_tokens,
        next_id: AtomicU64::new(0),
    });
    let (host, port) = (args.host, args.port);
    // The model lives on its own thread (a GPU backend stays on the thread that made it), which
    // says when it is loaded.
    let (ready, loaded) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let backend = match args.backend.open(&args.model, args.spec.largest_forward()) {
            Ok(backend) => backend,
            Err(e) => return drop(ready.send(Err(e))),
        };
        match backend {
            None => load_and_serve(&args, Arc::new(CpuBackend), &tokenizer, jobs, ready),
            Some(cuda) => load_and_serve(&args, Arc::new(cuda), &tokenizer, jobs, ready),
        }
    });
    loaded.recv().context("the model thread stopped while loading")??;

    let app = Router::new()
        .route("/health", get(routes::health))
        .route("/v1/models", get(routes::models))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat))
        .with_state(state);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    runtime.block_on(async {
        let listener =
            tokio::net::TcpListener::bind((host, port)).await.with_context(|| format!("listening on {host}:{port}"))?;
        let address = listener.local_addr()?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{address}").and_then(|()| out.flush()).context("writing to stdout")?;
        axum::serve(listener, app).await.context("serving")
    })
}

/// Loads the model on `backend` (and the draft model and method of --spec), reports on `ready`,
/// then runs the queued jobs until the server stops.
fn load_and_serve<B: Backend>(
    args: &ServeArgs,
    backend: Arc<B>,
    tokenizer: &Arc<Tokenizer>,
    jobs: Jobs,
    ready: std::sync::mpsc::Sender<anyhow::Result<()>>,
) {
    let loaded = (|| {
        let mut model = args.backend.load(&args.model, backend)?;
        let line = args.backend.configure(&mut model)?;
        let method = args.spec.method()?;
        let draft_model = match method {
            Some(_) => args.spec.load_draft_model(&model).context("loading --draft-model")?,
            None => None,
        };
        anyhow::Ok((model, line, method, draft_model))
    })();
    match loaded {
        Err(e) => drop(ready.send(Err(e))),
        Ok((model, line, method, draft_model)) => {
            eprintln!("{line}");
            let _ = ready.send(Ok(()));
            let spec = method.as_ref().map(|m| (&args.spec, m, draft_model.as_ref()));
            worker::serve_jobs(&model, tokenizer, spec, jobs);
        }
    }
}
