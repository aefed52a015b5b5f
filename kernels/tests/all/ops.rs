//! Each kernel against the engine's CPU op on random shapes (including ones that are not multiples of
//! the block or of 4) and random data. Tolerances, as max |gpu - cpu| / max(1, |cpu|) ([`crate::common::MEASURE`]:
//! the same as the `/ (1 + |cpu|)` they were set in near 0, at most twice as strict near 1, and the
//! errors explained below stay under half of each bound there):
//! - rmsnorm 2e-5 and softmax 1e-5: the GPU sums in a tree, the CPU left to right; the difference of the
//!   two orders is a few ε·√n (ε = 2⁻²⁴, n ≤ 4096 terms), and the norm's square root halves it.
//! - silu_mul 1e-6: CUDA's expf is within 2 ulp of the correctly rounded value Rust's exp gives.
//! - rope 1e-6: one product pair, which the GPU may fuse into an FMA (one rounding fewer).
//! - argmax and embedding: exact; they only compare and copy.

use crate::common::{kernels, max_error};
use kdtree_engine::ops::cpu;
use kdtree_engine::registry::RopeTable;
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig { cases: 48, ..ProptestConfig::default() }
}

/// Seeded values in [-scale, scale): proptest picks the seed, the shape decides the length.
fn values(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    kdtree_quant::sample::symmetric(len, seed, scale)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    #[ignore = "needs a GPU"]
    fn rmsnorm_matches_the_cpu(rows in 1usize..9, cols in 1usize..10_000, seed: u64) {
        let (x, w) = (values(rows * cols, 4.0, seed), values(cols, 2.0, !seed));
        let mut want = vec![0.0; x.len()];
        cpu::rmsnorm(&x, &w, 1e-6, &mut want);
        let k = kernels();
        let (dx, dw) = (k.stream().clone_htod(&x).unwrap(), k.stream().clone_htod(&w).unwrap());
        let mut out = k.stream().alloc_zeros::<f32>(x.len()).unwrap();
        kdtree_kernels::rmsnorm(k, &dx, &dw, 1e-6, &mut out, None).unwrap();
        let got = k.stream().clone_dtoh(&out).unwrap();
        prop_assert!(max_error(&got, &want) <= 2e-5, "error {}", max_error(&got, &want));
    }

    /// The fused norms give the unfused chain's bits: `add_rmsnorm` = `add_assign` then `rmsnorm`,
    /// with or without bf16 bits, and the bits are the f32 output's cast (`half`'s rounding).
    #[test]
    #[ignore = "needs a GPU"]
    fn the_fused_norms_give_add_assign_then_rmsnorms_bits(rows in 1usize..5, cols in 1usize..10_000, seed: u64) {
        let (x, y, w) = (values(rows * cols, 4.0, seed), values(rows * cols, 4.0, seed ^ 1), values(cols, 2.0, !seed));
        let k = kernels();
        let s = k.stream();
        let (dy, dw) = (s.clone_htod(&y).unwrap(), s.clone_htod(&w).unwrap());
        // Unfused: the residual add, then the norm.
        let mut sum = s.clone_htod(&x).unwrap();
        kdtree_kernels::add_assign(k, &mut sum, &dy).unwrap();
        let mut want = s.alloc_zeros::<f32>(x.len()).unwrap();
        kdtree_kernels::rmsnorm(k, &sum, &dw, 1e-6, &mut want, None).unwrap();
        let (want_sum, want) = (s.clone_dtoh(&sum).unwrap(), s.clone_dtoh(&want).unwrap());
        for round in [false, true] {
            let mut fused = s.clone_htod(&x).unwrap();
            let mut out = s.alloc_zeros::<f32>(x.len()).unwrap();
            // One spare value past the rows: the bits buffer may be longer (padded rows).
            let mut bits = s.alloc_zeros::<u16>(x.len() + 1).unwrap();
            kdtree_kernels::add_rmsnorm(k, &mut fused, &dy, &dw, 1e-6, &mut out, round.then_some(&mut bits)).unwrap();
            prop_assert_eq!(s.clone_dtoh(&fused).unwrap(), want_sum.clone());
            let got = s.clone_dtoh(&out).unwrap();
            prop_assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "add_rmsnorm's bits");
            let bits = s.clone_dtoh(&bits).unwrap();
            let cast: Vec<u16> = got.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
            let expected: &[u16] = if round { &cast } else { &vec![0; x.len()] };
            prop_assert_eq!(&bits[..x.len()], expected);
            prop_assert_eq!(bits[x.len()], 0);
        }
        // rmsnorm with bits: the same f32 output, and its cast.
        let mut out = s.alloc_zeros::<f32>(x.len()).unwrap();
        let mut bits = s.alloc_zeros::<u16>(x.len()).unwrap();
        kdtree_kernels::rmsnorm(k, &sum, &dw, 1e-6, &mut out, Some(&mut bits)).unwrap();
        let got = s.clone_dtoh(&out).unwrap();
        prop_assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "rmsnorm_bf16's bits");
        let cast: Vec<u16> = got.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
        prop_assert_eq!(s.clone_dtoh(&bits).unwrap(), cast);
    }

    /// A norm of some columns of wider rows, read where they lie, gives the bits (f32 and bf16) of
    /// the norm of those columns copied out; unaligned starts take the scalar path on both.
    #[test]
    #[ignore = "needs a GPU"]
    fn a_norm_of_columns_gives_the_norm_of_the_copied_columns(
        rows in 1usize..5, cols in 1usize..3000, start in 0usize..700, extra in 0usize..700, seed: u64,
    ) {
        let width = start + cols + extra;
        let (x, w) = (values(rows * width, 4.0, seed), values(cols, 2.0, !seed));
        let copied: Vec<f32> = x.chunks(width).flat_map(|row| row[start..start + cols].to_vec()).collect();
        let k = kernels();
        let s = k.stream();
        let (dx, dc, dw) = (s.clone_htod(&x).unwrap(), s.clone_htod(&copied).unwrap(), s.clone_htod(&w).unwrap());
        let (mut want, mut want_bits) = (s.alloc_zeros::<f32>(rows * cols).unwrap(), s.alloc_zeros::<u16>(rows * cols).unwrap());
        kdtree_kernels::rmsnorm(k, &dc, &dw, 1e-6, &mut want, Some(&mut want_bits)).unwrap();
        let (mut got, mut got_bits) = (s.alloc_zeros::<f32>(rows * cols).unwrap(), s.alloc_zeros::<u16>(rows * cols).unwrap());
        kdtree_kernels::ops::rmsnorm_columns(k, (&dx, width, start), &dw, 1e-6, &mut got, Some(&mut got_bits)).unwrap();
        let (got, want) = (s.clone_dtoh(&got).unwrap(), s.clone_dtoh(&want).unwrap());
        prop_assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "rmsnorm_columns' bits");
        prop_assert_eq!(s.clone_dtoh(&got_bits).unwrap(), s.clone_dtoh(&want_bits).unwrap());
        // Columns past the row are an error, not a read past it.
        let mut spare = s.alloc_zeros::<f32>(rows * cols).unwrap();
        let past = (&dx, width, start + extra + 1);
        prop_assert!(kdtree_kernels::ops::rmsnorm_columns(k, past, &dw, 1e-6, &mut spare, None).is_err());
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn silu_mul_matches_the_cpu(n in 1usize..20_000, seed: u64) {
        let (gate, up) = (values(n, 20.0, seed), values(n, 3.0, !seed));
        let mut want = vec![0.0; n];
        cpu::silu_mul(&gate, &up, &mut want);
        let k = kernels();
        let (dg, du) = (k.stream().clone_htod(&gate).unwrap(), k.stream().clone_htod(&up).unwrap());
        let mut out = k.stream().alloc_zeros::<f32>(n).unwrap();
        kdtree_kernels::silu_mul(k, &dg, &du, &mut out).unwrap();
        let got = k.stream().clone_dtoh(&out).unwrap();
        prop_assert!(max_error(&got, &want) <= 1e-6, "error {}", max_error(&got, &want));
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn rope_interleaved_matches_the_cpu(
        positions in proptest::collection::vec(0usize..64, 1..9), heads in 1usize..5, half in 1usize..65, seed: u64,
    ) {
        let head_dim = 2 * half;
        let inv_freq: Vec<f64> = (0..half).map(|i| 10000f64.powf(-(i as f64) / half as f64)).collect();
        let table = RopeTable::new(&inv_freq, 64, 1.0);
        let x = values(positions.len() * heads * head_dim, 4.0, seed);
        let mut want = x.clone();
        cpu::rope_interleaved(&mut want, head_dim, &positions, &table.cos, &table.sin);
        let k = kernels();
        let mut dx = k.stream().clone_htod(&x).unwrap();
        let (cos, sin) = (k.stream().clone_htod(&table.cos).unwrap(), k.stream().clone_htod(&table.sin).unwrap());
        kdtree_kernels::rope_interleaved(k, &mut dx, head_dim, &positions, &cos, &sin).unwrap();
        let got = k.stream().clone_dtoh(&dx).unwrap();
        prop_assert!(max_error(&got, &want) <= 1e-6, "error {}", max_error(&got, &want));
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn softmax_matches_the_cpu(rows in 1usize..9, cols in 1usize..4097, seed: u64) {
        let x = values(rows * cols, 30.0, seed);
        let mut want = x.clone();
        cpu::softmax(&mut want, cols);
        let k = kernels();
        let mut dx = k.stream().clone_htod(&x).unwrap();
        kdtree_kernels::softmax(k, &mut dx, cols).unwrap();
        let got = k.stream().clone_dtoh(&dx).unwrap();
        prop_assert!(max_error(&got, &want) <= 1e-5, "error {}", max_error(&got, &want));
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn argmax_matches_the_cpu_with_ties_and_nans(rows in 1usize..9, cols in 1usize..20_000, seed: u64, nans in 0usize..4) {
        // Few distinct values, so that ties are common; some NaNs, which never win.
        let mut x: Vec<f32> = values(rows * cols, 8.0, seed).iter().map(|v| v.round()).collect();
        for i in 0..nans {
            let at = (seed as usize).wrapping_mul(i + 1) % x.len();
            x[at] = f32::NAN;
        }
        let want = cpu::argmax(&x, cols);
        let k = kernels();
        let dx = k.stream().clone_htod(&x).unwrap();
        let mut out = k.stream().alloc_zeros::<u32>(rows).unwrap();
        kdtree_kernels::argmax(k, &dx, cols, &mut out).unwrap();
        prop_assert_eq!(k.stream().clone_dtoh(&out).unwrap(), want);
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn embedding_matches_the_cpu(vocab in 1usize..300, dim in 1usize..700, ids in proptest::collection::vec(any::<u32>(), 1..20), seed: u64) {
        let ids: Vec<u32> = ids.iter().map(|&i| i % vocab as u32).collect();
        let table = values(vocab * dim, 1.0, seed);
        let mut want = vec![0.0; ids.len() * dim];
        cpu::embedding(&table, dim, &ids, &mut want).unwrap();
        let k = kernels();
        let dt = k.stream().clone_htod(&table).unwrap();
        let mut out = k.stream().alloc_zeros::<f32>(want.len()).unwrap();
        kdtree_kernels::embedding(k, &dt, dim, &ids, &mut out).unwrap();
        prop_assert_eq!(k.stream().clone_dtoh(&out).unwrap(), want);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn an_out_of_range_token_is_an_error_as_on_the_cpu() {
    let k = kernels();
    let table = k.stream().clone_htod(&[0.0f32; 6]).unwrap();
    let mut out = k.stream().alloc_zeros::<f32>(4).unwrap();
    let err = kdtree_kernels::embedding(k, &table, 2, &[3, 0], &mut out).unwrap_err();
    assert!(matches!(err, kdtree_kernels::Error::TokenOutOfRange { id: 3, vocab: 3 }), "{err}");
    assert!(cpu::embedding(&[0.0; 6], 2, &[3, 0], &mut [0.0; 4]).is_err());
}
