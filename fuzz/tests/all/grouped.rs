//! The CPU side of the grouped W4A16 kernels, fuzzed: the assignments' alignment against a plain sort
//! (random routings, skewed, with a hot expert, and arbitrary ids including ones past the experts),
//! the grouped reference against the per-expert reference row by row, the stacked layout of every
//! grouped variant round-tripping expert by expert, gate-up weights interleaved for the SiLU epilogue
//! (each tile's gate and up rows the same features', through every variant's layout), and the fused
//! reference as SwiGLU of the rounded grouped reference.

use kdtree_jit::w4a16::grouped::{
    W4a16Grouped, XRows, align, grouped_reference, grouped_silu_reference, interleave_gate_up, repack_experts,
    sample_routing, tile_bound,
};
use kdtree_jit::w4a16::layout::{DeviceWeights, lengths};
use kdtree_jit::w4a16::unpack;
use kdtree_jit::{Arch, Target, Variant};
use kdtree_quant::{Dtype, QuantizedWeight, Scales, reference};
use proptest::prelude::*;

/// ids: router-like (distinct, ascending per token) or arbitrary (repeats, ids past the experts).
fn routing() -> impl Strategy<Value = (Vec<u32>, usize, usize)> {
    let router = (1usize..300, 1usize..400, 1usize..9, 0.0f64..3.0, any::<bool>(), any::<u64>()).prop_map(
        |(tokens, experts, top_k, skew, hot, seed)| {
            let top_k = top_k.min(experts);
            let hot = hot.then_some(seed as usize % experts);
            (sample_routing(tokens, experts, top_k, skew, hot, seed), experts, top_k)
        },
    );
    let arbitrary = (1usize..400)
        .prop_flat_map(|experts| (proptest::collection::vec(0u32..(experts as u32 + 3), 0..700), Just(experts)))
        .prop_map(|(ids, experts)| (ids, experts, 1));
    prop_oneof![3 => router, 1 => arbitrary]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_alignment_is_a_stable_sort_cut_into_bounded_tiles(
        (ids, experts, _) in routing(),
        bm in prop::sample::select(vec![1usize, 4, 8, 16]),
    ) {
        let a = align(&ids, experts, bm);
        let bucket = |i: usize| (ids[i] as usize).min(experts);
        let mut want: Vec<u32> = (0..ids.len() as u32).collect();
        want.sort_by_key(|&i| (bucket(i as usize), i));
        prop_assert_eq!(&a.sorted, &want);
        for e in 0..=experts {
            let before = ids.iter().filter(|&&id| (id as usize).min(experts) < e).count();
            prop_assert_eq!(a.offsets[e] as usize, before);
        }
        prop_assert!(a.tiles.len() <= tile_bound(experts, ids.len(), bm));
        let mut covered = 0;
        for &[e, start, rows] in &a.tiles {
            prop_assert!((1..=bm as u32).contains(&rows));
            prop_assert_eq!(start as usize, covered, "tiles in order, without gaps");
            prop_assert!((start..start + rows).all(|r| ids[a.sorted[r as usize] as usize] == e));
            covered += rows as usize;
        }
        prop_assert_eq!(covered + a.invalid, ids.len());
        let touched = (0..experts).filter(|&e| a.offsets[e] < a.offsets[e + 1]).count();
        prop_assert_eq!(a.experts_touched, touched);
    }
}

fn weight(n: usize, k: usize, g: usize, dtype: Dtype, seed: u64) -> QuantizedWeight {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let q: Vec<i8> = (0..n * k).map(|_| (next() % 16) as i8 - 8).collect();
    let bits: Vec<u16> = (0..n * k / g).map(|_| (next() % 0x3c00) as u16 + 0x1000).collect();
    QuantizedWeight::from_q(&q, n, k, g, Scales { dtype, bits }).expect("weight")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn grouped_rows_are_the_per_expert_reference_of_their_token(
        tokens in 1usize..20,
        experts in 1usize..10,
        top_k in 1usize..4,
        n in 1usize..80,
        groups in 1usize..4,
        gather in any::<bool>(),
        seed: u64,
    ) {
        let (top_k, k) = (top_k.min(experts), 32 * groups);
        let ids = sample_routing(tokens, experts, top_k, 1.0, None, seed);
        let a = align(&ids, experts, 4);
        let ws: Vec<QuantizedWeight> = (0..experts).map(|e| weight(n, k, 32, Dtype::Bf16, seed ^ e as u64)).collect();
        let x_rows = if gather { tokens } else { ids.len() };
        let x: Vec<f32> = (0..x_rows * k).map(|i| ((i * 37 + seed as usize) % 17) as f32 / 8.0 - 1.0).collect();
        let rows = if gather { XRows::Gather { index: &a.sorted, div: top_k } } else { XRows::Identity };
        let y = grouped_reference(&x, k, rows, &ws, &a).unwrap();
        for r in 0..ids.len() {
            let (e, xr) = (a.expert_of(r).unwrap(), rows.of(r));
            let want = reference::w4a16_gemm_f32(&x[xr * k..(xr + 1) * k], 1, &ws[e]).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&y[r * n..(r + 1) * n]), bits(&want), "row {}", r);
        }
    }

    #[test]
    fn every_grouped_variants_stacked_layout_round_trips(
        which in any::<prop::sample::Index>(),
        experts in 1usize..5,
        n in 1usize..150,
        groups in 1usize..4,
        seed: u64,
    ) {
        let valid = W4a16Grouped::valid(&Target { arch: Arch(90) });
        let v = valid[which.index(valid.len())];
        let (g, k) = (v.group_size as usize, v.group_size as usize * groups);
        let ws: Vec<QuantizedWeight> = (0..experts).map(|e| weight(n, k, g, v.dtype, seed ^ e as u64)).collect();
        let d = repack_experts(&v, &ws).unwrap();
        let (pl, sl) = lengths(n, k, g);
        prop_assert_eq!((d.packed.len(), d.scales.len()), (experts * pl, experts * sl));
        for (e, w) in ws.iter().enumerate() {
            let one = DeviceWeights { packed: d.packed[e * pl..(e + 1) * pl].to_vec(), scales: d.scales[e * sl..(e + 1) * sl].to_vec() };
            prop_assert_eq!(&unpack(&v.stream(), &one, n, k).unwrap(), w, "{} expert {}", v.name(), e);
        }
    }

    #[test]
    fn interleaved_gate_up_weights_pair_each_feature_in_its_tile_through_every_layout(
        which in any::<prop::sample::Index>(),
        inter in 1usize..150,
        groups in 1usize..4,
        seed: u64,
    ) {
        let valid = W4a16Grouped::valid(&Target { arch: Arch(90) });
        let v = valid[which.index(valid.len())];
        let (g, k, n) = (v.group_size as usize, v.group_size as usize * groups, 2 * inter);
        let w = weight(n, k, g, v.dtype, seed);
        let p = interleave_gate_up(&w).unwrap();
        let (dw, dp) = (w.dequantize(), p.dequantize());
        let row = |d: &[f32], r: usize| d[r * k..(r + 1) * k].to_vec();
        for f in 0..inter {
            // Tile f / 32 holds `half` features: gate rows first, then up rows.
            let (tile, c) = (f / 32, f % 32);
            let half = (inter - 32 * tile).min(32);
            prop_assert_eq!(row(&dp, 64 * tile + c), row(&dw, f), "gate of feature {}", f);
            prop_assert_eq!(row(&dp, 64 * tile + half + c), row(&dw, inter + f), "up of feature {}", f);
        }
        let d = repack_experts(&v, std::slice::from_ref(&p)).unwrap();
        prop_assert_eq!(&unpack(&v.stream(), &d, n, k).unwrap(), &p, "{}", v.name());
    }

    #[test]
    fn the_fused_reference_is_swiglu_of_the_rounded_grouped_reference(
        tokens in 1usize..12,
        experts in 1usize..6,
        inter in 1usize..70,
        f16 in any::<bool>(),
        seed: u64,
    ) {
        let (dtype, k, n) = (if f16 { Dtype::F16 } else { Dtype::Bf16 }, 64, 2 * inter);
        let ids = sample_routing(tokens, experts, 1, 0.5, None, seed);
        let a = align(&ids, experts, 8);
        let ws: Vec<QuantizedWeight> = (0..experts).map(|e| weight(n, k, 32, dtype, seed ^ e as u64)).collect();
        let x: Vec<f32> = (0..tokens * k).map(|i| ((i * 29 + seed as usize) % 13) as f32 / 8.0 - 0.75).collect();
        let rows = XRows::Gather { index: &a.sorted, div: 1 };
        let y = grouped_reference(&x, k, rows, &ws, &a).unwrap();
        let act = grouped_silu_reference(&x, k, rows, &ws, &a, dtype).unwrap();
        prop_assert_eq!(act.len(), ids.len() * inter);
        // The engine's CPU SiLU (its expression and order) on the gate-up rows rounded to the dtype.
        let round = |v: &[f32]| v.iter().map(|&x| dtype.round(x)).collect::<Vec<f32>>();
        for r in 0..ids.len() {
            let (gate, up) = (round(&y[r * n..r * n + inter]), round(&y[r * n + inter..(r + 1) * n]));
            let mut want = vec![0f32; inter];
            kdtree_engine::ops::cpu::silu_mul(&gate, &up, &mut want);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&act[r * inter..(r + 1) * inter]), bits(&want), "row {}", r);
        }
    }
}
