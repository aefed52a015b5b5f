// The tree builder against brute force: on small vocabularies and depths, enumerate every prefix,
// sort by the surrogate score with the documented tie rule, and compare with the heap's B nodes.

use kdtree_engine::spec::{Draft, DraftTree};
use proptest::prelude::*;

/// Every token path of length 1..=L over `full` (each depth's complete sorted list), as (score, rank
/// tuple, token path), in the builder's order: score descending, then rank tuple ascending.
fn all_prefixes_sorted(full: &Draft) -> Vec<(f64, Vec<usize>, Vec<u32>)> {
    let mut out = Vec::new();
    let mut frontier = vec![(0.0f64, Vec::new(), Vec::new())];
    for depth in 1..=full.len() {
        let mut next = Vec::new();
        for (score, ranks, tokens) in &frontier {
            for (rank, c) in full.at(depth).iter().enumerate() {
                let item =
                    (score + f64::from(c.log_prob), [&ranks[..], &[rank]].concat(), [&tokens[..], &[c.token]].concat());
                next.push(item);
            }
        }
        out.extend(next.iter().cloned());
        frontier = next;
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    out
}

fn node_path(tree: &DraftTree, mut node: usize) -> Vec<u32> {
    let mut path = vec![tree.tokens[node]];
    while let Some(p) = tree.parents[node] {
        path.push(tree.tokens[p]);
        node = p;
    }
    path.reverse();
    path
}

/// Log-probabilities from a small set, so that ties (and zero-probability tokens) are common.
fn log_prob() -> impl Strategy<Value = f32> {
    prop::sample::select(vec![0.0, 0.5f32.ln(), 0.25f32.ln(), -1.0, -3.0, f32::NEG_INFINITY])
}

proptest! {
    #[test]
    fn the_heap_tree_is_the_best_b_prefixes(
        (vocab, rows) in (1usize..5, 1usize..5).prop_flat_map(|(v, l)| (Just(v), prop::collection::vec(log_prob(), v * l))),
        budget in 0usize..24,
    ) {
        let draft = Draft::from_log_probs(&rows, vocab, budget.min(vocab)).unwrap();
        let tree = DraftTree::build(&draft, budget);
        let full = Draft::from_log_probs(&rows, vocab, vocab).unwrap();
        let best: Vec<_> = all_prefixes_sorted(&full).into_iter().take(budget).collect();

        prop_assert_eq!(tree.len(), best.len());
        for (node, (score, _, tokens)) in best.iter().enumerate() {
            prop_assert_eq!(&node_path(&tree, node), tokens);
            prop_assert_eq!(tree.scores[node].to_bits(), score.to_bits());
            prop_assert_eq!(tree.depths[node], tokens.len());
            // Prefix-closed, parents first.
            if let Some(p) = tree.parents[node] {
                prop_assert!(p < node);
                prop_assert_eq!(&node_path(&tree, p)[..], &tokens[..tokens.len() - 1]);
            } else {
                prop_assert_eq!(tokens.len(), 1);
            }
        }
    }
}

#[test]
fn the_forward_layout_puts_the_root_first_and_each_row_sees_its_ancestors() {
    // depth 1: tokens 3 (p = 0.6), 4 (p = 0.4); depth 2: token 5 only.
    let rows = [f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.6f32.ln(), 0.4f32.ln(), f32::NEG_INFINITY];
    let next = [f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0];
    let draft = Draft::from_log_probs(&[rows, next].concat(), 6, 4).unwrap();
    let tree = DraftTree::build(&draft, 3);
    // Pop order: 3 (0.6), then 3->5 (0.6) before 4 (0.4).
    assert_eq!(tree.tokens, [3, 5, 4]);
    assert_eq!(tree.forward_parents(), [None, Some(0), Some(1), Some(0)]);
    let mask = tree.mask();
    assert!(mask.visible(2, 0) && mask.visible(2, 1) && !mask.visible(2, 3) && !mask.visible(3, 1));
}
