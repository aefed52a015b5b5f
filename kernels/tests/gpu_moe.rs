//! The router against the engine's CPU `route`, and the experts' weighted sum against the CPU MoE's
//! loop. Tolerances:
//! - route ids: exact, ties included.
//! - route weights: 1e-6 relative, element by element ([`common::RELATIVE`]). The kernel's exponential (in double, then rounded) and the CPU's
//!   (glibc's expf) both round almost always to the nearest f32, but not always the same way: about one
//!   exponential in 1600 differs by an ulp, which the normalisation spreads to the token's other
//!   weights. Selection never sees that ulp unless two different logits are within it; the ties test's
//!   logits (halves in [-2, 2]) have the same exponential on both.
//! - moe_combine: bit for bit; products and sums are rounded separately, in the CPU's order.

mod common;

use common::{RELATIVE, kernels};
use kdtree_engine::model::{Routing, route};
use proptest::prelude::*;

fn values(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    kdtree_quant::sample::symmetric(len, seed, scale)
}

/// (n_experts, top_k, n_group, topk_group): Kimi K2, DeepSeek-V3, a small grouped router, and one group
/// of one expert each, where a group's score is its only expert's.
const ROUTERS: [(usize, usize, usize, usize); 4] = [(384, 8, 1, 1), (256, 8, 8, 4), (16, 4, 4, 2), (8, 3, 8, 5)];

fn check_route(logits: &[f32], bias: &[f32], r: &Routing) -> Result<(), TestCaseError> {
    let tokens = logits.len() / r.n_experts;
    let k = kernels();
    let (dl, db) = (k.stream().clone_htod(logits).unwrap(), k.stream().clone_htod(bias).unwrap());
    let mut ids = k.stream().alloc_zeros::<u32>(tokens * r.top_k).unwrap();
    let mut weights = k.stream().alloc_zeros::<f32>(tokens * r.top_k).unwrap();
    kdtree_kernels::route_noaux_tc(k, &dl, &db, r, &mut ids, &mut weights).unwrap();
    let (ids, weights) = (k.stream().clone_dtoh(&ids).unwrap(), k.stream().clone_dtoh(&weights).unwrap());
    for t in 0..tokens {
        let want = route(&logits[t * r.n_experts..][..r.n_experts], bias, r);
        let got_ids: Vec<usize> = ids[t * r.top_k..][..r.top_k].iter().map(|&e| e as usize).collect();
        let want_ids: Vec<usize> = want.iter().map(|&(e, _)| e).collect();
        prop_assert_eq!(&got_ids, &want_ids, "token {}", t);
        let want_weights: Vec<f32> = want.iter().map(|&(_, w)| w).collect();
        let got_weights = &weights[t * r.top_k..][..r.top_k];
        let err = RELATIVE.error(got_weights, &want_weights);
        prop_assert!(err <= 1e-6, "token {}: weights {:?} against {:?}", t, got_weights, want_weights);
    }
    Ok(())
}

fn routing(which: usize, norm: bool) -> Routing {
    let (n_experts, top_k, n_group, topk_group) = ROUTERS[which];
    Routing { n_experts, top_k, n_group, topk_group, norm_topk_prob: norm, routed_scaling_factor: 2.5 }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs a GPU"]
    fn route_matches_the_cpu(tokens in 1usize..64, which in 0usize..4, norm: bool, seed: u64) {
        let r = routing(which, norm);
        check_route(&values(tokens * r.n_experts, 6.0, seed), &values(r.n_experts, 0.5, !seed), &r)?;
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn route_breaks_ties_as_the_cpu(tokens in 1usize..64, which in 0usize..4, norm: bool, seed: u64) {
        // Logits and biases from a few values: equal choices, equal group scores, equal weights.
        let few = |x: Vec<f32>| x.iter().map(|v| (v * 2.0).round() / 2.0).collect::<Vec<f32>>();
        let r = routing(which, norm);
        check_route(&few(values(tokens * r.n_experts, 2.0, seed)), &few(values(r.n_experts, 0.5, !seed)), &r)?;
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn moe_combine_matches_the_cpu_bit_for_bit(tokens in 1usize..20, k in 1usize..9, h in 1usize..3000, seed: u64) {
        let (slots, weights) = (values(tokens * k * h, 3.0, seed), values(tokens * k, 1.0, !seed));
        // engine/src/model/moe.rs: `*a += o * w` from 0, slot by slot.
        let mut want = vec![0f32; tokens * h];
        for t in 0..tokens {
            for s in 0..k {
                for (a, &o) in want[t * h..][..h].iter_mut().zip(&slots[(t * k + s) * h..][..h]) {
                    *a += o * weights[t * k + s];
                }
            }
        }
        let kn = kernels();
        let (ds, dw) = (kn.stream().clone_htod(&slots).unwrap(), kn.stream().clone_htod(&weights).unwrap());
        let mut out = kn.stream().alloc_zeros::<f32>(tokens * h).unwrap();
        kdtree_kernels::moe_combine(kn, &ds, &dw, k, &mut out).unwrap();
        let got: Vec<u32> = kn.stream().clone_dtoh(&out).unwrap().iter().map(|v| v.to_bits()).collect();
        prop_assert_eq!(got, want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}
