//! Every valid grouped variant on the GPU against the CPU reference, on random routings (uniform and
//! skewed, a hot expert), expert counts, top-k and shapes (not multiples of the tiles), both forms
//! (rows gathered by token, rows in sorted order), and the gate-up form's SiLU epilogue against the
//! fused reference. Run on a GPU machine:
//! `cargo test --release -p kdtree-fuzz --test gpu_grouped -- --ignored`.

use kdtree_jit::w4a16::accuracy::{RandomGemm, bits_error, tolerance};
use kdtree_jit::w4a16::grouped::{
    Epilogue, GroupedKernel, W4a16Grouped, XRows, align, grouped_host, grouped_reference, grouped_silu_reference,
    interleave_gate_up, sample_routing,
};
use kdtree_jit::{Gpu, Target, Variant, compile_all};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[test]
#[ignore = "needs a GPU"]
fn every_valid_grouped_variant_matches_the_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let variants = W4a16Grouped::valid(&Target { arch: gpu.arch });
    let mut checked = 0;
    for (v, c) in compile_all(&variants, gpu.arch, None, |_| {}) {
        let kernel = GroupedKernel::load(&gpu, v, &c.expect("every valid variant compiles")).expect("loads");
        let g = v.group_size as usize;
        let cases = (1usize..65, prop::sample::select(vec![1usize, 3, 8, 17, 64, 384]), 1usize..9, 0.0f64..2.5);
        let shape = (1usize..300, 1usize..20, any::<bool>(), any::<u64>());
        TestRunner::new(Config { cases: 4, failure_persistence: None, ..Config::default() })
            .run(&(cases, shape), |((tokens, experts, top_k, skew), (n, groups, gather, seed))| {
                let (top_k, k) = (top_k.min(experts), groups * g);
                let ids = sample_routing(tokens, experts, top_k, skew, None, seed);
                let a = align(&ids, experts, v.bm as usize);
                // Experts' weights and X from one random problem per expert (RandomGemm::random's data).
                let x_rows = if gather { tokens } else { ids.len() };
                let px = RandomGemm::random(x_rows, 1, k, g, v.dtype, seed).expect("x");
                let ws: Vec<_> = (0..experts)
                    .map(|e| RandomGemm::random(1, n, k, g, v.dtype, seed ^ (e as u64 + 1)).expect("w").w)
                    .collect();
                let xf: Vec<f32> = px.x.iter().map(|&b| kdtree_quant::Scales { dtype: v.dtype, bits: vec![b] }.get(0)).collect();
                let rows = if gather { XRows::Gather { index: &a.sorted, div: top_k } } else { XRows::Identity };
                let want = grouped_reference(&xf, k, rows, &ws, &a).expect("reference");
                let y = grouped_host(&gpu, &kernel, Epilogue::Store, &px.x, k, rows, &ws, &a).expect("runs");
                // Relative to the largest output, or where larger to the size of a sum of K products that
                // does not cancel (as RandomGemm::scale: few outputs may all have cancelled to near zero).
                let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
                let x_norm = xf.chunks_exact(k).map(norm).fold(0f32, f32::max);
                let w_norm = ws.iter().flat_map(|w| w.dequantize().chunks_exact(k).map(norm).collect::<Vec<_>>()).fold(0f32, f32::max);
                let scale = want.iter().fold(x_norm * w_norm / (k as f32).sqrt(), |s, r| s.max(r.abs()));
                let err = bits_error(v.dtype, &y, &want, scale);
                let tolerance = tolerance(&v.stream());
                prop_assert!(
                    err <= tolerance,
                    "{}: {tokens} tokens, top-{top_k} of {experts}, skew {skew:.1}, {n} x {k}, gather {gather}: error {err:.2e}",
                    v.name()
                );
                Ok(())
            })
            .unwrap();
        checked += 1;
    }
    assert_eq!(checked, variants.len());
}

/// The SiLU epilogue's output of every valid variant against [`grouped_silu_reference`], element by
/// element. The gate and up values the kernel gates are within the GEMM tolerance `tol * S` of the
/// reference's sums (S: the gate-up scale, as above) plus their rounding to the dtype (eps |v|), and
/// silu(g) * u moves by at most 1.1 |u| per unit of g (silu' <= 1.1) and |silu(g)| <= |g| per unit of
/// u; the output's own rounding adds eps / 2 of it. Bound: 1.25 (|g| + |u|) (tol S + eps max(|g|, |u|))
/// + eps |reference|, with g, u the reference's rounded gate and up.
#[test]
#[ignore = "needs a GPU"]
fn every_valid_grouped_variants_silu_epilogue_matches_the_fused_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let variants = W4a16Grouped::valid(&Target { arch: gpu.arch });
    let mut checked = 0;
    for (v, c) in compile_all(&variants, gpu.arch, None, |_| {}) {
        let kernel = GroupedKernel::load(&gpu, v, &c.expect("every valid variant compiles")).expect("loads");
        let (g, dtype) = (v.group_size as usize, v.dtype);
        let cases = (1usize..65, prop::sample::select(vec![1usize, 3, 8, 17, 64, 384]), 1usize..9, 0.0f64..2.5);
        let shape = (1usize..150, 1usize..20, any::<u64>());
        TestRunner::new(Config { cases: 2, failure_persistence: None, ..Config::default() })
            .run(&(cases, shape), |((tokens, experts, top_k, skew), (inter, groups, seed))| {
                let (top_k, k, n) = (top_k.min(experts), groups * g, 2 * inter);
                let ids = sample_routing(tokens, experts, top_k, skew, None, seed);
                let a = align(&ids, experts, v.bm as usize);
                let px = RandomGemm::random(tokens, 1, k, g, dtype, seed).expect("x");
                let ws: Vec<_> = (0..experts)
                    .map(|e| RandomGemm::random(1, n, k, g, dtype, seed ^ (e as u64 + 1)).expect("w").w)
                    .collect();
                let xf: Vec<f32> = px.x.iter().map(|&b| kdtree_quant::Scales { dtype, bits: vec![b] }.get(0)).collect();
                let rows = XRows::Gather { index: &a.sorted, div: top_k };
                let gate_up = grouped_reference(&xf, k, rows, &ws, &a).expect("reference");
                let want = grouped_silu_reference(&xf, k, rows, &ws, &a, dtype).expect("fused reference");
                let interleaved: Vec<_> = ws.iter().map(|w| interleave_gate_up(w).expect("even")).collect();
                let act = grouped_host(&gpu, &kernel, Epilogue::Silu, &px.x, k, rows, &interleaved, &a).expect("runs");
                let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
                let x_norm = xf.chunks_exact(k).map(norm).fold(0f32, f32::max);
                let w_norm = ws.iter().flat_map(|w| w.dequantize().chunks_exact(k).map(norm).collect::<Vec<_>>()).fold(0f32, f32::max);
                let scale = gate_up.iter().fold(x_norm * w_norm / (k as f32).sqrt(), |s, r| s.max(r.abs()));
                let (tol, eps) = (tolerance(&v.stream()) as f32, dtype.epsilon());
                for r in 0..ids.len() {
                    for f in 0..inter {
                        let (gate, up) = (dtype.round(gate_up[r * n + f]), dtype.round(gate_up[r * n + inter + f]));
                        let (got, want) = (kdtree_quant::Scales { dtype, bits: vec![act[r * inter + f]] }.get(0), want[r * inter + f]);
                        let bound = 1.25 * (gate.abs() + up.abs()) * (tol * scale + eps * gate.abs().max(up.abs())) + eps * want.abs();
                        prop_assert!(
                            (got - want).abs() <= bound,
                            "{}: {tokens} tokens, top-{top_k} of {experts}, inter {inter}, K {k}: row {r} feature {f}: {got} against {want} (bound {bound:.2e})",
                            v.name()
                        );
                    }
                }
                Ok(())
            })
            .unwrap();
        checked += 1;
    }
    assert_eq!(checked, variants.len());
}
