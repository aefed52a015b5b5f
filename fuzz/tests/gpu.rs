//! Every valid variant of the default space on the GPU against the CPU reference, on random
//! shapes (not multiples of the tiles) and data. Run on a GPU machine:
//! `cargo test --release -p kdtree-fuzz --test gpu -- --ignored`.

use kdtree_fuzz::shapes;
use kdtree_jit::w4a16::{self, RandomGemm, W4a16, W4a16Kernel};
use kdtree_jit::{Gpu, Target, Variant, compile_all};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[test]
#[ignore = "needs a GPU"]
fn every_valid_variant_matches_the_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let variants = W4a16::valid(&Target { arch: gpu.arch });
    let compiled = compile_all(&variants, gpu.arch, None, |_| {});
    let mut checked = 0;
    for (v, c) in compiled {
        let kernel = W4a16Kernel::load(&gpu, v, &c.expect("every valid variant compiles")).expect("loads");
        let g = v.group_size as usize;
        // One runner per variant: a runner counts its cases across runs.
        TestRunner::new(Config { cases: 6, failure_persistence: None, ..Config::default() })
            .run(&(shapes(&v), any::<u64>()), |((m, n, k), seed)| {
                let p = RandomGemm::random(m, n, k, g, v.dtype, seed).expect("problem");
                let y = kernel.gemm_host(&gpu, &p.x, m, &p.w).expect("runs");
                let err = p.error(v.dtype, &y);
                prop_assert!(err <= w4a16::tolerance(&v), "{} at {m}x{n}x{k}: error {err:.2e}", v.name());
                Ok(())
            })
            .unwrap();
        checked += 1;
    }
    assert_eq!(checked, variants.len());
}
