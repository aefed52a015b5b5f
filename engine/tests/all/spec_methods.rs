// Chain speculation and cost-aware DDTree reproduce greedy decoding token for token, with the noisy
// oracle as the drafter, and shape their rounds as documented.

use std::sync::LazyLock;

use crate::ddtree_common::{greedy_text, tiny_model};
use kdtree_engine::spec::{CostModel, Method, NoisyOracle, Stats, TreeLimits, speculative_generate, sweep};
use kdtree_engine::{Model, greedy_generate};
use proptest::prelude::*;

static MODELS: LazyLock<[Model; 2]> = LazyLock::new(|| [tiny_model(false, 11), tiny_model(true, 11)]);

fn run(model: &Model, prompt: &[u32], max_new: usize, p: f64, method: &Method) -> Stats {
    let vocab = model.config.vocab_size;
    let mut oracle = NoisyOracle::new(greedy_text(model, prompt, max_new), p, 5, vocab).unwrap();
    let (tokens, stats) = speculative_generate(model, &mut oracle, prompt, max_new, method, &[]).unwrap();
    assert_eq!(tokens, greedy_generate(model, prompt, max_new, &[]).unwrap(), "{method:?} differs from greedy");
    assert_eq!(stats.target_forwards, stats.rounds() + 1);
    stats
}

fn cost(points: Vec<(usize, f64)>) -> CostModel {
    CostModel::new("test".into(), "tiny".into(), points).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn chains_equal_greedy_and_are_chains(
        int4 in any::<bool>(),
        prompt in prop::collection::vec(0u32..256, 1..10),
        max_new in 1usize..20,
        len in 0usize..8,
        // At p = 0 the first rank has probability 0, and the oracle does not propose it.
        p in 0.05f64..=1.0,
    ) {
        let stats = run(&MODELS[int4 as usize], &prompt, max_new, p, &Method::Chain { len });
        // Each round drafts the whole chain, or the tokens still wanted after its root (the bonus token
        // already emitted) less one, which can always come as the next bonus.
        let mut emitted = 1;
        for (&accepted, &size) in stats.accepted.iter().zip(&stats.tree_sizes) {
            prop_assert!(accepted <= size + 1);
            prop_assert_eq!(size, len.min(max_new - emitted - 1));
            emitted += accepted;
        }
    }

    #[test]
    fn cost_aware_trees_equal_greedy_and_stay_in_the_budget(
        int4 in any::<bool>(),
        prompt in prop::collection::vec(0u32..256, 1..10),
        max_new in 1usize..20,
        budget in 0usize..24,
        slope in 0.0f64..200.0,
        p in 0.0f64..=1.0,
    ) {
        let limits = TreeLimits { budget, draft_len: 6 };
        let method = Method::CostAware { limits, cost: cost([1, 2, 3, 5, 9, 17, 25].map(|t| (t, 100.0 + slope * (t - 1) as f64)).to_vec()) };
        let stats = run(&MODELS[int4 as usize], &prompt, max_new, p, &method);
        prop_assert!(stats.tree_sizes.iter().all(|&s| s <= budget));
    }
}

#[test]
fn the_cost_decides_the_tree_size() {
    let model = &MODELS[0];
    let prompt = [3, 1, 4, 1, 5];
    let limits = TreeLimits { budget: 16, draft_len: 4 };
    // Free rows: the whole budget every round (the last may be cut by the tokens still wanted).
    let flat = run(
        model,
        &prompt,
        30,
        0.7,
        &Method::CostAware { limits, cost: cost(vec![(1, 100.0), (17, 100.0), (64, 100.0)]) },
    );
    let rounds = flat.rounds();
    assert!(flat.tree_sizes[..rounds - 1].iter().all(|&s| s == 16), "{:?}", flat.tree_sizes);
    // Each row costs a whole forward: no tree pays, so every round is one greedy step.
    let steep = run(model, &prompt, 30, 0.7, &Method::CostAware { limits, cost: cost(vec![(1, 100.0), (2, 200.0)]) });
    assert!(steep.tree_sizes.iter().all(|&s| s == 0), "{:?}", steep.tree_sizes);
    assert_eq!(steep.rounds(), 29);
}

#[test]
fn a_better_oracle_is_accepted_further() {
    let model = &MODELS[1];
    let prompt = [9, 2, 6];
    let chain = Method::Chain { len: 6 };
    let (weak, strong) = (run(model, &prompt, 40, 0.2, &chain), run(model, &prompt, 40, 0.95, &chain));
    assert!(strong.tau() > weak.tau() + 1.0, "tau {} at p = 0.95, {} at p = 0.2", strong.tau(), weak.tau());
    let sure = run(model, &prompt, 40, 1.0, &chain);
    let rounds = sure.rounds();
    assert!(sure.accepted[..rounds - 1].iter().all(|&a| a == 7), "{:?}", sure.accepted);
}

#[test]
fn the_sweep_runs_every_method_at_every_p_and_checks_each_against_greedy() {
    let model = &MODELS[1];
    let cost = cost(vec![(1, 100.0), (16, 180.0)]);
    let methods = sweep::methods(16, 4, Some(&cost));
    let names: Vec<String> = methods.iter().map(Method::label).collect();
    assert_eq!(names.len(), 7 + 3 + 1, "{names:?}");
    assert_eq!(names[7], "ddtree B=4 L=4");
    assert_eq!(names[10], "ddtree-cost B<=16 L=4");
    let mut seen = 0;
    let rows = sweep::compare(model, &[4, 2, 7], 12, &[0.5, 0.9], &methods, 3, |_| seen += 1).unwrap();
    assert_eq!(rows.len(), 1 + 2 * methods.len());
    assert_eq!(seen, rows.len());
    assert_eq!((rows[0].method.as_str(), rows[0].p), ("greedy", None));
    assert!(rows.iter().all(|r| r.identical), "{}", sweep::table(&rows));
    assert!(rows[1..].iter().all(|r| r.forwards_per_token <= 1.0 + 1e-9 && r.tau >= 1.0));
    assert_eq!(sweep::table(&rows).lines().count(), rows.len() + 2, "header, rule, a line per row");
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("spec.svg");
    kdtree_engine::spec::plot::write_svg(&svg, &rows).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg") && text.contains("ddtree-cost B&lt;=16 L=4"), "the legend names the methods");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The chooser's b against brute force: over every prefix-closed subset of a small best-first
    /// tree whose size the cost model measured, the most expected tokens per µs. The best subset of
    /// each size is the first nodes in pop order, so no subset beats the prefix that `choose` picks.
    #[test]
    fn the_cost_aware_size_is_the_best_of_every_subtree(
        probs in prop::collection::vec(prop::collection::vec(0.01f32..1.0, 1..4), 1..4),
        budget in 1usize..9,
        points in prop::collection::vec(1.0f64..400.0, 1..5),
    ) {
        let choices = probs.iter().map(|depth| {
            depth.iter().enumerate().map(|(t, &p)| kdtree_engine::spec::Choice { token: t as u32, log_prob: p.ln() }).collect()
        }).collect();
        let draft = kdtree_engine::spec::Draft::from_choices(choices, 8, 8).unwrap();
        let tree = kdtree_engine::spec::DraftTree::build(&draft, budget);
        // Increasing cost points at T = 1, 2, 4, ...
        let mut us = 50.0;
        let pts: Vec<(usize, f64)> = points.iter().enumerate().map(|(i, d)| { us += d; (1 << i, us) }).collect();
        let model = cost(pts);
        let rate = |nodes: &[usize]| (1.0 + nodes.iter().map(|&i| tree.scores[i].exp()).sum::<f64>()) / model.us(nodes.len() + 1);
        let mut best = f64::MIN;
        for mask in 0u32..1 << tree.len() {
            let nodes: Vec<usize> = (0..tree.len()).filter(|&i| mask >> i & 1 == 1).collect();
            let closed = nodes.iter().all(|&i| tree.parents[i].is_none_or(|p| mask >> p & 1 == 1));
            if closed && (nodes.is_empty() || model.measured(nodes.len() + 1)) {
                best = best.max(rate(&nodes));
            }
        }
        let b = model.choose(&tree.scores);
        prop_assert!(b == 0 || model.measured(b + 1), "{b} nodes: an unmeasured size");
        let chosen: Vec<usize> = (0..b).collect();
        prop_assert!((rate(&chosen) - best).abs() <= 1e-12 * best, "choose {b}: {} against the best {best}", rate(&chosen));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The same with a real drafter: prompt lookup, whose drafts are often empty or wrong.
    #[test]
    fn lookup_chains_and_cost_aware_trees_equal_greedy(
        int4 in any::<bool>(),
        prompt in prop::collection::vec(0u32..8, 1..16),
        max_new in 1usize..20,
        len in 0usize..8,
        slope in 0.0f64..200.0,
    ) {
        let model = &MODELS[int4 as usize];
        let greedy = greedy_generate(model, &prompt, max_new, &[]).unwrap();
        let aware = Method::CostAware { limits: TreeLimits { budget: 12, draft_len: len }, cost: cost([1, 2, 3, 5, 9, 17, 25].map(|t| (t, 100.0 + slope * (t - 1) as f64)).to_vec()) };
        for method in [Method::Chain { len }, aware] {
            let mut lookup = kdtree_engine::spec::LookupDrafter::new(3, model.config.vocab_size);
            let (tokens, _) = speculative_generate(model, &mut lookup, &prompt, max_new, &method, &[]).unwrap();
            prop_assert_eq!(&tokens, &greedy, "{:?}", method);
        }
    }
}
