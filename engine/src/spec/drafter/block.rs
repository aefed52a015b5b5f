//! The block drafter: all L positions from one non-causal pass, the interface DDTree is built for.
//!
//! A block-diffusion drafter (DFlash) reads [b, MASK x L] in one pass with full attention inside the
//! block and predicts every MASK position at once. This engine has no trained block-diffusion drafter:
//! any model of the family can be plugged in, and with an ordinary causal LM (such as the tiny test
//! models) the proposals are poor. The interface, its cost (one forward per round) and the tree it
//! feeds are the real thing; the acceptance rate is not.

use super::model::{Session, check_vocab};
use super::{Draft, Drafter};
use crate::error::Result;
use crate::mask::TreeMask;
use crate::model::Model;
use crate::ops::cpu::log_softmax;
use crate::registry::Backend;

pub struct BlockDrafter<'m, B: Backend> {
    model: &'m Model<B>,
    mask_token: u32,
    session: Session<B>,
}

impl<'m, B: Backend> BlockDrafter<'m, B> {
    /// `mask_token` is the drafter's MASK id; `None` takes the last id of the vocabulary, the
    /// convention of block drafters that append MASK to the target's vocabulary.
    pub fn new(model: &'m Model<B>, target_vocab: usize, mask_token: Option<u32>) -> Result<BlockDrafter<'m, B>> {
        check_vocab(model, target_vocab)?;
        let mask_token = mask_token.unwrap_or(target_vocab.saturating_sub(1) as u32);
        Ok(BlockDrafter { model, mask_token, session: Session::new(model) })
    }
}

impl<B: Backend, T: Backend> Drafter<T> for BlockDrafter<'_, B> {
    fn draft(&mut self, context: &[u32], bonus: u32, len: usize, top_k: usize) -> Result<Draft> {
        let vocab = self.model.config.vocab_size;
        // The cache holds only committed context, run causally (only what is new since the last round);
        // the block sees all of it, and itself in full, and is dropped again afterwards.
        let shared = self.session.shared_prefix(context);
        self.session.truncate(shared);
        if shared < context.len() {
            self.session.extend(self.model, &context[shared..], None)?;
        }
        let block: Vec<u32> = std::iter::once(bonus).chain(std::iter::repeat_n(self.mask_token, len)).collect();
        let mut logits = self.session.extend(self.model, &block, Some(&TreeMask::full(len + 1)))?;
        self.session.truncate(context.len());
        let mut rows = logits.split_off(vocab);
        log_softmax(&mut rows, vocab);
        Draft::from_log_probs(&rows, vocab, top_k)
    }
}
