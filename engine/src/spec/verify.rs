//! Tree verification: one target forward over the whole tree, the greedy walk, KV compaction.

use std::time::{Duration, Instant};

use super::tree::DraftTree;
use crate::error::Result;
use crate::model::Model;
use crate::registry::{Backend, KvStore};

/// What one verification round commits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The target forward's wall time, until its argmax ids were on the host.
    pub forward_time: Duration,
    /// The accepted path, root (the old bonus token) first: what the cache now holds after the context.
    pub accepted: Vec<u32>,
    /// The target's greedy token after the accepted path: the next round's root.
    pub bonus: u32,
}

/// Runs `[root, tree nodes]` through `target` on top of `cache` (the committed context), each node at
/// position context length + depth and seeing only its ancestors; then walks from the root, moving to
/// the child whose token is the target's argmax at the current node. The cache keeps the walk's
/// entries, contiguous after the context, and nothing of the rejected branches.
pub fn verify<B: Backend>(target: &Model<B>, cache: &mut B::Cache, root: u32, tree: &DraftTree) -> Result<Verified> {
    Ok(verify_tapped(target, cache, root, tree, &[])?.0)
}

/// [`verify`], and with `layers` the accepted path's hidden states after each of them (`[accepted,
/// layers.len() * hidden]` on the backend, [`Model::forward_argmax_tapped`]): what a drafter
/// conditioned on the target commits; the rejected rows' are dropped with their cache entries.
pub(crate) fn verify_tapped<B: Backend>(
    target: &Model<B>,
    cache: &mut B::Cache,
    root: u32,
    tree: &DraftTree,
    layers: &[usize],
) -> Result<(Verified, Option<B::Tensor>)> {
    let start = cache.len();
    let tokens: Vec<u32> = std::iter::once(root).chain(tree.tokens.iter().copied()).collect();
    let positions: Vec<usize> = std::iter::once(start).chain(tree.depths.iter().map(|d| start + d)).collect();
    let mask = tree.mask();
    let started = Instant::now();
    let (greedy, taps) = target.forward_argmax_tapped(cache, &tokens, &positions, Some(&mask), layers)?;
    let forward_time = started.elapsed();
    let walk = greedy_walk(&tree.forward_parents(), &tokens, &greedy);
    cache.compact(start, &walk)?;
    let bonus = greedy[walk[walk.len() - 1]];
    let accepted_taps = taps.map(|t| target.backend().select_rows(&t, &walk)).transpose()?;
    let verified = Verified { forward_time, accepted: walk.iter().map(|&row| tokens[row]).collect(), bonus };
    Ok((verified, accepted_taps))
}

/// The rows of the accepted path, from row 0 (the root): at each row, the child whose token is the
/// target's greedy token there. Siblings carry distinct tokens (distinct ranks of one candidate list),
/// so the child, if any, is unique.
pub(crate) fn greedy_walk(parents: &[Option<usize>], tokens: &[u32], greedy: &[u32]) -> Vec<usize> {
    let mut walk = vec![0];
    let mut row = 0;
    // Children of a row come after it, so one forward scan from the current row finds the next step.
    while let Some(child) = (row + 1..tokens.len()).find(|&c| parents[c] == Some(row) && tokens[c] == greedy[row]) {
        walk.push(child);
        row = child;
    }
    walk
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_follows_greedy_tokens_and_stops_at_a_mismatch() {
        // root -> {a=5, b=6}, a -> c=7, b -> d=8
        let parents = [None, Some(0), Some(0), Some(1), Some(2)];
        let tokens = [1, 5, 6, 7, 8];
        assert_eq!(greedy_walk(&parents, &tokens, &[6, 0, 8, 0, 9]), [0, 2, 4]);
        assert_eq!(greedy_walk(&parents, &tokens, &[5, 3, 0, 0, 0]), [0, 1]);
        assert_eq!(greedy_walk(&parents, &tokens, &[9, 0, 0, 0, 0]), [0]);
    }
}
