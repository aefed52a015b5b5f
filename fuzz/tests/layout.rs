//! Every valid variant's weight layout round-trips: unpack(repack(w)) == w on random shapes and
//! data, for the default space on both target archs.

use kdtree_fuzz::shapes;
use kdtree_jit::w4a16::{self, W4a16};
use kdtree_jit::{Arch, Target, Variant};
use kdtree_quant::QuantizedWeight;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[test]
fn every_variant_layout_round_trips() {
    let mut variants = W4a16::valid(&Target { arch: Arch(90) });
    variants.extend(W4a16::valid(&Target { arch: Arch(120) }));
    assert!(variants.len() > 100, "the default space is populated");
    let cases = std::cell::Cell::new(0);
    let count = variants.len();
    for v in variants {
        let g = v.group_size as usize;
        let strategy = (shapes(&v), any::<u64>());
        // One runner per variant: a runner counts its cases across runs.
        TestRunner::new(Config { cases: 4, ..Config::default() })
            .run(&strategy, |((_, n, k), seed)| {
                cases.set(cases.get() + 1);
                let p = w4a16::RandomGemm::random(1, n, k, g, v.dtype, seed).expect("problem");
                let d = w4a16::repack(&v, &p.w).expect("repack");
                let back: QuantizedWeight = w4a16::unpack(&v, &d, n, k).expect("unpack");
                prop_assert_eq!(back, p.w, "{}", v.name());
                Ok(())
            })
            .unwrap();
    }
    assert!(cases.get() >= 4 * count, "{} cases for {count} variants", cases.get());
}
