//! The DDTree decode loop and its statistics.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::cost::CostModel;
use super::drafter::Drafter;
use super::tree::DraftTree;
use super::verify::verify_tapped;
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::registry::Backend;

/// The tree's shape limits: at most `budget` nodes (root excluded), at most `draft_len` deep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TreeLimits {
    pub budget: usize,
    pub draft_len: usize,
}

/// How each round's tree is shaped.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// DDTree: the best `budget` prefixes of the draft, at most `draft_len` deep.
    Tree(TreeLimits),
    /// Chain speculation: the drafter's top-1 token at each of `len` positions (T = len + 1).
    Chain { len: usize },
    /// DDTree whose size is chosen each round: of the best `limits.budget` prefixes (at most the
    /// cost model's largest size), the first b that maximise expected accepted tokens per µs of the
    /// target forward under `cost`, b + 1 one of the sizes it measured ([`CostModel::choose`]).
    CostAware {
        limits: TreeLimits,
        #[serde(skip)]
        cost: CostModel,
    },
}

impl Method {
    /// `ddtree`, `chain` or `ddtree-cost`.
    pub fn name(&self) -> &'static str {
        match self {
            Method::Tree(_) => "ddtree",
            Method::Chain { .. } => "chain",
            Method::CostAware { .. } => "ddtree-cost",
        }
    }

    /// The name with its sizes: `ddtree B=32 L=8`, `chain L=4`, `ddtree-cost B<=128 L=8`.
    pub fn label(&self) -> String {
        match self {
            Method::Tree(l) => format!("ddtree B={} L={}", l.budget, l.draft_len),
            Method::Chain { len } => format!("chain L={len}"),
            Method::CostAware { limits: l, .. } => format!("ddtree-cost B<={} L={}", l.budget, l.draft_len),
        }
    }

    /// The deepest a round drafts.
    fn draft_len(&self) -> usize {
        match self {
            Method::Tree(l) | Method::CostAware { limits: l, .. } => l.draft_len,
            Method::Chain { len } => *len,
        }
    }

    /// The round's tree from a drafter asked for `draft_len` positions.
    fn tree<B: Backend>(
        &self,
        drafter: &mut dyn Drafter<B>,
        text: &[u32],
        bonus: u32,
        draft_len: usize,
        vocab: usize,
    ) -> Result<DraftTree> {
        let budget = match self {
            Method::Tree(l) => l.budget,
            // No larger tree than the cost model measured can be chosen: none is drafted.
            Method::CostAware { limits: l, cost } => l.budget.min(cost.max_nodes()),
            Method::Chain { .. } => draft_len,
        };
        // A best-first tree of `budget` nodes takes at most that many ranks at any depth.
        let top_k = if let Method::Chain { .. } = self { 1 } else { budget.min(vocab) };
        // A tree that can hold nothing is not worth a drafter call: the round is one greedy step.
        if draft_len == 0 || budget == 0 {
            return Ok(DraftTree::default());
        }
        let tree = DraftTree::build(&drafter.draft(text, bonus, draft_len, top_k)?, budget);
        Ok(match self {
            Method::CostAware { cost, .. } => {
                let size = cost.choose(&tree.scores);
                tree.truncate(size)
            }
            _ => tree,
        })
    }
}

/// What a speculative run did.
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
    /// Of `elapsed`, the prefill forward.
    #[serde(serialize_with = "seconds")]
    pub prefill_time: Duration,
    /// Of `elapsed`, the verification rounds' target forwards (argmax ids on the host included).
    #[serde(serialize_with = "seconds")]
    pub verify_forward_time: Duration,
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

    pub(crate) fn tokens_per_second(&self) -> f64 {
        self.generated as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Of the rounds' time (all but the prefill), the share outside the target's forwards: drafting,
    /// building the tree and its mask, the greedy walk and KV compaction.
    pub(crate) fn host_share(&self) -> f64 {
        let rounds = self.elapsed.saturating_sub(self.prefill_time).as_secs_f64();
        let outside = rounds - self.verify_forward_time.as_secs_f64();
        if rounds > 0.0 { (outside / rounds).max(0.0) } else { 0.0 }
    }
}

fn mean(xs: &[usize]) -> f64 {
    xs.iter().sum::<usize>() as f64 / xs.len().max(1) as f64
}

/// Greedy decoding of `target` sped up by draft trees: returns exactly what
/// [`crate::greedy_generate`] returns for the same prompt, `max_new` and `stop` ids.
///
/// Each round the drafter proposes `draft_len` positions after the bonus token, the best `budget`
/// prefixes form the tree, and one target forward verifies it; every round commits the accepted path
/// and a new bonus token, which is the target's own greedy choice after it.
pub fn ddtree_generate<B: Backend>(
    target: &Model<B>,
    drafter: &mut dyn Drafter<B>,
    prompt: &[u32],
    max_new: usize,
    limits: TreeLimits,
    stop: &[u32],
) -> Result<(Vec<u32>, Stats)> {
    speculative_generate(target, drafter, prompt, max_new, &Method::Tree(limits), stop)
}

/// Greedy decoding sped up by speculation of any [`Method`]: the same output as
/// [`crate::greedy_generate`], token for token.
pub fn speculative_generate<B: Backend>(
    target: &Model<B>,
    drafter: &mut dyn Drafter<B>,
    prompt: &[u32],
    max_new: usize,
    method: &Method,
    stop: &[u32],
) -> Result<(Vec<u32>, Stats)> {
    speculative_generate_streamed(target, drafter, prompt, max_new, method, |token| Ok(stop.contains(&token)))
}

/// [`speculative_generate`], handing each token to `on_token` in order as soon as its round has
/// verified it (as [`crate::greedy_generate_streamed`] does): generation stops after a token for
/// which it returns true, and fails with its error.
pub(crate) fn speculative_generate_streamed<B: Backend>(
    target: &Model<B>,
    drafter: &mut dyn Drafter<B>,
    prompt: &[u32],
    max_new: usize,
    method: &Method,
    mut on_token: impl FnMut(u32) -> Result<bool>,
) -> Result<(Vec<u32>, Stats)> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt { op: "speculative decoding" });
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
    // A drafter conditioned on the target gets the features of every token as it is committed.
    let layers = drafter.target_layers().to_vec();
    let mut bonus = target.prefill_tapped(&mut cache, prompt, &layers, |taps| drafter.commit(taps))?;
    stats.target_forwards += prompt.len().div_ceil(target.prefill_chunk());
    stats.prefill_time = started.elapsed();
    let mut text = prompt.to_vec();
    while !push(&mut out, &[bonus], max_new, &mut on_token)? {
        // No deeper than the tokens still wanted: the last of them can always come as a bonus.
        let draft_len = method.draft_len().min(max_new - out.len() - 1);
        let drafting = Instant::now();
        let tree = method.tree(drafter, &text, bonus, draft_len, vocab)?;
        stats.draft_time += drafting.elapsed();
        let (verified, taps) = verify_tapped(target, &mut cache, bonus, &tree, &layers)?;
        if let Some(taps) = taps {
            drafter.commit(&taps)?;
        }
        stats.verify_forward_time += verified.forward_time;
        stats.target_forwards += 1;
        stats.accepted.push(verified.accepted.len());
        stats.tree_sizes.push(tree.len());
        text.extend_from_slice(&verified.accepted);
        bonus = verified.bonus;
        if push(&mut out, &verified.accepted[1..], max_new, &mut on_token)? {
            break;
        }
    }
    stats.generated = out.len();
    stats.elapsed = started.elapsed();
    Ok((out, stats))
}

/// Appends `tokens` to `out` as greedy decoding would emit them one by one, each handed to
/// `on_token`; true once done (`max_new` reached, or `on_token` said stop after a token, which is
/// kept as greedy decoding keeps it).
fn push(
    out: &mut Vec<u32>,
    tokens: &[u32],
    max_new: usize,
    on_token: &mut impl FnMut(u32) -> Result<bool>,
) -> Result<bool> {
    for &t in tokens {
        out.push(t);
        if on_token(t)? || out.len() >= max_new {
            return Ok(true);
        }
    }
    Ok(out.len() >= max_new)
}
