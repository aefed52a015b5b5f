//! The GPU alignment of routed assignments against the CPU one (kdtree-jit's `w4a16::grouped::align`):
//! exact, sorted list, offsets, tiles and counts alike; the positions are the sorted list's inverse. Run on a GPU machine:
//! `cargo test --release -p kdtree-kernels --test all -- --ignored moe_align::`.

use crate::common::kernels;
use kdtree_jit::w4a16::grouped::{align, sample_routing};
use kdtree_kernels::shape::{MAX_ASSIGNMENTS, MAX_EXPERTS};
use proptest::prelude::*;

fn routing(tokens: usize, experts: usize, top_k: usize, skew: f64, hot: Option<usize>, seed: u64) -> Vec<u32> {
    sample_routing(tokens, experts, top_k, skew, hot, seed)
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
    // One spare id, so that an empty routing still has a buffer to view.
    let device_ids = s.clone_htod(&ids.iter().copied().chain([0]).collect::<Vec<u32>>()).unwrap();
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
    let positions = s.clone_dtoh(&out.positions).unwrap();
    let want_positions = {
        let mut p = vec![0u32; ids.len()];
        for (i, &a) in want.sorted.iter().enumerate() {
            p[a as usize] = i as u32;
        }
        p
    };
    prop_assert!(
        positions[..ids.len()] == want_positions[..],
        "positions of {}: {}",
        what,
        first_mismatch(&positions, &want_positions)
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
