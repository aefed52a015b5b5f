//! Every dense variant valid on the GPU (the tiles; on sm_90 also wgmma, compiled for sm_90a)
//! against the CPU reference, on random shapes (not multiples of the tiles) and data. Run on a GPU
//! machine: `cargo test --release -p kdtree-fuzz --test gpu -- --ignored`.

use kdtree_fuzz::{each_variant, shapes};
use kdtree_jit::w4a16::RandomGemm;
use kdtree_jit::w4a16::dense::{DenseFamily, DenseKernel, DenseVariant};
use kdtree_jit::{Gpu, Variant};
use proptest::prelude::*;

#[test]
#[ignore = "needs a GPU"]
fn every_valid_variant_matches_the_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let variants = DenseVariant::valid_on(gpu.arch);
    assert!(!variants.is_empty());
    let load = |v, c: &_| DenseKernel::load(&gpu, v, c).expect("loads");
    let strategy = |v: &DenseVariant| (shapes(v), any::<u64>());
    each_variant(
        &variants,
        |v| v.compile_arch(gpu.arch),
        load,
        6,
        strategy,
        |k: &DenseKernel, ((m, n, k_), seed)| {
            let v = k.variant();
            let p = RandomGemm::random(m, n, k_, v.group_size(), v.dtype(), seed).expect("problem");
            let y = k.gemm_host(&gpu, &p.x, m, &p.w).expect("runs");
            let err = p.error(v.dtype(), &y);
            prop_assert!(err <= v.tolerance(), "{} at {m}x{n}x{k_}: error {err:.2e}", v.name());
            Ok(0.0)
        },
    );
    println!("{} variants, 6 random cases each, within tolerance", variants.len());
}
