//! MoE routing against a plain scalar re-implementation of DeepSeek-V3's `noaux_tc` router,
//! with values drawn from a small set so that ties are common.

use kdtree_engine::ops::cpu::route;
use kdtree_engine::registry::Routing;
use proptest::prelude::*;

/// Repeated linear scans with a strict `>`: the first (lowest-index) maximum always wins.
fn scalar_route(logits: &[f32], bias: &[f32], r: &Routing) -> Vec<(usize, f32)> {
    let e = r.n_experts;
    let per_group = e / r.n_group;
    let mut s = vec![0f32; e];
    let mut c = vec![0f32; e];
    for i in 0..e {
        s[i] = 1.0 / (1.0 + (-logits[i]).exp());
        c[i] = s[i] + bias[i];
    }
    let best = |vals: &[f32], taken: &[bool], allowed: &dyn Fn(usize) -> bool| {
        let mut b: Option<usize> = None;
        for i in 0..vals.len() {
            if !taken[i] && allowed(i) && b.is_none_or(|b| vals[i] > vals[b]) {
                b = Some(i);
            }
        }
        b.unwrap()
    };
    let mut group_score = vec![0f32; r.n_group];
    for g in 0..r.n_group {
        let members = &c[g * per_group..(g + 1) * per_group];
        let mut taken = vec![false; per_group];
        let first = best(members, &taken, &|_| true);
        taken[first] = true;
        group_score[g] = members[first];
        if per_group > 1 {
            group_score[g] += members[best(members, &taken, &|_| true)];
        }
    }
    let mut group_taken = vec![false; r.n_group];
    for _ in 0..r.topk_group {
        let g = best(&group_score, &group_taken, &|_| true);
        group_taken[g] = true;
    }
    let mut chosen = vec![false; e];
    for _ in 0..r.top_k {
        let i = best(&c, &chosen, &|i| group_taken[i / per_group]);
        chosen[i] = true;
    }
    let picked: Vec<usize> = (0..e).filter(|&i| chosen[i]).collect();
    let mut sum = 0f32;
    for &i in &picked {
        sum += s[i];
    }
    picked
        .iter()
        .map(|&i| {
            let w = if r.norm_topk_prob { s[i] / (sum + 1e-20) } else { s[i] };
            (i, w * r.routed_scaling_factor)
        })
        .collect()
}

fn routing_strategy() -> impl Strategy<Value = (Routing, Vec<f32>, Vec<f32>)> {
    (prop::sample::select(vec![1usize, 2, 4]), 1usize..=3, any::<bool>()).prop_flat_map(
        |(n_group, per_group_pow, norm)| {
            let per_group = 1 << per_group_pow;
            let e = n_group * per_group;
            (1..=n_group).prop_flat_map(move |topk_group| {
                let r = Routing {
                    n_experts: e,
                    top_k: 0,
                    n_group,
                    topk_group,
                    norm_topk_prob: norm,
                    routed_scaling_factor: 2.5,
                };
                let value = prop::sample::select(vec![-1.0f32, 0.0, 0.5, 1.0]);
                let bias = prop::sample::select(vec![0.0f32, 0.125, -0.125]);
                (1..=topk_group * per_group, prop::collection::vec(value, e), prop::collection::vec(bias, e))
                    .prop_map(move |(top_k, l, b)| (Routing { top_k, ..r.clone() }, l, b))
            })
        },
    )
}

proptest! {
    #[test]
    fn route_picks_what_the_scalar_router_picks((r, logits, bias) in routing_strategy()) {
        prop_assert_eq!(route(&logits, &bias, &r), scalar_route(&logits, &bias, &r));
    }
}

#[test]
fn all_ties_go_to_the_lowest_group_and_expert_indices() {
    let r =
        Routing { n_experts: 8, top_k: 2, n_group: 2, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 1.0 };
    let picked: Vec<usize> = route(&[0.0; 8], &[0.0; 8], &r).into_iter().map(|(e, _)| e).collect();
    assert_eq!(picked, [0, 1]);
}

#[test]
fn the_bias_selects_but_the_weights_come_from_the_unbiased_scores() {
    // Expert 3 only wins through its bias; its weight is still sigmoid(0) = 0.5 of the sum.
    let r = Routing {
        n_experts: 4,
        top_k: 2,
        n_group: 1,
        topk_group: 1,
        norm_topk_prob: false,
        routed_scaling_factor: 2.0,
    };
    let picked = route(&[1.0, 0.0, 0.0, 0.0], &[0.0, 0.0, 0.0, 1.0], &r);
    assert_eq!(picked, [(0, 2.0 / (1.0 + (-1f32).exp())), (3, 1.0)]);
}

#[test]
fn a_group_is_scored_by_its_two_best_experts() {
    // Group 0 holds the single best expert, but group 1's top two sum higher: group 1 is chosen.
    let r =
        Routing { n_experts: 6, top_k: 1, n_group: 2, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 1.0 };
    let picked = route(&[3.0, -3.0, -3.0, 1.0, 1.0, -3.0], &[0.0; 6], &r);
    assert_eq!(picked.iter().map(|p| p.0).collect::<Vec<_>>(), [3]);
}
