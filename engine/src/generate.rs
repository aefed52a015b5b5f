//! Plain greedy decoding: the baseline speculative decoding must reproduce token for token.

use std::time::{Duration, Instant};

use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::registry::{Backend, KvStore};

/// The tokens of one greedy generation and where the time went.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    /// The prompt's forward passes, which also yield the first new token.
    pub prefill: Duration,
    /// Every later one-token forward pass.
    pub decode: Duration,
}

impl Generation {
    /// The tokens after the first (which the prefill yields): one decode forward each.
    pub fn decoded(&self) -> usize {
        self.tokens.len().saturating_sub(1)
    }

    /// [`Generation::decoded`] tokens per second of [`Generation::decode`].
    pub fn decode_tokens_per_s(&self) -> f64 {
        rate(self.decoded(), self.decode.as_secs_f64())
    }
}

/// Tokens per second, 0 where nothing was timed.
pub fn rate(tokens: usize, seconds: f64) -> f64 {
    if tokens == 0 || seconds <= 0.0 { 0.0 } else { tokens as f64 / seconds }
}

/// Up to `max_new` argmax tokens after `prompt`, stopping after any of the ids `stop` (which is
/// included). The prompt is prefilled in chunks ([`Model::prefill`]).
pub fn greedy_generate<B: Backend>(model: &Model<B>, prompt: &[u32], max_new: usize, stop: &[u32]) -> Result<Vec<u32>> {
    Ok(greedy_generate_timed(model, prompt, max_new, stop)?.tokens)
}

/// [`greedy_generate`] with the prefill and decode times.
pub fn greedy_generate_timed<B: Backend>(
    model: &Model<B>,
    prompt: &[u32],
    max_new: usize,
    stop: &[u32],
) -> Result<Generation> {
    greedy_generate_streamed(model, prompt, max_new, |token| Ok(stop.contains(&token)))
}

/// [`greedy_generate_timed`], handing each token to `on_token` as soon as it is decoded (to print
/// its text, to look for a stop string): generation stops after a token for which it returns true,
/// and fails with its error.
pub(crate) fn greedy_generate_streamed<B: Backend>(
    model: &Model<B>,
    prompt: &[u32],
    max_new: usize,
    mut on_token: impl FnMut(u32) -> Result<bool>,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt { op: "greedy_generate" });
    }
    model.config.check_context(prompt.len(), max_new)?;
    let mut cache = model.new_cache();
    let mut tokens = Vec::new();
    let start = Instant::now();
    if max_new == 0 {
        return Ok(Generation { tokens, prefill: Duration::ZERO, decode: Duration::ZERO });
    }
    let mut next = model.prefill(&mut cache, prompt)?;
    let prefill = start.elapsed();
    loop {
        tokens.push(next);
        if on_token(next)? || tokens.len() == max_new {
            break;
        }
        let position = cache.len();
        next = model.forward_argmax(&mut cache, &[next], &[position], None)?[0];
    }
    Ok(Generation { tokens, prefill, decode: start.elapsed() - prefill })
}
