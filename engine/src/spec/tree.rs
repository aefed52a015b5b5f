//! The draft tree: the best B nodes under the factorised surrogate q(u) = Π q_i(u_i).
//!
//! The best B-node tree (root excluded) is the set of the B most probable prefixes, and it is prefix-
//! closed because extending a prefix never raises its probability. We enumerate prefixes best first
//! over rank tuples (r_1, .., r_d) into each depth's sorted candidate list: a max-heap starts with
//! (0) (the rank-1 token at depth 1); each pop emits a node and pushes its next sibling (r_1, .., r_d + 1)
//! and its first child (r_1, .., r_d, 0). Each of those scores at most its generator's, so the heap pops
//! in global order; B pops cost O(B log B).
//!
//! Order and ties: a node's score is its parent's score plus its own log-probability, summed in f64 from
//! the root down. Equal scores go to the lexicographically smaller rank tuple, which ranks a parent before
//! its children and a sibling before its later siblings, so the order is total, deterministic, and
//! consistent with the heap. Nodes are numbered in pop order, hence parents come first.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::drafter::Draft;
use crate::mask::TreeMask;

/// A flattened draft tree, nodes in pop order (the root, i.e. the bonus token, is not a node).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftTree {
    pub tokens: Vec<u32>,
    /// `None`: child of the root; `Some(j)`: child of node `j`, with `j` before this node.
    pub parents: Vec<Option<usize>>,
    /// 1 for children of the root.
    pub depths: Vec<usize>,
    /// The surrogate log q(u) of each node's prefix.
    pub scores: Vec<f64>,
}

impl DraftTree {
    /// The best `budget` nodes of `draft`, or fewer when the draft has fewer prefixes.
    pub fn build(draft: &Draft, budget: usize) -> DraftTree {
        let mut tree = DraftTree::default();
        let mut heap = BinaryHeap::new();
        if !draft.is_empty() && !draft.at(1).is_empty() {
            // Every score is a sum starting from the root's 0.0, so -0.0 never appears and ties stay ties.
            let score = 0.0 + f64::from(draft.at(1)[0].log_prob);
            heap.push(Candidate { score, ranks: vec![0], parent: None });
        }
        while tree.len() < budget {
            let Some(c) = heap.pop() else { break };
            let depth = c.ranks.len();
            let rank = c.ranks[depth - 1];
            let node = tree.len();
            tree.tokens.push(draft.at(depth)[rank].token);
            tree.parents.push(c.parent);
            tree.depths.push(depth);
            tree.scores.push(c.score);
            let parent_score = c.parent.map_or(0.0, |p| tree.scores[p]);
            if let Some(next) = draft.at(depth).get(rank + 1) {
                let mut ranks = c.ranks.clone();
                ranks[depth - 1] += 1;
                heap.push(Candidate { score: parent_score + f64::from(next.log_prob), ranks, parent: c.parent });
            }
            if let Some(first) = (depth < draft.len()).then(|| draft.at(depth + 1).first()).flatten() {
                let mut ranks = c.ranks;
                ranks.push(0);
                heap.push(Candidate { score: c.score + f64::from(first.log_prob), ranks, parent: Some(node) });
            }
        }
        tree
    }

    /// The first `n` nodes: parents come before their children, so this is a tree, and in pop order
    /// the best tree of its size.
    pub fn truncate(mut self, n: usize) -> DraftTree {
        self.tokens.truncate(n);
        self.parents.truncate(n);
        self.depths.truncate(n);
        self.scores.truncate(n);
        self
    }

    /// The number of nodes (root excluded).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Parents in the layout of one forward over `[root, nodes..]`: row 0 is the root, node i is row i + 1.
    pub fn forward_parents(&self) -> Vec<Option<usize>> {
        std::iter::once(None).chain(self.parents.iter().map(|p| Some(p.map_or(0, |j| j + 1)))).collect()
    }

    /// The ancestor mask over `[root, nodes..]`: each row is its parent's row plus itself.
    pub fn mask(&self) -> TreeMask {
        TreeMask::from_parents(&self.forward_parents())
    }
}

/// A prefix waiting in the heap. Ordered so that the max-heap pops the best: higher score, then the
/// lexicographically smaller rank tuple.
struct Candidate {
    score: f64,
    ranks: Vec<usize>,
    parent: Option<usize>,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.ranks.cmp(&self.ranks))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}
