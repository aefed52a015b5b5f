//! Greedy decoding whose answer is text: each token's text is handed on as soon as it is whole,
//! and the answer ends at a stop id or where a stop string begins.

use super::{StopText, Tokenizer};
use crate::error::Result;
use crate::generate::{Generation, greedy_generate_streamed};
use crate::model::Model;
use crate::registry::Backend;
use crate::spec::{Drafter, Method, speculative_generate_streamed};

/// Why an answer ended, as the OpenAI API's `finish_reason` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop id (the end of sequence) or a stop string.
    Stop,
    /// `max_new` tokens.
    Length,
    /// The receiver of the text asked to stop (a client went away).
    Cancelled,
}

impl Finish {
    pub fn reason(self) -> &'static str {
        match self {
            Finish::Stop | Finish::Cancelled => "stop",
            Finish::Length => "length",
        }
    }
}

/// What ends an answer besides its length.
#[derive(Clone, Debug, Default)]
pub struct Stops {
    /// Ids that end it (kept among the tokens, not shown as text).
    pub ids: Vec<u32>,
    /// Strings that end its text (not shown).
    pub texts: Vec<String>,
}

/// Speculative decoding's part of a request: its drafter and method.
pub(crate) type Speculation<'a, 'd, B> = (&'a mut (dyn Drafter<B> + 'd), &'a Method);

/// Up to `max_new` greedy tokens after `prompt`, sped up by `speculation` if given (the same
/// tokens); `on_text` gets the answer's text piece by piece (whole characters, special tokens left
/// out, never a stop string or its start) and returns false to cancel the rest.
pub fn generate_text<B: Backend>(
    model: &Model<B>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    max_new: usize,
    stops: &Stops,
    speculation: Option<Speculation<'_, '_, B>>,
    mut on_text: impl FnMut(&str) -> Result<bool>,
) -> Result<(Generation, Finish)> {
    let mut stream = tokenizer.stream();
    let mut stop_text = StopText::new(stops.texts.iter().cloned());
    let mut finish = Finish::Length;
    // A stop string cut the text: what is held back after it is not part of the answer.
    let mut cut = false;
    let each = |token| {
        let (shown, stopped) = stop_text.push(&stream.push(token)?);
        if !shown.is_empty() && !on_text(&shown)? {
            finish = Finish::Cancelled;
            return Ok(true);
        }
        cut = stopped;
        if stopped || stops.ids.contains(&token) {
            finish = Finish::Stop;
        }
        Ok(finish == Finish::Stop)
    };
    let g = match speculation {
        None => greedy_generate_streamed(model, prompt, max_new, each)?,
        Some((drafter, method)) => {
            let (tokens, stats) = speculative_generate_streamed(model, drafter, prompt, max_new, method, each)?;
            Generation { tokens, prefill: stats.prefill_time, decode: stats.elapsed.saturating_sub(stats.prefill_time) }
        }
    };
    if !cut && finish != Finish::Cancelled {
        let (rest, _) = stop_text.push(&stream.finish());
        let rest = rest + &stop_text.finish();
        if !rest.is_empty() {
            on_text(&rest)?;
        }
    }
    Ok((g, finish))
}
