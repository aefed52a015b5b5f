//! Every valid streamed 16-bit variant on the GPU against the CPU reference, on random products:
//! 1..=70 rows (blocks of the variant's rows and a short last one), N off the 64-row tiles, K any
//! multiple of 32 from one chunk to more than the warps' shares, both dtypes, inputs of random
//! ranges; each output within the f32 summation bound of its exact value; and one random row
//! computed alone, bit for bit. Run on a GPU machine:
//! `cargo test --release -p kdtree-fuzz --test gpu_dense16 -- --ignored`.

use kdtree_fuzz::each_variant;
use kdtree_jit::dense16::reference::product;
use kdtree_jit::dense16::{Dense16, Dense16Kernel, dense16_host};
use kdtree_jit::tune::problem::{from_bits, to_bits};
use kdtree_jit::{Arch, Gpu, Target, Variant};
use kdtree_quant::Dtype;
use kdtree_quant::sample::symmetric;
use proptest::prelude::*;
use proptest::sample::Index;

/// One product's inputs, drawn at random.
#[derive(Clone, Debug)]
struct Launch {
    m: usize,
    n: usize,
    k: usize,
    amp: f32,
    seed: u64,
}

fn launch() -> impl Strategy<Value = Launch> {
    let m = prop_oneof![1usize..=8, 9usize..=70];
    let n = prop_oneof![1usize..=64, 65usize..=300];
    (m, n, 1usize..=64, 0.01f32..100.0, any::<u64>()).prop_map(|(m, n, chunks, amp, seed)| Launch {
        m,
        n,
        k: 32 * chunks,
        amp,
        seed,
    })
}

/// Runs `l` on `kernel` against the reference and row `alone` by itself. Each output is a sum of K
/// exact products (16-bit times 16-bit is exact in f32) added in f32 in the kernel's order, so it is
/// within (K - 1) u of the sum of their magnitudes from the exact sum (u = EPSILON / 2; the tensor
/// cores' f32 adds may truncate: EPSILON); (K + 16) EPSILON of it is the bound. Returns the worst
/// error over its bound.
fn check(gpu: &Gpu, kernel: &Dense16Kernel, l: &Launch, alone: Index) -> Result<f32, TestCaseError> {
    let (v, name) = (kernel.variant(), kernel.variant().name());
    let bits = |values: Vec<f32>| -> Vec<u16> { values.into_iter().map(|f| to_bits(v.dtype, f)).collect() };
    let x = bits(symmetric(l.m * l.k, l.seed, l.amp));
    let w = bits(symmetric(l.n * l.k, l.seed ^ 1, 1.0));
    let dims = (l.m, l.n, l.k);
    let want = product(&x, &w, dims, v.dtype);
    let abs = |b: &[u16]| -> Vec<u16> { b.iter().map(|&h| to_bits(v.dtype, from_bits(v.dtype, h).abs())).collect() };
    let magnitude = product(&abs(&x), &abs(&w), dims, v.dtype);
    let got = dense16_host(gpu, kernel, &x, &w, dims).expect("runs");
    let mut worst = 0f32;
    for (at, ((g, r), mag)) in got.iter().zip(&want).zip(&magnitude).enumerate() {
        let bound = (l.k + 16) as f32 * f32::EPSILON * mag;
        let e = (g - r).abs();
        prop_assert!(e <= bound, "{}: {:?} output {}: {} against {} (bound {:.2e})", name, dims, at, g, r, bound);
        if bound > 0.0 {
            worst = worst.max(e / bound);
        }
    }
    let i = alone.index(l.m);
    let one = dense16_host(gpu, kernel, &x[i * l.k..(i + 1) * l.k], &w, (1, l.n, l.k)).expect("runs alone");
    let same = one.iter().zip(&got[i * l.n..(i + 1) * l.n]).all(|(a, b)| a.to_bits() == b.to_bits());
    prop_assert!(same, "{}: row {} of {:?} differs from the same row alone", name, i, dims);
    Ok(worst)
}

#[test]
#[ignore = "needs a GPU"]
fn every_valid_streamed_variant_matches_the_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let variants = Dense16::valid(&Target { arch: gpu.arch });
    assert!(!variants.is_empty());
    let load = |v, c: &_| Dense16Kernel::load(&gpu, v, c).expect("loads");
    let strategy = |_: &_| (launch(), any::<Index>());
    let (e, name) = each_variant(&variants, |_| gpu.arch, load, 3, strategy, |k, (l, row)| check(&gpu, k, &l, row));
    println!("{} variants, 3 random products each, within the bound; worst {e:.3} of it ({name})", variants.len());
}

/// Runs without a GPU: the variants this suite draws from exist on the arch it runs on.
#[test]
fn the_space_has_variants_of_both_dtypes_on_sm_90() {
    let valid = Dense16::valid(&Target { arch: Arch(90) });
    assert!(valid.iter().any(|v| v.dtype == Dtype::Bf16) && valid.iter().any(|v| v.dtype == Dtype::F16));
}
