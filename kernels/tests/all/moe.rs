//! The router against the engine's CPU `route`, and the experts' weighted sum against the CPU MoE's
//! loop. Tolerances:
//! - route ids: exact, ties included.
//! - route weights: 1e-6 relative, element by element ([`crate::common::RELATIVE`]). The kernel's exponential (in double, then rounded) and the CPU's
//!   (glibc's expf) both round almost always to the nearest f32, but not always the same way: about one
//!   exponential in 1600 differs by an ulp, which the normalisation spreads to the token's other
//!   weights. Selection never sees that ulp unless two different logits are within it; the ties test's
//!   logits (halves in [-2, 2]) have the same exponential on both.
//! - moe_combine: bit for bit; products and sums are rounded separately, in the CPU's order.
//! - moe_combine_sorted_bf16: bit for bit against the same loop over the bf16 rows widened, and against
//!   the chain it replaces (scatter_rows_bf16_to_f32, then moe_combine).
//! - the grouped kernel's SiLU epilogue: bit for bit against the chain it replaces (the plain grouped
//!   gate-up, then silu_mul_halves_bf16).
//!
//! Run on a GPU machine: `cargo test --release -p kdtree-kernels --test all -- --ignored moe::`.

use crate::common::{RELATIVE, gpu, kernels};
use kdtree_engine::ops::cpu::route;
use kdtree_engine::registry::Routing;
use kdtree_jit::w4a16::grouped::{
    Epilogue, GroupedKernel, W4a16Grouped, XRows, align, grouped_host, interleave_gate_up, sample_routing,
};
use kdtree_jit::{Target, Variant};
use kdtree_quant::{Dtype, QuantizedWeight, Scales};
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

/// bf16 values of about `scale`, as bits.
fn bf16_bits(len: usize, scale: f32, seed: u64) -> Vec<u16> {
    values(len, scale, seed).iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs a GPU"]
    fn moe_combine_sorted_is_scatter_then_combine_bit_for_bit(
        tokens in 1usize..40,
        experts in prop::sample::select(vec![1usize, 4, 64, 384]),
        top_k in 1usize..9,
        h in prop::sample::select(vec![1usize, 3, 64, 130, 7168]),
        seed: u64,
    ) {
        let top_k = top_k.min(experts);
        let ids = sample_routing(tokens, experts, top_k, 1.0, None, seed);
        let n = ids.len();
        let (rows, weights) = (bf16_bits(n * h, 3.0, seed), values(n, 1.0, !seed));
        let kn = kernels();
        let s = kn.stream();
        let mut a = kdtree_kernels::Alignment::new(kn, n, experts, 8).unwrap();
        kdtree_kernels::moe_align(kn, &s.clone_htod(&ids).unwrap().slice(..), &mut a).unwrap();
        let (dr, dw) = (s.clone_htod(&rows).unwrap(), s.clone_htod(&weights).unwrap());
        let mut fused = s.alloc_zeros::<f32>(tokens * h).unwrap();
        kdtree_kernels::moe_combine_sorted_bf16(kn, &dr, &a.positions.slice(0..n), &dw, top_k, &mut fused).unwrap();
        let fused: Vec<u32> = s.clone_dtoh(&fused).unwrap().iter().map(|v| v.to_bits()).collect();
        // The chain it replaces: sorted row i to slot row sorted[i], then the combine.
        let mut slots = s.alloc_zeros::<f32>(n * h).unwrap();
        kdtree_kernels::scatter_rows_bf16_to_f32(kn, &dr, h, &a.sorted, 0, n, &mut slots).unwrap();
        let mut chain = s.alloc_zeros::<f32>(tokens * h).unwrap();
        kdtree_kernels::moe_combine(kn, &slots, &dw, top_k, &mut chain).unwrap();
        let chain: Vec<u32> = s.clone_dtoh(&chain).unwrap().iter().map(|v| v.to_bits()).collect();
        prop_assert!(fused == chain, "the fused combine differs from scatter + combine");
        // The CPU MoE's loop (engine/src/model/moe.rs) over the rows where the CPU alignment puts them.
        let sorted = align(&ids, experts, 8).sorted;
        let mut position = vec![0usize; n];
        for (i, &slot) in sorted.iter().enumerate() {
            position[slot as usize] = i;
        }
        let mut want = vec![0f32; tokens * h];
        for t in 0..tokens {
            for s in 0..top_k {
                let row = &rows[position[t * top_k + s] * h..][..h];
                for (a, &o) in want[t * h..][..h].iter_mut().zip(row) {
                    *a += half::bf16::from_bits(o).to_f32() * weights[t * top_k + s];
                }
            }
        }
        prop_assert_eq!(fused, want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}

/// A gate-up weight per expert, q uniform in [-8, 7] and scales in [0.005, 0.025].
fn gate_up_experts(count: usize, n: usize, k: usize, seed: u64) -> Vec<QuantizedWeight> {
    (0..count)
        .map(|e| {
            let u = values(n * k + n * k / 32, 1.0, seed ^ (e as u64 + 1));
            let q: Vec<i8> = u[..n * k].iter().map(|v| ((v + 1.0) * 8.0).clamp(0.0, 15.0) as i8 - 8).collect();
            let bits = u[n * k..].iter().map(|v| half::bf16::from_f32(0.015 + 0.01 * v).to_bits()).collect();
            QuantizedWeight::from_q(&q, n, k, 32, Scales { dtype: Dtype::Bf16, bits }).unwrap()
        })
        .collect()
}

#[test]
#[ignore = "needs a GPU"]
fn the_grouped_silu_epilogue_is_gate_up_then_silu_mul_halves_bf16_bit_for_bit() {
    let (g, kn) = (gpu(), kernels());
    let target = Target { arch: g.arch };
    // The engine's default, and a 1-row and a 16-row variant.
    let default = W4a16Grouped::default_for(Dtype::Bf16, 32, &target);
    let mut variants = vec![default];
    for bm in [1, 16] {
        let v = W4a16Grouped { bm, ..default };
        if v.check(&target).is_ok() {
            variants.push(v);
        }
    }
    // (tokens, experts, top_k, inter, K): K2-like, a partial last column tile (inter 72), many tokens.
    let cases = [(1, 384, 8, 256, 256), (5, 7, 3, 72, 96), (64, 16, 4, 136, 64), (3, 1, 1, 32, 32)];
    for v in variants {
        let kernel = GroupedKernel::compile(g, v, None).unwrap();
        for (i, &(tokens, experts, top_k, inter, k)) in cases.iter().enumerate() {
            let seed = 50 + i as u64;
            let ids = sample_routing(tokens, experts, top_k, 1.0, None, seed);
            let a = align(&ids, experts, v.bm as usize);
            let ws = gate_up_experts(experts, 2 * inter, k, seed);
            let x = bf16_bits(tokens * k, 1.0, !seed);
            let rows = XRows::Gather { index: &a.sorted, div: top_k };
            let gu = grouped_host(g, &kernel, Epilogue::Store, &x, k, rows, &ws, &a).unwrap();
            let mut chain = kn.stream().alloc_zeros::<u16>(ids.len() * inter).unwrap();
            let dgu = kn.stream().clone_htod(&gu).unwrap();
            kdtree_kernels::silu_mul_halves_bf16(kn, &dgu, ids.len(), inter, &mut chain).unwrap();
            let chain = kn.stream().clone_dtoh(&chain).unwrap();
            let interleaved: Vec<QuantizedWeight> = ws.iter().map(|w| interleave_gate_up(w).unwrap()).collect();
            let fused = grouped_host(g, &kernel, Epilogue::Silu, &x, k, rows, &interleaved, &a).unwrap();
            let differ = fused.iter().zip(&chain).filter(|(a, b)| a != b).count();
            assert_eq!(differ, 0, "{} case {i}: {differ} of {} values differ from the chain", v.name(), chain.len());
        }
    }
}
