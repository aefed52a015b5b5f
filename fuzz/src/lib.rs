//! Property-based fuzzing: the W4A16 variant space against the CPU reference, and every input file
//! the toolkit reads, edited by a hostile hand ([`mutate`]).
//!
//! | test | what | where it runs |
//! |---|---|---|
//! | `tests/all/layout.rs` | every valid dense variant's weight layout (tiles, wgmma) round-trips on random shapes | CI (CPU) |
//! | `tests/all/gpu.rs` | every dense variant valid on the GPU (tiles; wgmma on sm_90) matches `kdtree_quant::reference` on random M, N, K, data | a GPU (`--ignored`) |
//! | `tests/all/config.rs` | edited config.json: `Config::load`, `Model::load` and a short generation never panic, a refusal names an edited key, keys the engine does not read change nothing | CI (CPU) |
//! | `tests/all/safetensors.rs` | edited shard headers: the reader, INT4 weights and `Model::load` never panic | CI (CPU) |
//! | `tests/all/tuning_db.rs` | edited tuning DB files: `TuningDb::open`, lookups and saves never panic | CI (CPU) |
//! | `tests/all/cache.rs` | damaged cubin cache entries: refused naming the file, or read as exactly what it says under a redone checksum; never a miss or a panic | CI (CPU) |
//!
//! The input suites run a bounded number of cases in CI, a few seconds each; `PROPTEST_CASES` sets
//! it for a long pass (see the crate's README).

pub mod mutate;

use std::cell::Cell;

use kdtree_jit::w4a16::dense::{DenseFamily, DenseVariant};
use kdtree_jit::{Arch, Compiled, Variant, compile_all_for};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Random (M, N, K) that `v` supports, mostly not multiples of its tiles: M in 1..=bm for gemv and
/// stream, 1..=3 bm for mma and wgmma (bm: the token tile), so partial and several row blocks; N in
/// 1..=300 (partial feature tiles), K any multiple of the group size up to 40 groups (partial bk).
pub fn shapes(v: &DenseVariant) -> impl Strategy<Value = (usize, usize, usize)> + use<> {
    let max_m = v.row_limit().unwrap_or(3 * v.block_rows());
    let group = v.group_size();
    (1..=max_m, 1usize..=300, 1usize..=40).prop_map(move |(m, n, groups)| (m, n, groups * group))
}

/// A draft tree of `n` nodes as parent pointers, each parent an earlier node: a new root (1 in 8),
/// the node just before (3 in 8: long chains), or any earlier node.
pub fn draft_tree(n: usize) -> impl Strategy<Value = Vec<Option<usize>>> {
    proptest::collection::vec((0u8..8, any::<proptest::sample::Index>()), n).prop_map(|picks| {
        let parent = |(i, &(roll, at)): (usize, &(u8, proptest::sample::Index))| match roll {
            _ if i == 0 => None,
            0 => None,
            1..=3 => Some(i - 1),
            _ => Some(at.index(i)),
        };
        picks.iter().enumerate().map(parent).collect()
    })
}

/// Runs `cases` random cases of `strategy(v)` through `check` for every variant v of `variants`, each
/// compiled for `arch_of` it (no cache) and loaded by `load`: one proptest runner per variant, since
/// a runner counts its cases across runs. Panics on the first failing case, which proptest shrinks
/// and names. Returns the largest value `check` returned (an error over its bound, say) and the
/// variant that gave it.
pub fn each_variant<V: Variant, K, S: Strategy>(
    variants: &[V],
    arch_of: impl Fn(&V) -> Arch + Sync,
    load: impl Fn(V, &Compiled) -> K,
    cases: u32,
    strategy: impl Fn(&V) -> S,
    check: impl Fn(&K, S::Value) -> Result<f32, TestCaseError>,
) -> (f32, String) {
    let mut worst = (0f32, String::new());
    for (v, compiled) in compile_all_for(variants, arch_of, None, |_| {}) {
        let (name, strategy) = (v.name(), strategy(&v));
        let kernel = load(v, &compiled.unwrap_or_else(|e| panic!("{name} does not compile: {e}")));
        let here = Cell::new(0f32);
        TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() })
            .run(&strategy, |value| {
                here.set(here.get().max(check(&kernel, value)?));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        if here.get() > worst.0 {
            worst = (here.get(), name);
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use kdtree_jit::{Arch, Variant};
    use proptest::test_runner::TestRunner;

    #[test]
    fn shapes_are_supported_by_their_variant() {
        for v in DenseVariant::valid_on(Arch(90)) {
            TestRunner::deterministic()
                .run(&shapes(&v), |(m, n, k)| {
                    prop_assert!(v.supports(m, n, k), "{} {m}x{n}x{k}", v.name());
                    Ok(())
                })
                .unwrap();
        }
    }
}
