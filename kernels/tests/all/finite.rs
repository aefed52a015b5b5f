//! count_nonfinite against the engine's CPU count: exact (a count), over every kind of non-finite bit
//! pattern, lengths around the float4 and grid boundaries, and logits of Kimi K2's size, where the grid
//! is capped and each thread strides many times.

use crate::common::kernels;
use kdtree_engine::ops::cpu;
use proptest::prelude::*;

/// The kernel's count of `x` (not empty), into a buffer that held garbage before: the op zeroes it.
fn gpu_count(x: &[f32]) -> usize {
    let k = kernels();
    let dx = k.stream().clone_htod(x).unwrap();
    let mut count = k.stream().clone_htod(&[0xdead_beefu32]).unwrap();
    kdtree_kernels::count_nonfinite(k, &dx, &mut count).unwrap();
    k.stream().clone_dtoh(&count).unwrap()[0] as usize
}

/// Finite values with, at every `every`-th index, one of the non-finite patterns in turn.
fn sprinkled(len: usize, every: usize, seed: u64) -> Vec<f32> {
    let patterns = [0x7f80_0000u32, 0xff80_0000, 0x7fc0_0000, 0xffc0_0000, 0x7f80_0001, 0xffff_ffff, 0x7fbf_ffff];
    let mut x = kdtree_quant::sample::symmetric(len, seed, 1e30);
    for (j, i) in (0..len).step_by(every.max(1)).enumerate() {
        x[i] = f32::from_bits(patterns[j % patterns.len()]);
    }
    x
}

#[test]
#[ignore = "needs a GPU"]
fn every_non_finite_pattern_counts_and_no_finite_one_does() {
    // The largest finite values, the smallest subnormals and both zeros next to each non-finite kind.
    let bits = [
        0x7f7f_ffffu32,
        0xff7f_ffff,
        0x0000_0001,
        0x8000_0001,
        0x0000_0000,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffc0_0000,
        0x3f80_0000,
    ];
    let x: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    assert_eq!(cpu::count_nonfinite(&x), 5);
    assert_eq!(gpu_count(&x), 5);
}

#[test]
#[ignore = "needs a GPU"]
fn lengths_around_float4_and_grid_boundaries() {
    for len in [1, 2, 3, 4, 5, 7, 8, 255, 256, 257, 4095, 4096, 4097, 1 << 20, (1 << 22) + 3, 1024 * 4096 * 3 + 1] {
        let x = sprinkled(len, 97, len as u64);
        assert_eq!(gpu_count(&x), cpu::count_nonfinite(&x), "len {len}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn kimi_k2_logits_of_a_whole_tree() {
    // 128 rows of the 163840-token vocabulary: 21M values, the grid capped at 1024 blocks.
    let len = 128 * 163_840;
    let mut x = kdtree_quant::sample::symmetric(len, 3, 30.0);
    assert_eq!(gpu_count(&x), 0);
    for i in [0, 1, 4 * 1024 * 256 - 1, 4 * 1024 * 256, len / 2 + 1, len - 2, len - 1] {
        x[i] = f32::NAN;
    }
    x[12_345] = f32::NEG_INFINITY;
    assert_eq!(gpu_count(&x), 8);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs a GPU"]
    fn random_lengths_and_positions(len in 1usize..20_000, every in 1usize..3000, seed: u64) {
        let x = sprinkled(len, every, seed);
        prop_assert_eq!(gpu_count(&x), cpu::count_nonfinite(&x));
    }
}
