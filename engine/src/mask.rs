//! Visibility among the new tokens of one forward pass.

/// Which new token sees which: row `query` lists the new tokens `key` it attends to. Every token
/// already in the KV cache is always visible; this mask only covers the tokens of the current
/// forward, in their order (which is also their order in the cache).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeMask {
    n: usize,
    visible: Vec<bool>,
}

impl TreeMask {
    /// Each token sees itself and every earlier one: ordinary prefill.
    pub fn causal(n: usize) -> Self {
        Self::from_fn(n, |q, k| k <= q)
    }

    /// Every token sees every other one (a non-causal block, as a block drafter uses).
    pub fn full(n: usize) -> Self {
        Self::from_fn(n, |_, _| true)
    }

    /// A tree in parents-first order: row `i` is row `parents[i]` plus `i` itself (a root,
    /// `None`, sees only itself), so each node sees exactly its ancestors.
    ///
    /// # Panics
    /// If `parents[i] >= i`: a parent must come before its children.
    pub fn from_parents(parents: &[Option<usize>]) -> Self {
        let n = parents.len();
        let mut visible = vec![false; n * n];
        for (i, parent) in parents.iter().enumerate() {
            if let Some(p) = *parent {
                assert!(p < i, "tree node {i} has parent {p}: parents must come first");
                visible.copy_within(p * n..p * n + n, i * n);
            }
            visible[i * n + i] = true;
        }
        Self { n, visible }
    }

    fn from_fn(n: usize, f: impl Fn(usize, usize) -> bool) -> Self {
        Self { n, visible: (0..n * n).map(|i| f(i / n.max(1), i % n.max(1))).collect() }
    }

    /// Whether new token `query` attends to new token `key`.
    pub fn visible(&self, query: usize, key: usize) -> bool {
        self.visible[query * self.n + key]
    }

    /// The number of new tokens.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_of_parents_is_the_causal_mask() {
        let chain: Vec<Option<usize>> = (0..5usize).map(|i| i.checked_sub(1)).collect();
        assert_eq!(TreeMask::from_parents(&chain), TreeMask::causal(5));
    }

    #[test]
    fn tree_nodes_see_exactly_their_ancestors() {
        // 0 -> {1, 2}, 1 -> 3, 2 -> 4
        let m = TreeMask::from_parents(&[None, Some(0), Some(0), Some(1), Some(2)]);
        let row = |q: usize| (0..5).filter(|&k| m.visible(q, k)).collect::<Vec<_>>();
        assert_eq!(row(3), [0, 1, 3]);
        assert_eq!(row(4), [0, 2, 4]);
        assert_eq!(row(2), [0, 2]);
        assert!(TreeMask::full(3).visible(0, 2) && !TreeMask::causal(3).visible(0, 2));
    }
}
