//! Drafters: what proposes the next L tokens' distributions, from which the tree is built.
//!
//! A drafter returns, for each of the next L positions, its best candidates as (token, log-probability)
//! lists sorted best first ([`Draft`]), not whole vocabulary rows. The tree builder only ever reads the
//! top K = min(B, vocab) entries of each depth (a node of rank > B at some depth has B better siblings and
//! can never be among the best B nodes), and a lookup drafter's distribution is naturally sparse, so a
//! top-K list is both all the builder needs and the drafter's natural output. Model drafters cut their
//! full rows down once, with a partial sort in O(vocab).

mod block;
pub mod dflash;
mod lookup;
mod model;
mod oracle;

pub use block::BlockDrafter;
pub use dflash::DflashDrafter;
pub use lookup::LookupDrafter;
pub use model::ModelDrafter;
pub use oracle::NoisyOracle;

use crate::error::{EngineError, Result};
use crate::ops::cpu;
use crate::registry::Backend;

/// Proposes distributions for the tokens that follow the committed context and the bonus token, for a
/// target on backend `B`.
pub trait Drafter<B: Backend> {
    /// `context` is everything committed so far (prompt and accepted tokens); `bonus` is the target's
    /// greedy token after it, which is certain but not yet in the target's KV cache. Returns the
    /// distributions of the `len` positions after `bonus`, each cut to its best `top_k` entries.
    fn draft(&mut self, context: &[u32], bonus: u32, len: usize, top_k: usize) -> Result<Draft>;

    /// The target layers whose hidden states this drafter conditions on ([`Self::commit`]); none for
    /// a drafter that reads tokens only.
    fn target_layers(&self) -> &[usize] {
        &[]
    }

    /// The target's hidden states after [`Self::target_layers`] of the tokens just committed, `[tokens,
    /// layers * hidden]` on the target's backend, in order: the prompt's after prefill (chunk by
    /// chunk), then each round's accepted path (its root first). Rejected tokens' never come.
    fn commit(&mut self, _taps: &B::Tensor) -> Result<()> {
        Ok(())
    }
}

/// One candidate token at one depth of a draft.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    pub token: u32,
    pub log_prob: f32,
}

impl From<(u32, f32)> for Choice {
    fn from((token, log_prob): (u32, f32)) -> Choice {
        Choice { token, log_prob }
    }
}

/// Per-depth candidate lists, each sorted by log-probability descending, ties by lower token id, with
/// only finite log-probabilities (a token with probability zero, or a NaN, is never proposed) and
/// distinct tokens. The rank of a token is its index in its depth's list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    depths: Vec<Vec<Choice>>,
}

impl Draft {
    /// From full log-probability rows `[len, vocab]`: keeps each row's best `top_k` finite entries.
    pub fn from_log_probs(rows: &[f32], vocab: usize, top_k: usize) -> Result<Draft> {
        if vocab == 0 || !rows.len().is_multiple_of(vocab) {
            return Err(EngineError::shape(
                "draft",
                format!("rows of {} values are not whole rows of vocab {vocab}", rows.len()),
            ));
        }
        let depths =
            rows.chunks(vocab).map(|row| cpu::top_k(row, top_k).into_iter().map(Choice::from).collect()).collect();
        Ok(Draft { depths })
    }

    /// From explicit candidate lists, one per depth, in any order; keeps each depth's best `top_k`.
    /// A token listed twice at one depth, or a token outside `vocab`, is an error.
    pub fn from_choices(depths: Vec<Vec<Choice>>, vocab: usize, top_k: usize) -> Result<Draft> {
        let mut out = Vec::with_capacity(depths.len());
        for (depth, mut list) in depths.into_iter().enumerate() {
            if let Some(c) = list.iter().find(|c| c.token as usize >= vocab) {
                return Err(EngineError::TokenOutOfRange { id: c.token, vocab });
            }
            list.retain(|c| c.log_prob.is_finite());
            list.sort_by(|a, b| cpu::rank_order(&(a.token, a.log_prob), &(b.token, b.log_prob)));
            if has_duplicates(&list) {
                return Err(EngineError::shape("draft", format!("depth {}: a token is listed twice", depth + 1)));
            }
            list.truncate(top_k);
            out.push(list);
        }
        Ok(Draft { depths: out })
    }

    /// The number of depths (L).
    pub fn len(&self) -> usize {
        self.depths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.depths.is_empty()
    }

    /// The candidates at depth `depth` (1-based, as in the paper), best first.
    pub fn at(&self, depth: usize) -> &[Choice] {
        &self.depths[depth - 1]
    }
}

fn has_duplicates(list: &[Choice]) -> bool {
    let mut tokens: Vec<u32> = list.iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    tokens.windows(2).any(|w| w[0] == w[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_the_best_k_finite_entries_ties_to_the_lower_token() {
        let rows = [-1.0, -0.5, f32::NAN, -0.5, f32::NEG_INFINITY, -3.0];
        let d = Draft::from_log_probs(&rows, 6, 3).unwrap();
        let tokens: Vec<u32> = d.at(1).iter().map(|c| c.token).collect();
        assert_eq!(tokens, [1, 3, 0]);
        let all = Draft::from_log_probs(&rows, 3, 10).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all.at(2).iter().map(|c| c.token).collect::<Vec<_>>(), [0, 2]);
    }

    #[test]
    fn explicit_lists_are_sorted_and_checked() {
        let c = |token, log_prob| Choice { token, log_prob };
        let d = Draft::from_choices(vec![vec![c(4, -2.0), c(2, -0.1)]], 5, 8).unwrap();
        assert_eq!(d.at(1), [c(2, -0.1), c(4, -2.0)]);
        assert!(Draft::from_choices(vec![vec![c(1, -1.0), c(1, -2.0)]], 5, 8).is_err());
        assert!(Draft::from_choices(vec![vec![c(5, -1.0)]], 5, 8).is_err());
    }
}
