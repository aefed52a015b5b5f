use kdtree_quant::reference::dot;
use rayon::prelude::*;

use super::elementwise::softmax_row;
use crate::mask::TreeMask;

/// Head layout of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
    /// Multiplies `q · k` before the softmax.
    pub scale: f32,
}

/// Attention of `n` new queries over a cache of `t = past + n` keys and values.
///
/// `q` is `[n, heads, qk_dim]`; `k` `[t, heads, qk_dim]` and `v` `[t, heads, v_dim]` in cache
/// order, the `n` new entries last. Query `i` sees every one of the `past` cached entries and new
/// entry `j` where `mask.visible(i, j)`. Masked keys are skipped, not zero-weighted: the softmax and
/// the weighted sum run over the visible keys only, in cache order, so a tree node's output is the
/// same bits as a sequential forward over its path. Returns `[n, heads, v_dim]`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], past: usize, mask: &TreeMask, shape: AttentionShape) -> Vec<f32> {
    let AttentionShape { heads, qk_dim, v_dim, scale } = shape;
    let n = mask.len();
    assert_eq!(q.len(), n * heads * qk_dim, "attention: q disagrees with the mask's length");
    assert_eq!(k.len(), (past + n) * heads * qk_dim, "attention: k holds a different number of entries");
    assert_eq!(v.len(), (past + n) * heads * v_dim, "attention: v holds a different number of entries");
    let mut out = vec![0f32; n * heads * v_dim];
    out.par_chunks_mut(v_dim).enumerate().for_each(|(row, o)| {
        let (i, h) = (row / heads, row % heads);
        let keys: Vec<usize> = (0..past).chain((0..n).filter(|&j| mask.visible(i, j)).map(|j| past + j)).collect();
        let qh = &q[row * qk_dim..][..qk_dim];
        let mut p: Vec<f32> = keys.iter().map(|&t| dot(qh, &k[(t * heads + h) * qk_dim..][..qk_dim]) * scale).collect();
        softmax_row(&mut p);
        for (&t, &w) in keys.iter().zip(&p) {
            for (o, &x) in o.iter_mut().zip(&v[(t * heads + h) * v_dim..][..v_dim]) {
                *o += w * x;
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: AttentionShape = AttentionShape { heads: 2, qk_dim: 3, v_dim: 2, scale: 0.5 };

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| (((i + seed) * 7919) % 97) as f32 / 20.0 - 2.0).collect()
    }

    #[test]
    fn one_visible_key_returns_its_value() {
        let (q, k) = (values(6, 1), values(6, 2));
        let v = values(4, 3);
        assert_eq!(attention(&q, &k, &v, 0, &TreeMask::causal(1), SHAPE), v);
    }

    #[test]
    fn a_tree_query_equals_the_same_query_over_its_path_alone() {
        // Cache of 2, then a tree: 0 -> {1, 2}, 2 -> 3. Node 3 sees cache + nodes 0, 2, 3.
        let (past, n) = (2, 4);
        let q = values(n * 6, 4);
        let (k, v) = (values((past + n) * 6, 5), values((past + n) * 4, 6));
        let tree = TreeMask::from_parents(&[None, Some(0), Some(0), Some(2)]);
        let out = attention(&q, &k, &v, past, &tree, SHAPE);
        // The path's keys in cache order: entries 0, 1, 2 (node 0), 4 (node 2), 5 (node 3).
        let pick =
            |a: &[f32], w: usize| [0, 1, 2, 4, 5].iter().flat_map(|&t| a[t * w..][..w].to_vec()).collect::<Vec<_>>();
        let alone = attention(&q[3 * 6..], &pick(&k, 6), &pick(&v, 4), 4, &TreeMask::causal(1), SHAPE);
        assert_eq!(out[3 * 4..], alone[..]);
    }
}
