//! Visibility among the new tokens of one forward pass.

use kdtree_jit::mla::NewMask;

/// Which new token sees which: row `query` lists the new tokens `key` it attends to. Every token
/// already in the KV cache is always visible; this mask only covers the tokens of the current
/// forward, in their order (which is also their order in the cache). Causal and full masks take no
/// memory, so a prompt of any length has one; a tree's is `n x n` bits.
#[derive(Clone, Debug)]
pub struct TreeMask {
    n: usize,
    /// As the MLA kernels and their reference read it: causal, full, or a tree's `n x ceil(n / 32)`
    /// words of bits.
    mask: NewMask,
}

impl TreeMask {
    /// Each token sees itself and every earlier one: ordinary prefill.
    pub fn causal(n: usize) -> Self {
        Self { n, mask: NewMask::Causal }
    }

    /// Every token sees every other one (a non-causal block, as a block drafter uses).
    pub fn full(n: usize) -> Self {
        Self { n, mask: NewMask::Full }
    }

    /// A tree in parents-first order: row `i` is row `parents[i]` plus `i` itself (a root,
    /// `None`, sees only itself), so each node sees exactly its ancestors.
    ///
    /// # Panics
    /// If `parents[i] >= i`: a parent must come before its children.
    pub fn from_parents(parents: &[Option<usize>]) -> Self {
        Self { n: parents.len(), mask: NewMask::tree(parents) }
    }

    /// Whether new token `query` attends to new token `key`.
    pub fn visible(&self, query: usize, key: usize) -> bool {
        self.mask.visible(self.n, query, key)
    }

    /// The number of new tokens.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The mask as the MLA kernels read it.
    pub(crate) fn new_mask(&self) -> &NewMask {
        &self.mask
    }

    /// Every row as bits: bit `j % 32` of word `i * ceil(n / 32) + j / 32` is `visible(i, j)`.
    pub fn words(&self) -> Vec<u32> {
        if let NewMask::Bits(words) = &self.mask {
            return words.clone();
        }
        let words = self.n.div_ceil(32);
        let mut out = vec![0u32; self.n * words];
        for i in 0..self.n {
            for j in (0..self.n).filter(|&j| self.visible(i, j)) {
                out[i * words + j / 32] |= 1 << (j % 32);
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
        assert_eq!(*m.new_mask(), NewMask::Bits(m.words()));
        assert_eq!(*TreeMask::causal(40).new_mask(), NewMask::Causal);
    }
}
