// DDTree output equals plain greedy output token for token, on tiny bf16 and INT4 models, for random
// prompts, budgets, depths and drafters; and the oracle drafter is accepted as deep as the tree goes.

use std::sync::LazyLock;

use crate::ddtree_common::{Script, Scripted, assert_exact, greedy_text, tiny_model};
use kdtree_engine::Model;
use kdtree_engine::spec::{LookupDrafter, TreeLimits};
use proptest::prelude::*;

/// The bf16 model and the one with INT4 routed experts.
static MODELS: LazyLock<[Model; 2]> = LazyLock::new(|| [tiny_model(false, 7), tiny_model(true, 7)]);

#[derive(Clone, Copy, Debug)]
enum Kind {
    Oracle,
    Wrong,
    Random(u64),
    Lookup,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Oracle), Just(Kind::Wrong), any::<u64>().prop_map(Kind::Random), Just(Kind::Lookup)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn ddtree_equals_greedy(
        int4 in any::<bool>(),
        prompt in prop::collection::vec(0u32..256, 1..12),
        max_new in 1usize..24,
        budget in 0usize..40,
        draft_len in 0usize..10,
        stop in prop::option::of(0u32..256),
        kind in kind(),
    ) {
        let model = &MODELS[int4 as usize];
        let vocab = model.config.vocab_size;
        let limits = TreeLimits { budget, draft_len };
        let text = greedy_text(model, &prompt, max_new);
        let stats = match kind {
            Kind::Oracle => {
                let stats = assert_exact(model, &mut Scripted::new(text, vocab, Script::Oracle), &prompt, max_new, limits, None);
                // The whole chain the budget allows is accepted, plus the root; only the last round may
                // have a shallower tree, as it drafts no further than the tokens still wanted.
                let rounds = stats.rounds();
                for (r, (&accepted, &size)) in stats.accepted.iter().zip(&stats.tree_sizes).enumerate() {
                    prop_assert_eq!(accepted, size + 1);
                    if r + 1 < rounds {
                        prop_assert_eq!(size, budget.min(draft_len));
                    }
                }
                stats
            }
            Kind::Wrong => {
                let stats = assert_exact(model, &mut Scripted::new(text, vocab, Script::Wrong { n: 3 }), &prompt, max_new, limits, stop);
                prop_assert!(stats.accepted.iter().all(|&a| a == 1));
                stats
            }
            Kind::Random(seed) => assert_exact(model, &mut Scripted::new(text, vocab, Script::Random { seed }), &prompt, max_new, limits, stop),
            Kind::Lookup => assert_exact(model, &mut LookupDrafter::new(3, vocab), &prompt, max_new, limits, stop),
        };
        prop_assert!(stats.accepted.iter().all(|&a| a <= draft_len + 1));
    }
}
