//! The GPU alignment of routed assignments against the CPU one (kdtree-jit's `w4a16::grouped::align`):
//! exact, sorted list, offsets, tiles and counts alike. Run on a GPU machine:
//! `cargo test --release -p kdtree-kernels --test gpu_moe_align -- --ignored`.

mod common;

use common::kernels;
use kdtree_jit::w4a16::grouped::align;
use kdtree_kernels::shape::{MAX_ASSIGNMENTS, MAX_EXPERTS};
use proptest::prelude::*;

/// xorshift64: deterministic ids without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Router-like ids: per token `top_k` distinct experts, ascending. With `skew`, experts are drawn with
/// weight 1 / (e + 1)^skew (a few hot experts, a long tail); `hot` puts that expert in every token.
fn routing(tokens: usize, experts: usize, top_k: usize, skew: f64, hot: Option<usize>, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed | 1);
    let weights: Vec<f64> = (0..experts).map(|e| 1.0 / ((e + 1) as f64).powf(skew)).collect();
    let total: f64 = weights.iter().sum();
    let mut ids = Vec::with_capacity(tokens * top_k);
    for _ in 0..tokens {
        let mut picked: Vec<usize> = hot.into_iter().collect();
        while picked.len() < top_k {
            let mut u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
            let mut e = 0;
            while e + 1 < experts && u >= weights[e] {
                u -= weights[e];
                e += 1;
            }
            // A repeat (likely when skewed) takes the next free expert instead.
            while picked.contains(&e) {
                e = (e + 1 + rng.below(experts)) % experts;
            }
            picked.push(e);
        }
        picked.sort_unstable();
        ids.extend(picked.iter().map(|&e| e as u32));
    }
    ids
}

fn first_mismatch(got: &[u32], want: &[u32]) -> String {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(i) => format!("first mismatch at {i}: got {} want {}", got[i], want[i]),
        None => format!("lengths {} and {}", got.len(), want.len()),
    }
}

fn check(ids: &[u32], experts: usize, bm: usize) -> Result<(), TestCaseError> {
    let k = kernels();
    let s = k.stream();
    let want = align(ids, experts, bm);
    let device_ids = s.clone_htod(&ids.to_vec().into_iter().chain([0]).collect::<Vec<u32>>()).unwrap();
    let mut out = kdtree_kernels::Alignment::new(k, ids.len(), experts, bm).unwrap();
    kdtree_kernels::moe_align(k, &device_ids.slice(0..ids.len()), &mut out).unwrap();
    let what = format!("{} assignments, {experts} experts, bm {bm}", ids.len());
    let meta = s.clone_dtoh(&out.meta).unwrap();
    let want_meta = [want.tiles.len() as u32, want.experts_touched as u32, want.invalid as u32];
    prop_assert_eq!(&meta[..], &want_meta[..], "meta (tiles, touched, invalid) of {}", what);
    prop_assert!(
        want.tiles.len() <= out.max_tiles,
        "{}: {} tiles over the bound {}",
        what,
        want.tiles.len(),
        out.max_tiles
    );
    let sorted = s.clone_dtoh(&out.sorted).unwrap();
    prop_assert!(
        sorted[..ids.len()] == want.sorted[..],
        "sorted of {}: {}",
        what,
        first_mismatch(&sorted, &want.sorted)
    );
    let offsets = s.clone_dtoh(&out.offsets).unwrap();
    prop_assert!(offsets == want.offsets, "offsets of {}: {}", what, first_mismatch(&offsets, &want.offsets));
    let tiles = s.clone_dtoh(&out.tiles).unwrap();
    let want_tiles = want.tile_words();
    prop_assert!(
        tiles[..want_tiles.len()] == want_tiles[..],
        "tiles of {} (words: expert, start, rows): {}",
        what,
        first_mismatch(&tiles, &want_tiles)
    );
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn fixed_cases_match_the_cpu() {
    let cases: Vec<(&str, Vec<u32>, usize)> = vec![
        ("one token, K2", routing(1, 384, 8, 0.0, None, 1), 384),
        ("64 tokens, K2, uniform", routing(64, 384, 8, 0.0, None, 2), 384),
        ("64 tokens, K2, skewed", routing(64, 384, 8, 1.2, None, 3), 384),
        ("every token on expert 5", routing(200, 384, 8, 0.0, Some(5), 4), 384),
        ("one expert takes all", vec![0; 300], 1),
        ("top-1 all on the last expert", vec![383; 77], 384),
        ("MAX_EXPERTS experts", routing(40, MAX_EXPERTS, 8, 0.5, None, 5), MAX_EXPERTS),
        ("at the assignment limit", routing(MAX_ASSIGNMENTS / 8, 384, 8, 0.8, None, 6), 384),
        ("nothing routed", vec![], 384),
        ("ids past the experts", vec![3, 9999, 0, 3, 64, 1], 64),
    ];
    for (name, ids, experts) in &cases {
        for bm in [1, 4, 8, 16] {
            if let Err(e) = check(ids, *experts, bm) {
                panic!("{name}: {e}");
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn more_assignments_than_the_limit_are_an_error() {
    let k = kernels();
    let n = MAX_ASSIGNMENTS + 1;
    let ids = k.stream().alloc_zeros::<u32>(n).unwrap();
    let mut out = kdtree_kernels::Alignment::new(k, n, 384, 8).unwrap();
    let err = kdtree_kernels::moe_align(k, &ids.slice(..), &mut out).unwrap_err();
    assert!(err.to_string().contains("at most"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs a GPU"]
    fn random_routings_match_the_cpu(
        tokens in 1usize..257,
        experts in prop::sample::select(vec![1usize, 2, 3, 7, 8, 31, 33, 64, 256, 384, 512]),
        top_k in 1usize..9,
        skew in prop::sample::select(vec![0.0f64, 0.7, 1.5, 3.0]),
        bm in prop::sample::select(vec![1usize, 4, 8, 16]),
        seed: u64,
    ) {
        let top_k = top_k.min(experts);
        check(&routing(tokens, experts, top_k, skew, None, seed), experts, bm)?;
    }
}
