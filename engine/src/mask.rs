//! Visibility among the new tokens of one forward pass.

use kdtree_jit::mla::NewMask;

/// Which new token sees which: row `query` lists the new tokens `key` it attends to. Every token
/// already in the KV cache is always visible; this mask only covers the tokens of the current
/// forward, in their order (which is also their order in the cache). Causal and full masks take no
/// memory, so a prompt of any length has one; a tree's is `n x n` bits.
#[derive(Clone, Debug)]
pub struct TreeMask {
    n: usize,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    Causal,
    Full,
    /// Row-major `n x n` visibility.
    Explicit(Vec<bool>),
}

impl TreeMask {
    /// Each token sees itself and every earlier one: ordinary prefill.
    pub fn causal(n: usize) -> Self {
        Self { n, kind: Kind::Causal }
    }

    /// Every token sees every other one (a non-causal block, as a block drafter uses).
    pub fn full(n: usize) -> Self {
        Self { n, kind: Kind::Full }
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
        Self { n, kind: Kind::Explicit(visible) }
    }

    /// Whether new token `query` attends to new token `key`.
    pub fn visible(&self, query: usize, key: usize) -> bool {
        match &self.kind {
            Kind::Causal => key <= query,
            Kind::Full => true,
            Kind::Explicit(v) => v[query * self.n + key],
        }
    }

    /// The number of new tokens.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The mask as the MLA kernels read it; a tree's as `n x ceil(n / 32)` words of bits.
    pub fn to_new_mask(&self) -> NewMask {
        match &self.kind {
            Kind::Causal => NewMask::Causal,
            Kind::Full => NewMask::Full,
            Kind::Explicit(_) => NewMask::Bits(self.words()),
        }
    }

    /// Every row as bits: bit `j % 32` of word `i * ceil(n / 32) + j / 32` is `visible(i, j)`.
    pub fn words(&self) -> Vec<u32> {
        let words = self.n.div_ceil(32);
        let mut out = vec![0u32; self.n * words];
        for i in 0..self.n {
            for j in 0..self.n {
                if self.visible(i, j) {
                    out[i * words + j / 32] |= 1 << (j % 32);
                }
            }
        }
        out
    }
}

/// Two masks are equal when they make the same tokens visible, however they are stored.
impl PartialEq for TreeMask {
    fn eq(&self, other: &Self) -> bool {
        self.n == other.n && (0..self.n).all(|i| (0..self.n).all(|j| self.visible(i, j) == other.visible(i, j)))
    }
}

impl Eq for TreeMask {}

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

    #[test]
    fn a_causal_mask_of_a_long_prompt_takes_no_memory_and_words_encode_rows() {
        let long = TreeMask::causal(1 << 40);
        assert!(long.visible(1 << 39, 7) && !long.visible(7, 8));
        let m = TreeMask::from_parents(&[None, Some(0), Some(0), Some(1)]);
        assert_eq!(m.words(), [0b1, 0b11, 0b101, 0b1011]);
        assert_eq!(m.to_new_mask(), NewMask::Bits(m.words()));
        assert_eq!(TreeMask::causal(40).to_new_mask(), NewMask::Causal);
    }
}
