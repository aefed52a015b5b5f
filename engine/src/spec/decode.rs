//! The DDTree decode loop and its statistics.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::drafter::Drafter;
use super::tree::DraftTree;
use super::verify::verify;
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::registry::Backend;

/// The tree's shape limits: at most `budget` nodes (root excluded), at most `draft_len` deep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TreeLimits {
    pub budget: usize,
    pub draft_len: usize,
}

/// What a DDTree run did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Per verification round: tokens accepted, root (the previous bonus token) counted.
    pub accepted: Vec<usize>,
    /// Per verification round: tree nodes, root excluded.
    pub tree_sizes: Vec<usize>,
    /// Target forward passes, the prefill included.
    pub target_forwards: usize,
    pub generated: usize,
    #[serde(serialize_with = "seconds")]
    pub elapsed: Duration,
    /// Of `elapsed`, the time spent in the drafter and the tree builder.
    #[serde(serialize_with = "seconds")]
    pub draft_time: Duration,
}

/// Durations print as seconds in JSON.
fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Stats {
    pub fn rounds(&self) -> usize {
        self.accepted.len()
    }

    /// Mean accepted length per round, root counted (the paper's tau).
    pub fn tau(&self) -> f64 {
        mean(&self.accepted)
    }

    pub fn mean_tree_size(&self) -> f64 {
        mean(&self.tree_sizes)
    }

    pub fn forwards_per_token(&self) -> f64 {
        self.target_forwards as f64 / self.generated.max(1) as f64
    }

    pub fn tokens_per_second(&self) -> f64 {
        self.generated as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

fn mean(xs: &[usize]) -> f64 {
    xs.iter().sum::<usize>() as f64 / xs.len().max(1) as f64
}

/// Greedy decoding of `target` sped up by draft trees: returns exactly what
/// [`crate::greedy_generate`] returns for the same prompt, `max_new` and `stop`.
///
/// Each round the drafter proposes `draft_len` positions after the bonus token, the best `budget`
/// prefixes form the tree, and one target forward verifies it; every round commits the accepted path
/// and a new bonus token, which is the target's own greedy choice after it.
pub fn ddtree_generate<B: Backend>(
    target: &Model<B>,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    max_new: usize,
    limits: TreeLimits,
    stop: Option<u32>,
) -> Result<(Vec<u32>, Stats)> {
    if prompt.is_empty() {
        return Err(EngineError::InvalidArgument("the prompt is empty".into()));
    }
    target.config.check_context(prompt.len(), max_new)?;
    let started = Instant::now();
    let mut stats = Stats::default();
    let mut out = Vec::new();
    if max_new == 0 {
        return Ok((out, stats));
    }
    let vocab = target.config.vocab_size;
    let mut cache = target.new_cache();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let mut bonus = *target.forward_argmax(&mut cache, prompt, &positions, None)?.last().expect("a row per token");
    stats.target_forwards += 1;
    let mut text = prompt.to_vec();
    while !push(&mut out, &[bonus], max_new, stop) {
        // No deeper than the tokens still wanted: the last of them can always come as a bonus.
        let draft_len = limits.draft_len.min(max_new - out.len() - 1);
        let drafting = Instant::now();
        // A tree that can hold nothing is not worth a drafter call: the round is one greedy step.
        let tree = if draft_len == 0 || limits.budget == 0 {
            DraftTree::default()
        } else {
            DraftTree::build(&drafter.draft(&text, bonus, draft_len, limits.budget.min(vocab))?, limits.budget)
        };
        stats.draft_time += drafting.elapsed();
        let verified = verify(target, &mut cache, bonus, &tree)?;
        stats.target_forwards += 1;
        stats.accepted.push(verified.accepted.len());
        stats.tree_sizes.push(tree.len());
        text.extend_from_slice(&verified.accepted);
        bonus = verified.bonus;
        if push(&mut out, &verified.accepted[1..], max_new, stop) {
            break;
        }
    }
    stats.generated = out.len();
    stats.elapsed = started.elapsed();
    Ok((out, stats))
}

/// Appends `tokens` to `out` as greedy decoding would emit them one by one; true once done (`max_new`
/// reached, or `stop` emitted, which is kept as greedy decoding keeps it).
fn push(out: &mut Vec<u32>, tokens: &[u32], max_new: usize, stop: Option<u32>) -> bool {
    for &t in tokens {
        out.push(t);
        if out.len() >= max_new || Some(t) == stop {
            return true;
        }
    }
    out.len() >= max_new
}
