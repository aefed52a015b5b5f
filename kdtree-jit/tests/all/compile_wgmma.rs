//! The CI gate of the wgmma space: every valid point compiles for sm_90a without register spills and
//! within the shared memory the launch asks for (as `compile.rs` does for the GEMM space). Cached
//! under target/.

use std::path::Path;
use std::time::Instant;

use kdtree_jit::w4a16::wgmma::W4a16Wgmma;
use kdtree_jit::w4a16::wgmma::rules::static_bytes;
use kdtree_jit::{Arch, Cache, Error, Target, Variant, compile_all, compile_variant};

#[test]
fn a_wgmma_variant_needs_the_arch_specific_target() {
    let v = W4a16Wgmma::from_name("w4a16_wgmma_bf16_g32_m64n128k128_s4_sk1_f32acc").expect("in the space");
    let c = compile_variant(&v, Arch::SM_90A, None).unwrap();
    assert_eq!(c.arch.to_string(), "sm_90a");
    assert!(c.arch.runs_on(Arch(90)));
    // Plain sm_90 has no wgmma: ptxas refuses it, so the target in the cache key is not a formality.
    let err = compile_variant(&v, Arch(90), None).unwrap_err();
    assert!(matches!(&err, Error::Compile { log, .. } if log.contains("wgmma")), "{err}");
}

#[test]
fn every_valid_wgmma_variant_compiles_for_sm_90a_without_spills() {
    let cache = Cache::open(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin")).unwrap();
    let arch = Arch::SM_90A;
    let valid = W4a16Wgmma::valid(&Target { arch });
    let start = Instant::now();
    let results = compile_all(&valid, arch, Some(&cache), |_| {});
    let mut failures = Vec::new();
    let mut most = (0, String::new());
    for (v, result) in &results {
        match result {
            Err(e) => failures.push(e.to_string()),
            Ok(c) if !c.stats.reported => failures.push(format!("{}: ptxas reported no stats", c.name)),
            Ok(c) if c.stats.spill_stores > 0 || c.stats.spill_loads > 0 => {
                failures.push(format!("{} spills: {:?}", c.name, c.stats))
            }
            Ok(c) if c.stats.shared_bytes as usize > static_bytes(v) => failures.push(format!(
                "{}: {} bytes of static shared memory, launches allow {}",
                c.name,
                c.stats.shared_bytes,
                static_bytes(v)
            )),
            Ok(c) => {
                if c.stats.registers > most.0 {
                    most = (c.stats.registers, c.name.clone());
                }
            }
        }
    }
    eprintln!(
        "{arch}: {} wgmma variants in {:.1?}, most registers {} ({})",
        results.len(),
        start.elapsed(),
        most.0,
        most.1
    );
    assert_eq!(results.len(), valid.len());
    assert!(!valid.is_empty());
    assert!(failures.is_empty(), "{arch}:\n{}", failures.join("\n"));
}
