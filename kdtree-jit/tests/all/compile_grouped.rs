//! The CI gate of the grouped space: both entries of every valid point (the plain store and the SiLU
//! epilogue's) compile for sm_90 and sm_120 without register spills (as `compile.rs` does for the GEMM
//! space). Cached under target/.

use std::path::Path;
use std::time::Instant;

use kdtree_jit::w4a16::grouped::W4a16Grouped;
use kdtree_jit::w4a16::grouped::rules::STATIC_SMEM;
use kdtree_jit::{Arch, Cache, Compiled, Target, Variant, compile_all, compile_source, render};
use rayon::prelude::*;

/// Why `result` fails the gate, if it does.
fn failure(name: &str, result: &kdtree_jit::Result<Compiled>) -> Option<String> {
    match result {
        Err(e) => Some(e.to_string()),
        Ok(c) if c.name != name => Some(format!("{name}: compiled as {}", c.name)),
        Ok(c) if !c.stats.reported => Some(format!("{name}: ptxas reported no stats")),
        Ok(c) if c.stats.spill_stores > 0 || c.stats.spill_loads > 0 => Some(format!("{name} spills: {:?}", c.stats)),
        Ok(c) if c.stats.shared_bytes as usize > STATIC_SMEM => Some(format!(
            "{name}: {} bytes of static shared memory, launches allow {STATIC_SMEM}",
            c.stats.shared_bytes
        )),
        Ok(_) => None,
    }
}

#[test]
fn every_valid_grouped_variant_compiles_for_sm_90_and_sm_120_without_spills() {
    let cache = Cache::open(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin")).unwrap();
    for arch in [Arch(90), Arch(120)] {
        let valid = W4a16Grouped::valid(&Target { arch });
        let start = Instant::now();
        let mut results: Vec<(String, kdtree_jit::Result<Compiled>)> =
            compile_all(&valid, arch, Some(&cache), |_| {}).into_iter().map(|(v, r)| (v.name(), r)).collect();
        // The SiLU entry lives in the same source; compiled under its own name, ptxas' report is its own.
        results.par_extend(valid.par_iter().map(|v| {
            let compiled =
                render(v).and_then(|source| compile_source(&v.silu_name(), &v.template(), &source, arch, Some(&cache)));
            (v.silu_name(), compiled)
        }));
        let failures: Vec<String> = results.iter().filter_map(|(name, r)| failure(name, r)).collect();
        let most = results
            .iter()
            .filter_map(|(name, r)| r.as_ref().ok().map(|c| (c.stats.registers, name.clone())))
            .max()
            .unwrap_or_default();
        eprintln!(
            "{arch}: {} grouped entries in {:.1?}, most registers {} ({})",
            results.len(),
            start.elapsed(),
            most.0,
            most.1
        );
        assert_eq!(results.len(), 2 * valid.len());
        assert!(!valid.is_empty());
        assert!(failures.is_empty(), "{arch}:\n{}", failures.join("\n"));
    }
}
