//! The CI gate of the MLA family: every entry of every valid decode variant (the split kernel and
//! the combine), of the aux variant (absorb, unabsorb, append, gather) and of the f32 variant
//! (attention and its four companions) compiles for sm_90 (the wgmma form for sm_90a) and sm_120
//! without register spills, within the static shared memory the rules count. Cached under target/.

use std::path::Path;
use std::time::Instant;

use kdtree_jit::mla::rules::{aux_static_smem, combine_static_smem, static_smem};
use kdtree_jit::mla::{MlaAux, MlaDecode};
use kdtree_jit::mla_f32::MlaF32;
use kdtree_jit::{Arch, Cache, Compiled, Target, Variant, compile_source, render};
use rayon::prelude::*;

/// Why `result` fails the gate, if it does.
fn failure(name: &str, smem: usize, result: &kdtree_jit::Result<Compiled>) -> Option<String> {
    match result {
        Err(e) => Some(e.to_string()),
        Ok(c) if !c.stats.reported => Some(format!("{name}: ptxas reported no stats")),
        Ok(c) if c.stats.spill_stores > 0 || c.stats.spill_loads > 0 => Some(format!("{name} spills: {:?}", c.stats)),
        Ok(c) if c.stats.shared_bytes as usize > smem => {
            Some(format!("{name}: {} bytes of static shared memory, the rules count {smem}", c.stats.shared_bytes))
        }
        Ok(_) => None,
    }
}

/// Every entry of `v` as (name, static shared memory the rules allow it).
fn entries<V: Variant>(
    v: &V,
    names: Vec<(String, usize)>,
    arch: Arch,
    cache: &Cache,
) -> Vec<(String, Option<String>, u32)> {
    let source = render(v).map_err(|e| e.to_string());
    names
        .into_par_iter()
        .map(|(name, smem)| {
            let compiled = match &source {
                Ok(s) => compile_source(&name, &v.template(), s, arch, Some(cache)),
                Err(e) => return (name.clone(), Some(e.clone()), 0),
            };
            let registers = compiled.as_ref().map_or(0, |c| c.stats.registers);
            (name.clone(), failure(&name, smem, &compiled), registers)
        })
        .collect()
}

#[test]
fn every_valid_mla_variant_compiles_for_sm_90_and_sm_120_without_spills() {
    let cache = Cache::open(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin")).unwrap();
    for arch in [Arch(90), Arch(120)] {
        let target = Target { arch };
        let start = Instant::now();
        let valid = MlaDecode::valid(&target);
        assert!(!valid.is_empty());
        let mut results: Vec<(String, Option<String>, u32)> = valid
            .par_iter()
            .flat_map(|v| {
                entries(
                    v,
                    vec![(v.name(), static_smem(v)), (v.combine_name(), combine_static_smem(v))],
                    v.compile_arch(arch),
                    &cache,
                )
            })
            .collect();
        for v in MlaAux::valid(&target) {
            let smem = aux_static_smem(&v);
            results.extend(entries(&v, v.entry_names().into_iter().map(|n| (n, smem)).collect(), arch, &cache));
        }
        // The f32 family's five entries: static shared memory of the query row, the tile's weights and
        // entries, and the warps' maxima (attention), well under the 48 KiB a static block may take.
        for v in MlaF32::valid(&target) {
            let names = v.entry_names().into_iter().map(|n| (n, 48 * 1024)).collect();
            results.extend(entries(&v, names, arch, &cache));
        }
        let most = results.iter().map(|(name, _, r)| (*r, name.clone())).max().unwrap_or_default();
        eprintln!(
            "{arch}: {} MLA entries in {:.1?}, most registers {} ({})",
            results.len(),
            start.elapsed(),
            most.0,
            most.1
        );
        let failures: Vec<String> = results.iter().filter_map(|(_, f, _)| f.clone()).collect();
        assert!(failures.is_empty(), "{arch}:\n{}", failures.join("\n"));
    }
}
