//! The DFlash drafter as decoding calls it: one forward a round, its context fed by the target's taps.

use super::forward::DflashContext;
use super::weights::DflashModel;
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::registry::Backend;
use crate::spec::drafter::{Choice, Draft, Drafter};

/// Drafts with `model` for `target`: each round one pass over the block `[bonus, mask × (L − 1)]`, so a
/// round drafts at most `block_size − 1` positions, whatever the draft length asked for.
pub struct DflashDrafter<'m, B: Backend> {
    model: &'m DflashModel<B>,
    target: &'m Model<B>,
    context: DflashContext<B>,
}

impl<'m, B: Backend> DflashDrafter<'m, B> {
    /// `model` must have been loaded for `target` ([`DflashModel::load`]).
    pub fn new(model: &'m DflashModel<B>, target: &'m Model<B>) -> Result<DflashDrafter<'m, B>> {
        Ok(DflashDrafter { model, target, context: model.new_context()? })
    }
}

impl<B: Backend> Drafter<B> for DflashDrafter<'_, B> {
    fn draft(&mut self, context: &[u32], bonus: u32, len: usize, top_k: usize) -> Result<Draft> {
        // The block's positions follow the features committed; they must be the text's.
        if self.context.len() != context.len() {
            return Err(EngineError::shape(
                "DFlash draft",
                format!(
                    "the drafter holds the target's features of {} tokens, the context has {}: every committed \
                     token's features must be committed to it",
                    self.context.len(),
                    context.len()
                ),
            ));
        }
        // Only each row's top_k leave the backend; the bonus row drafts nothing.
        let logits = self.model.block_logits(self.target, &self.context, bonus)?;
        let rows = self.target.backend().top_k_log_softmax(&logits, top_k, self.model.transform())?;
        let depths =
            rows.into_iter().skip(1).take(len).map(|row| row.into_iter().map(Choice::from).collect()).collect();
        Draft::from_choices(depths, self.target.config.vocab_size, top_k)
    }

    fn target_layers(&self) -> &[usize] {
        &self.model.config.target_layer_ids
    }

    fn commit(&mut self, taps: &B::Tensor) -> Result<()> {
        self.model.extend_context(&mut self.context, taps)
    }
}
