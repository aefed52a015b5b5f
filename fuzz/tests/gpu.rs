//! Every dense variant valid on the GPU (the tiles; on sm_90 also wgmma, compiled for sm_90a)
//! against the CPU reference, on random shapes (not multiples of the tiles) and data. Run on a GPU
//! machine: `cargo test --release -p kdtree-fuzz --test gpu -- --ignored`.

use kdtree_fuzz::shapes;
use kdtree_jit::w4a16::RandomGemm;
use kdtree_jit::w4a16::dense::{DenseKernel, DenseVariant};
use kdtree_jit::{Gpu, Variant, compile_all_for};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[test]
#[ignore = "needs a GPU"]
fn every_valid_variant_matches_the_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let variants = DenseVariant::valid_on(gpu.arch);
    let compiled = compile_all_for(&variants, |v| v.compile_arch(gpu.arch), None, |_| {});
    let mut checked = 0;
    for (v, c) in compiled {
        let kernel = DenseKernel::load(&gpu, v, &c.expect("every valid variant compiles")).expect("loads");
        // One runner per variant: a runner counts its cases across runs.
        TestRunner::new(Config { cases: 6, failure_persistence: None, ..Config::default() })
            .run(&(shapes(&v), any::<u64>()), |((m, n, k), seed)| {
                let p = RandomGemm::random(m, n, k, v.group_size(), v.dtype(), seed).expect("problem");
                let y = kernel.gemm_host(&gpu, &p.x, m, &p.w).expect("runs");
                let err = p.error(v.dtype(), &y);
                prop_assert!(err <= v.tolerance(), "{} at {m}x{n}x{k}: error {err:.2e}", v.name());
                Ok(())
            })
            .unwrap();
        checked += 1;
    }
    assert_eq!(checked, variants.len());
    println!("{checked} variants, 6 random cases each, within tolerance");
}
