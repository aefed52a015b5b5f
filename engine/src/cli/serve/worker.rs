//! The one thread that owns the model: it takes queued requests one at a time and sends each
//! answer's text back as it is decoded. A request whose client has gone (its receiver dropped)
//! is stopped at the next token, and its KV cache, which lives only for the request, is freed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};

use kdtree_engine::Model;
use kdtree_engine::registry::Backend;
use kdtree_engine::spec::{DraftWeights, Method, SpecArgs};
use kdtree_engine::text::{Finish, Stops, Tokenizer, generate_text};
use tokio::sync::mpsc::UnboundedSender;

/// One request for the model.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_new: usize,
    pub stops: Stops,
    pub events: UnboundedSender<Event>,
}

/// What the worker tells a request's handler.
pub enum Event {
    Text(String),
    Done { completion_tokens: usize, finish: Finish },
    Failed(String),
}

/// Where handlers queue jobs: one runs and at most `depth` wait; beyond that a job is refused.
#[derive(Clone)]
pub struct Queue {
    jobs: Sender<Job>,
    /// Jobs queued or running; the worker takes one off when it finishes one.
    load: Arc<AtomicUsize>,
    depth: usize,
}

impl Queue {
    /// Queues `job`; `Err` with it when the queue is full or the worker has stopped.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        if self.load.fetch_add(1, Ordering::SeqCst) > self.depth {
            self.load.fetch_sub(1, Ordering::SeqCst);
            return Err(job);
        }
        self.jobs.send(job).map_err(|e| {
            self.load.fetch_sub(1, Ordering::SeqCst);
            e.0
        })
    }
}

/// A queue where `depth` jobs may wait behind the running one, and what [`serve_jobs`] needs.
pub fn queue(depth: usize) -> (Queue, Jobs) {
    let (jobs, rx) = channel();
    let load = Arc::new(AtomicUsize::new(0));
    (Queue { jobs, load: load.clone(), depth }, Jobs { rx, load })
}

/// The worker's end of a [`Queue`].
pub struct Jobs {
    rx: Receiver<Job>,
    load: Arc<AtomicUsize>,
}

/// Runs the jobs of `jobs` on `model`, one at a time, until every sender is gone; with `spec`,
/// each through speculative decoding with a fresh drafter (the same tokens, fewer target forwards).
pub fn serve_jobs<B: Backend>(
    model: &Model<B>,
    tokenizer: &Arc<Tokenizer>,
    spec: Option<(&SpecArgs, &Method, Option<&DraftWeights<B>>)>,
    jobs: Jobs,
) {
    for job in jobs.rx {
        let events = &job.events;
        let result = (|| {
            let mut drafter = spec.map(|(args, _, draft_model)| args.drafter(model, draft_model)).transpose()?;
            let speculation = drafter.as_deref_mut().zip(spec.map(|(_, method, _)| method));
            generate_text(model, tokenizer, &job.prompt, job.max_new, &job.stops, speculation, |text| {
                // A closed channel: the client went away; stop generating for it.
                Ok(events.send(Event::Text(text.to_owned())).is_ok())
            })
        })();
        let _ = events.send(match result {
            Ok((g, finish)) => Event::Done { completion_tokens: g.tokens.len(), finish },
            Err(e) => Event::Failed(e.to_string()),
        });
        jobs.load.fetch_sub(1, Ordering::SeqCst);
    }
}
