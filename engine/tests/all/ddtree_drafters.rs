// The model drafters: exact decoding with each, their KV cache reuse across rounds, and bad input.

use std::sync::LazyLock;

use crate::ddtree_common::{assert_exact, tiny_model};
use kdtree_engine::Model;
use kdtree_engine::cpu::CpuBackend;
use kdtree_engine::spec::{BlockDrafter, Drafter, ModelDrafter, TreeLimits};

/// Targets (bf16, INT4 experts) and a draft model of another seed.
static MODELS: LazyLock<[Model; 3]> =
    LazyLock::new(|| [tiny_model(false, 11), tiny_model(true, 11), tiny_model(false, 12)]);

const PROMPTS: [&[u32]; 3] = [&[1], &[5, 6, 7, 8, 5, 6, 7], &[200, 3, 3, 3, 90, 17]];

#[test]
fn ddtree_with_a_draft_model_equals_greedy() {
    let [bf16, int4, other] = &*MODELS;
    for target in [bf16, int4] {
        for (i, prompt) in PROMPTS.iter().enumerate() {
            let limits = TreeLimits { budget: 4 + 7 * i, draft_len: 2 + 3 * i };
            let vocab = target.config.vocab_size;
            assert_exact(target, &mut ModelDrafter::new(other, vocab).unwrap(), prompt, 20, limits, None);
            // Drafting with the target itself: its rank-1 token at depth 1 is the target's greedy token
            // and is always the first node, so every round with a tree accepts at least it.
            let stats = assert_exact(target, &mut ModelDrafter::new(target, vocab).unwrap(), prompt, 20, limits, None);
            for (&accepted, &size) in stats.accepted.iter().zip(&stats.tree_sizes) {
                assert!(size == 0 || accepted >= 2, "{stats:?}");
            }
        }
    }
}

#[test]
fn ddtree_with_a_block_drafter_equals_greedy() {
    let [bf16, int4, other] = &*MODELS;
    for (target, draft) in [(bf16, other), (int4, int4)] {
        for (i, prompt) in PROMPTS.iter().enumerate() {
            let limits = TreeLimits { budget: 3 + 9 * i, draft_len: 1 + 3 * i };
            let mut drafter = BlockDrafter::new(draft, target.config.vocab_size, None).unwrap();
            let stats = assert_exact(target, &mut drafter, prompt, 20, limits, Some(42));
            // A model's rows are full distributions over 256 tokens, so every tree fills its budget
            // (except a last round that drafts nothing, having one token left to emit).
            assert!(stats.tree_sizes.iter().all(|&s| s == limits.budget || s == 0), "{stats:?}");
        }
    }
}

/// Drafts from a drafter that has already drafted for other texts equal a fresh drafter's: whatever
/// the reused KV cache holds is exactly what a fresh one would compute.
#[test]
fn reused_draft_caches_give_the_drafts_of_fresh_ones() {
    let [target, _, draft] = &*MODELS;
    let vocab = target.config.vocab_size;
    let calls: [(&[u32], u32); 4] = [(&[1, 2, 3], 4), (&[1, 2, 3, 4, 9], 9), (&[1, 2, 7], 8), (&[1, 2, 7, 8], 8)];
    // Drafters for a target on the CPU (a model drafter drafts alike for a target on any backend).
    type Boxed<'a> = Box<dyn Drafter<CpuBackend> + 'a>;
    let new_model = || -> Boxed<'_> { Box::new(ModelDrafter::new(draft, vocab).unwrap()) };
    let new_block = || -> Boxed<'_> { Box::new(BlockDrafter::new(draft, vocab, Some(0)).unwrap()) };
    let (mut model, mut block) = (new_model(), new_block());
    for (context, bonus) in calls {
        let fresh = new_model().draft(context, bonus, 3, 5).unwrap();
        assert_eq!(model.draft(context, bonus, 3, 5).unwrap(), fresh);
        let fresh = new_block().draft(context, bonus, 3, 5).unwrap();
        assert_eq!(block.draft(context, bonus, 3, 5).unwrap(), fresh);
        assert_eq!((fresh.len(), fresh.at(3).len()), (3, 5));
    }
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = kdtree_engine::tiny::TinySpec { vocab_size: 128, ..Default::default() };
    kdtree_engine::tiny::write_tiny_model(dir.path(), &spec).unwrap();
    let small = Model::load(dir.path()).unwrap();
    assert!(ModelDrafter::new(&small, 256).is_err());
    assert!(BlockDrafter::new(&small, 256, None).is_err());
}
