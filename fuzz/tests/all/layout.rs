//! Every valid dense variant's weight layout round-trips: unpack(repack(w)) == w on random shapes
//! and data, for both families on both target archs (wgmma on sm_90 only).

use kdtree_fuzz::shapes;
use kdtree_jit::w4a16;
use kdtree_jit::w4a16::dense::{DenseFamily, DenseVariant};
use kdtree_jit::w4a16::wgmma::W4a16Wgmma;
use kdtree_jit::{Arch, Target, Variant};
use kdtree_quant::QuantizedWeight;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[test]
fn every_variant_layout_round_trips() {
    let mut variants = DenseVariant::valid_on(Arch(90));
    variants.extend(DenseVariant::valid_on(Arch(120)));
    let wgmma = W4a16Wgmma::valid(&Target { arch: Arch::SM_90A }).len();
    assert!(wgmma > 0 && variants.len() > 100 + wgmma, "both families are populated");
    let cases = std::cell::Cell::new(0);
    let count = variants.len();
    for v in variants {
        let strategy = (shapes(&v), any::<u64>());
        // One runner per variant: a runner counts its cases across runs.
        TestRunner::new(Config { cases: 4, ..Config::default() })
            .run(&strategy, |((_, n, k), seed)| {
                cases.set(cases.get() + 1);
                let p = w4a16::RandomGemm::random(1, n, k, v.group_size(), v.dtype(), seed).expect("problem");
                let d = v.repack(&p.w).expect("repack");
                let back: QuantizedWeight = v.unpack(&d, n, k).expect("unpack");
                prop_assert_eq!(back, p.w, "{}", v.name());
                Ok(())
            })
            .unwrap();
    }
    assert!(cases.get() >= 4 * count, "{} cases for {count} variants", cases.get());
}
