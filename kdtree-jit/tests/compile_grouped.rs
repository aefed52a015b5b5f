//! The CI gate of the grouped space: every valid point compiles for sm_90 and sm_120 without register
//! spills (as `compile.rs` does for the GEMM space). Cached under target/.

use std::path::Path;
use std::time::Instant;

use kdtree_jit::w4a16::grouped::W4a16Grouped;
use kdtree_jit::w4a16::grouped::rules::STATIC_SMEM;
use kdtree_jit::{Arch, Cache, Target, Variant, compile_all};

#[test]
fn every_valid_grouped_variant_compiles_for_sm_90_and_sm_120_without_spills() {
    let cache = Cache::open(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin")).unwrap();
    for arch in [Arch(90), Arch(120)] {
        let valid = W4a16Grouped::valid(&Target { arch });
        let start = Instant::now();
        let results = compile_all(&valid, arch, Some(&cache), |_| {});
        let mut failures = Vec::new();
        let mut most = (0, String::new());
        for (_, result) in &results {
            match result {
                Err(e) => failures.push(e.to_string()),
                Ok(c) if !c.stats.reported => failures.push(format!("{}: ptxas reported no stats", c.name)),
                Ok(c) if c.stats.spill_stores > 0 || c.stats.spill_loads > 0 => {
                    failures.push(format!("{} spills: {:?}", c.name, c.stats))
                }
                Ok(c) if c.stats.shared_bytes as usize > STATIC_SMEM => failures.push(format!(
                    "{}: {} bytes of static shared memory, launches allow {STATIC_SMEM}",
                    c.name, c.stats.shared_bytes
                )),
                Ok(c) => {
                    if c.stats.registers > most.0 {
                        most = (c.stats.registers, c.name.clone());
                    }
                }
            }
        }
        eprintln!(
            "{arch}: {} grouped variants in {:.1?}, most registers {} ({})",
            results.len(),
            start.elapsed(),
            most.0,
            most.1
        );
        assert_eq!(results.len(), valid.len());
        assert!(!valid.is_empty());
        assert!(failures.is_empty(), "{arch}:\n{}", failures.join("\n"));
    }
}
