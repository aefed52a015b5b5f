//! A small draft model of the target's family, run greedily for L steps.

use super::{Draft, Drafter};
use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use crate::model::Model;
use crate::ops::cpu::log_softmax;
use crate::registry::{Backend, KvStore};

/// Runs its own model greedily from the bonus token for L steps and returns its softmax at each step.
/// It keeps its own KV cache across rounds and re-runs only what changed since the last call (the
/// tokens committed since, and the bonus token), so each round costs L forwards of the draft model.
pub struct ModelDrafter<'m, B: Backend> {
    model: &'m Model<B>,
    session: Session<B>,
}

impl<'m, B: Backend> ModelDrafter<'m, B> {
    /// `target_vocab` must be the draft model's vocabulary: proposals are token ids of the target.
    pub fn new(model: &'m Model<B>, target_vocab: usize) -> Result<ModelDrafter<'m, B>> {
        check_vocab(model, target_vocab)?;
        Ok(ModelDrafter { model, session: Session::new(model) })
    }
}

impl<B: Backend, T: Backend> Drafter<T> for ModelDrafter<'_, B> {
    fn draft(&mut self, context: &[u32], bonus: u32, len: usize, top_k: usize) -> Result<Draft> {
        let vocab = self.model.config.vocab_size;
        let mut rows = Vec::with_capacity(len * vocab);
        let mut text: Vec<u32> = context.iter().copied().chain([bonus]).collect();
        for _ in 0..len {
            let mut last = self.session.advance(self.model, &text)?;
            let next = crate::ops::cpu::argmax(&last, vocab)[0];
            log_softmax(&mut last, vocab);
            rows.extend(last);
            text.push(next);
        }
        Draft::from_log_probs(&rows, vocab, top_k)
    }
}

/// A KV cache that follows a growing text: it remembers which tokens it holds and, on each call,
/// drops what the text no longer shares and runs the rest in one causal forward.
pub(super) struct Session<B: Backend> {
    cache: B::Cache,
    cached: Vec<u32>,
}

impl<B: Backend> Session<B> {
    pub(super) fn new(model: &Model<B>) -> Session<B> {
        Session { cache: model.new_cache(), cached: Vec::new() }
    }

    /// Brings the cache to hold `text` and returns the logits after its last token (`text` is not empty).
    pub(super) fn advance(&mut self, model: &Model<B>, text: &[u32]) -> Result<Vec<f32>> {
        // Keep at least one token to run, so that there are logits to return.
        let shared = self.shared_prefix(text).min(text.len() - 1);
        self.truncate(shared);
        let logits = self.extend(model, &text[shared..], None)?;
        let vocab = model.config.vocab_size;
        Ok(logits[logits.len() - vocab..].to_vec())
    }

    /// Runs `tokens` after the cached ones, under `mask` (None: causal), and returns their logits.
    pub(super) fn extend(&mut self, model: &Model<B>, tokens: &[u32], mask: Option<&TreeMask>) -> Result<Vec<f32>> {
        let start = self.cached.len();
        let positions: Vec<usize> = (start..start + tokens.len()).collect();
        let logits = model.forward(&mut self.cache, tokens, &positions, mask)?;
        self.cached.extend_from_slice(tokens);
        Ok(logits)
    }

    pub(super) fn truncate(&mut self, len: usize) {
        self.cache.truncate(len);
        self.cached.truncate(len);
    }

    /// How many leading tokens of `text` the cache already holds.
    pub(super) fn shared_prefix(&self, text: &[u32]) -> usize {
        self.cached.iter().zip(text).take_while(|(a, b)| a == b).count()
    }
}

pub(super) fn check_vocab<B: Backend>(model: &Model<B>, target_vocab: usize) -> Result<()> {
    if model.config.vocab_size != target_vocab {
        return Err(EngineError::shape(
            "draft model",
            format!("its vocabulary ({}) differs from the target's ({target_vocab})", model.config.vocab_size),
        ));
    }
    Ok(())
}
