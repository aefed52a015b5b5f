// Batch invariance, what greedy exactness rests on: the tree forward's logits at every node equal, bit
// for bit, those of feeding the node's path one token at a time; and after verification the compacted
// cache continues exactly as a cache that only ever saw the accepted path. Both over a bf16 and an
// FP8 cache (whose compaction gathers entries and quantizes them again: the values must not move).

use std::sync::LazyLock;

use crate::ddtree_common::tiny_model;
use kdtree_engine::registry::{KvDtype, KvStore};
use kdtree_engine::spec::{Draft, DraftTree, verify};
use kdtree_engine::{KvCache, Model};
use kdtree_quant::sample::Uniform;
use proptest::prelude::*;

/// Indexed by `int4 + 2 * fp8`: bf16 experts or INT4 ones, a bf16 cache or an FP8 one.
static MODELS: LazyLock<[Model; 4]> = LazyLock::new(|| {
    let fp8 = |int4| {
        let mut m = tiny_model(int4, 3);
        m.set_kv_dtype(KvDtype::Fp8).unwrap();
        m
    };
    [tiny_model(false, 3), tiny_model(true, 3), fp8(false), fp8(true)]
});

/// The cache after prefilling `prompt` in one forward.
fn prefilled(model: &Model, prompt: &[u32]) -> KvCache {
    let mut cache = model.new_cache();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    model.forward(&mut cache, prompt, &positions, None).unwrap();
    cache
}

/// Logits after feeding `path` one token at a time on top of `cache`.
fn sequential(model: &Model, mut cache: KvCache, path: &[u32]) -> Vec<f32> {
    let mut logits = Vec::new();
    for &t in path {
        let position = cache.len();
        logits = model.forward(&mut cache, &[t], &[position], None).unwrap();
    }
    logits
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// A random tree: random log-probabilities over the vocabulary at `depth` positions, best `budget` nodes.
fn random_tree(vocab: usize, depth: usize, budget: usize, seed: u64) -> DraftTree {
    // On a grid of 0.01, so that ties between candidates occur too.
    let rows: Vec<f32> =
        Uniform::new(seed).take(depth * vocab).map(|u| -((u * 1000.0) as u32 as f32) / 100.0).collect();
    DraftTree::build(&Draft::from_log_probs(&rows, vocab, budget.min(vocab)).unwrap(), budget)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn tree_logits_equal_sequential_logits_bitwise(
        int4 in any::<bool>(),
        fp8 in any::<bool>(),
        prompt in prop::collection::vec(0u32..256, 1..10),
        root in 0u32..256,
        depth in 1usize..5,
        budget in 1usize..20,
        seed in any::<u64>(),
    ) {
        let model = &MODELS[int4 as usize + 2 * fp8 as usize];
        let vocab = model.config.vocab_size;
        let tree = random_tree(vocab, depth, budget, seed);
        let start = prompt.len();
        let tokens: Vec<u32> = std::iter::once(root).chain(tree.tokens.iter().copied()).collect();
        let positions: Vec<usize> = std::iter::once(start).chain(tree.depths.iter().map(|d| start + d)).collect();
        let mut cache = prefilled(model, &prompt);
        let logits = model.forward(&mut cache, &tokens, &positions, Some(&tree.mask())).unwrap();

        let parents = tree.forward_parents();
        for row in 0..tokens.len() {
            let mut path = vec![tokens[row]];
            let mut at = row;
            while let Some(p) = parents[at] {
                path.push(tokens[p]);
                at = p;
            }
            path.reverse();
            let alone = sequential(model, prefilled(model, &prompt), &path);
            prop_assert_eq!(bits(&logits[row * vocab..(row + 1) * vocab]), bits(&alone), "row {}", row);
        }
    }

    #[test]
    fn the_compacted_cache_continues_like_the_accepted_path_alone(
        int4 in any::<bool>(),
        fp8 in any::<bool>(),
        prompt in prop::collection::vec(0u32..256, 1..10),
        root in 0u32..256,
        budget in 1usize..20,
        seed in any::<u64>(),
    ) {
        let model = &MODELS[int4 as usize + 2 * fp8 as usize];
        let vocab = model.config.vocab_size;
        // Put the target's own greedy chain into the tree (as rank 1 everywhere) so that a path of
        // several tokens is accepted among random branches.
        let mut chain = prefilled(model, &prompt);
        let mut rows = Vec::new();
        let mut next = root;
        for d in 0..3 {
            let position = chain.len();
            let logits = model.forward(&mut chain, &[next], &[position], None).unwrap();
            next = kdtree_engine::ops::cpu::argmax(&logits, vocab)[0];
            let mut row: Vec<f32> = (0..vocab).map(|t| -((((t as u64) ^ seed.rotate_left(d)) % 97) as f32) - 1.0).collect();
            row[next as usize] = 0.0;
            rows.extend(row);
        }
        let tree = DraftTree::build(&Draft::from_log_probs(&rows, vocab, budget.min(vocab)).unwrap(), budget);
        let mut cache = prefilled(model, &prompt);
        let verified = verify(model, &mut cache, root, &tree).unwrap();
        prop_assert_eq!(verified.accepted.len(), budget.min(3) + 1);
        prop_assert_eq!(cache.len(), prompt.len() + verified.accepted.len());

        let after_tree = sequential(model, cache, &[verified.bonus]);
        let path: Vec<u32> = verified.accepted.iter().copied().chain([verified.bonus]).collect();
        let expected = sequential(model, prefilled(model, &prompt), &path);
        prop_assert_eq!(bits(&after_tree), bits(&expected));
    }
}
