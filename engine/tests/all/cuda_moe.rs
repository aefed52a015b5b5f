//! On a GPU: the grouped MoE layer (route, align, grouped W4A16 gate-up, SiLU, grouped down, scatter,
//! combine; no host sync) against the CPU backend's MoE, batch invariance bit for bit, the
//! experts-touched count while profiling, and the per-expert fallback for dense experts. Run on a GPU
//! machine: `cargo test --release -p kdtree-engine --test cuda_moe -- --ignored --nocapture`.

use crate::gpu_common::cuda;

use kdtree_engine::TreeMask;
use kdtree_engine::cpu::CpuBackend;
use kdtree_engine::ops::cpu::route;
use kdtree_engine::registry::Routing;
use kdtree_engine::registry::{Backend, DenseValues, DenseWeight, HostExperts, HostLinear};
use kdtree_quant::sample::symmetric;
use kdtree_quant::{Dtype, QuantizedWeight};

/// As `cuda_ops.rs`'s MoE bound: the GPU rounds X, the gate-up output and the SiLU product to bf16
/// (eps 2^-8, half of it each) where the CPU keeps f32, plus the kernels' own f32 sums.
const MOE_BOUND: f32 = 8.0 * 0.0039;

fn int4(n: usize, k: usize, seed: u64) -> HostLinear {
    HostLinear::Int4(QuantizedWeight::quantize(&symmetric(n * k, seed, 0.5), n, k, 32, Dtype::Bf16).unwrap())
}

fn dense(n: usize, k: usize, seed: u64) -> HostLinear {
    let v = symmetric(n * k, seed, 0.5).into_iter().map(half::bf16::from_f32).collect();
    HostLinear::Dense(DenseWeight::new(n, k, DenseValues::Bf16(v)).unwrap())
}

/// A layer of `experts` experts of `inter` over `h`, top-k of `n_group` groups; INT4 or dense.
#[derive(Clone, Copy, Debug)]
struct Layer {
    h: usize,
    inter: usize,
    experts: usize,
    top_k: usize,
    n_group: usize,
    topk_group: usize,
    quantized: bool,
}

impl Layer {
    fn routing(&self) -> Routing {
        Routing {
            n_experts: self.experts,
            top_k: self.top_k,
            n_group: self.n_group,
            topk_group: self.topk_group,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
        }
    }

    fn host(&self, seed: u64) -> HostExperts {
        let (h, inter) = (self.h, self.inter);
        let w = |n, k, s| if self.quantized { int4(n, k, s) } else { dense(n, k, s) };
        let experts = (0..self.experts as u64)
            .map(|e| {
                (
                    HostLinear::stack(w(inter, h, seed + e), w(inter, h, seed + 1000 + e)).unwrap(),
                    w(h, inter, seed + 2000 + e),
                )
            })
            .collect();
        HostExperts {
            routing: self.routing(),
            router: symmetric(self.experts * h, seed + 7, 0.3),
            bias: symmetric(self.experts, seed + 8, 0.1),
            experts,
        }
    }
}

/// Rows of a random table: the MoE input of `tokens` tokens.
fn input<B: Backend>(b: &B, tokens: usize, h: usize, seed: u64) -> B::Tensor {
    let table = b.linear_weight("embed", dense(tokens, h, seed)).unwrap();
    let ids: Vec<u32> = (0..tokens as u32).collect();
    let positions: Vec<usize> = (0..tokens).collect();
    let batch = b.batch(&ids, &positions, &TreeMask::causal(tokens), 0).unwrap();
    b.embedding(&table, &batch).unwrap()
}

fn moe<B: Backend>(b: &B, layer: &Layer, tokens: usize, seed: u64) -> Vec<f32> {
    let experts = b.experts("moe", layer.host(seed)).unwrap();
    let x = input(b, tokens, layer.h, seed + 99);
    b.to_host(&b.moe(&x, &experts).unwrap()).unwrap()
}

fn relative_error(a: &[f32], reference: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), reference.len(), "lengths");
    let scale = reference.iter().fold(0f32, |m, r| m.max(r.abs())).max(f32::MIN_POSITIVE);
    let (mut worst, mut at) = (0f32, 0);
    for (i, (x, r)) in a.iter().zip(reference).enumerate() {
        let d = (x - r).abs();
        let d = if d.is_nan() { f32::INFINITY } else { d };
        if d > worst {
            (worst, at) = (d, i);
        }
    }
    (worst / scale, at)
}

const LAYERS: [Layer; 3] = [
    // K2-like routing (top-8 of 64, one group), h and inter at and off tile edges.
    Layer { h: 128, inter: 96, experts: 64, top_k: 8, n_group: 1, topk_group: 1, quantized: true },
    // DeepSeek-like groups, small.
    Layer { h: 96, inter: 32, experts: 16, top_k: 4, n_group: 4, topk_group: 2, quantized: true },
    // One expert: every token's only expert.
    Layer { h: 64, inter: 64, experts: 1, top_k: 1, n_group: 1, topk_group: 1, quantized: true },
];

#[test]
#[ignore = "needs a GPU"]
fn grouped_moe_matches_the_cpu_backend() {
    let gpu = cuda();
    let mut failures = Vec::new();
    for (i, layer) in LAYERS.iter().enumerate() {
        let described = gpu.experts("probe", layer.host(1)).unwrap().describe();
        assert!(described.starts_with("grouped"), "{layer:?}: {described}");
        // 1100 tokens at top-8 is past one alignment's 8192 assignments: two chunks.
        for tokens in [1, 2, 7, 64, 129, 1100] {
            let seed = 10 * i as u64 + tokens as u64;
            let (want, got) = (moe(&CpuBackend, layer, tokens, seed), moe(&gpu, layer, tokens, seed));
            let (err, at) = relative_error(&got, &want);
            println!("{described:60} {layer:?} T = {tokens:5}: error {err:.2e}");
            if err.is_nan() || err > MOE_BOUND {
                failures.push(format!(
                    "{layer:?}, T = {tokens}: {err:.2e} > {MOE_BOUND:.1e}; worst at token {} column {}: {} vs {}",
                    at / layer.h,
                    at % layer.h,
                    got[at],
                    want[at]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A token's output never depends on the other tokens of the forward: each token alone gives the
/// same bits as in a forward of 64 (exact mode's requirement for DDTree).
#[test]
#[ignore = "needs a GPU"]
fn a_tokens_output_does_not_depend_on_the_others() {
    let gpu = cuda();
    let layer = LAYERS[0];
    let experts = gpu.experts("moe", layer.host(5)).unwrap();
    let (tokens, h) = (64, layer.h);
    let all = gpu.to_host(&gpu.moe(&input(&gpu, tokens, h, 6), &experts).unwrap()).unwrap();
    let table = gpu.linear_weight("embed", dense(tokens, h, 6)).unwrap();
    for t in [0usize, 1, 17, 63] {
        let batch = gpu.batch(&[t as u32], &[0], &TreeMask::causal(1), 0).unwrap();
        let x = gpu.embedding(&table, &batch).unwrap();
        let one = gpu.to_host(&gpu.moe(&x, &experts).unwrap()).unwrap();
        let (a, b) = (&all[t * h..(t + 1) * h], &one[..]);
        let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(differ, 0, "token {t}: {differ} of {h} values differ alone vs in a forward of {tokens}");
    }
}

/// While profiling, the layer reads back its distinct experts, which must be the router's.
#[test]
#[ignore = "needs a GPU"]
fn profiling_counts_the_experts_the_tokens_touch() {
    let gpu = cuda();
    let layer = LAYERS[0];
    let host = layer.host(3);
    let (router, bias) = (host.router.clone(), host.bias.clone());
    let experts = gpu.experts("moe", host).unwrap();
    let tokens = 9;
    let x = input(&gpu, tokens, layer.h, 4);
    // The CPU's routing of the same rows: logits = x · routerᵀ in f32.
    let xs = gpu.to_host(&x).unwrap();
    let mut touched = std::collections::BTreeSet::new();
    for row in xs.chunks_exact(layer.h) {
        let logits: Vec<f32> = router.chunks_exact(layer.h).map(|w| kdtree_quant::reference::dot(row, w)).collect();
        touched.extend(route(&logits, &bias, &layer.routing()).into_iter().map(|(e, _)| e));
    }
    gpu.take_experts_launched();
    gpu.start_profile();
    gpu.moe(&x, &experts).unwrap();
    gpu.take_profile().unwrap();
    assert_eq!(gpu.take_experts_launched(), touched.len());
    // Not profiling: nothing is read back, nothing counted.
    gpu.moe(&x, &experts).unwrap();
    assert_eq!(gpu.take_experts_launched(), 0);
}

#[test]
#[ignore = "needs a GPU"]
fn dense_experts_run_per_expert_and_say_so() {
    let gpu = cuda();
    let layer = Layer { quantized: false, ..LAYERS[1] };
    let described = gpu.experts("dense", layer.host(2)).unwrap().describe();
    assert!(described.contains("per expert") && described.contains("dense"), "{described}");
    let (want, got) = (moe(&CpuBackend, &layer, 7, 2), moe(&gpu, &layer, 7, 2));
    let (err, _) = relative_error(&got, &want);
    assert!(err <= MOE_BOUND, "{err:.2e}");
}
