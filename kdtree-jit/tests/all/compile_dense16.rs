//! The CI gate of the streamed 16-bit family: every valid variant compiles for sm_90 and sm_120
//! without register spills, and its static shared memory is split-K's flag alone. Cached under target/.

use std::path::Path;
use std::time::Instant;

use kdtree_jit::dense16::Dense16;
use kdtree_jit::{Arch, Cache, Target, Variant, compile_all};

#[test]
fn every_valid_dense16_variant_compiles_for_sm_90_and_sm_120_without_spills() {
    let cache = Cache::open(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin")).unwrap();
    for arch in [Arch(90), Arch(120)] {
        let start = Instant::now();
        let valid = Dense16::valid(&Target { arch });
        assert_eq!(valid.len(), if arch == Arch(90) { 310 } else { 150 });
        let results = compile_all(&valid, arch, Some(&cache), |_| {});
        let mut failures = Vec::new();
        let mut most = (0, String::new());
        for (v, result) in &results {
            match result {
                Err(e) => failures.push(format!("{}: {e}", v.name())),
                Ok(c) if !c.stats.reported => failures.push(format!("{}: ptxas reported no stats", v.name())),
                Ok(c) if c.stats.spill_stores > 0 || c.stats.spill_loads > 0 => {
                    failures.push(format!("{} spills: {:?}", v.name(), c.stats));
                }
                Ok(c) if c.stats.shared_bytes > 16 => {
                    failures.push(format!("{}: {} bytes of static shared memory", v.name(), c.stats.shared_bytes));
                }
                Ok(c) => most = most.max((c.stats.registers, v.name())),
            }
        }
        eprintln!(
            "{arch}: {} dense16 variants in {:.1?}, most registers {} ({})",
            results.len(),
            start.elapsed(),
            most.0,
            most.1
        );
        assert!(failures.is_empty(), "{arch}:\n{}", failures.join("\n"));
    }
}
