//! Row copies against plain CPU loops and the engine's embedding: all exact, they only move (and, for
//! bf16 sources, exactly widen) values.

use crate::common::kernels;
use half::bf16;
use kdtree_engine::ops::cpu;
use proptest::prelude::*;

fn values(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    kdtree_quant::sample::symmetric(len, seed, scale)
}

fn to_bf16(x: &[f32]) -> Vec<u16> {
    x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect()
}

fn widen(x: &[u16]) -> Vec<f32> {
    x.iter().map(|&b| bf16::from_bits(b).to_f32()).collect()
}

/// `f32`s compared by bits, so that NaN rows compare too.
fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs a GPU"]
    fn copy_cols_takes_a_column_range(rows in 1usize..40, stride in 1usize..700, a in 0usize..700, b in 0usize..700, seed: u64) {
        // MLA's split of kv_a's 576 columns into 512 and 64 is one case; odd offsets and widths the rest.
        let (col_offset, cols) = (a % stride, 1 + b % (stride - a % stride));
        let x = values(rows * stride, 3.0, seed);
        let want: Vec<f32> = x.chunks_exact(stride).flat_map(|r| r[col_offset..col_offset + cols].to_vec()).collect();
        let k = kernels();
        let dx = k.stream().clone_htod(&x).unwrap();
        let mut out = k.stream().alloc_zeros::<f32>(rows * cols).unwrap();
        kdtree_kernels::copy_cols(k, &dx, stride, col_offset, cols, &mut out).unwrap();
        prop_assert_eq!(k.stream().clone_dtoh(&out).unwrap(), want);
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn place_cols_writes_a_column_range_and_nothing_else(rows in 1usize..40, stride in 1usize..700, a in 0usize..700, b in 0usize..700, seed: u64) {
        // A forward's taps: a layer's hidden states placed among others'; the other columns keep theirs.
        let (col_offset, cols) = (a % stride, 1 + b % (stride - a % stride));
        let x = values(rows * cols, 3.0, seed);
        let before = values(rows * stride, 1.0, seed ^ 1);
        let mut want = before.clone();
        for (r, row) in want.chunks_exact_mut(stride).enumerate() {
            row[col_offset..col_offset + cols].copy_from_slice(&x[r * cols..][..cols]);
        }
        let k = kernels();
        let dx = k.stream().clone_htod(&x).unwrap();
        let mut out = k.stream().clone_htod(&before).unwrap();
        kdtree_kernels::place_cols(k, &dx, cols, &mut out, stride, col_offset).unwrap();
        prop_assert_eq!(k.stream().clone_dtoh(&out).unwrap(), want);
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn gathers_pick_rows_by_device_indices(
        src_rows in 1usize..50, cols in 1usize..300, idx in proptest::collection::vec(0u32..60, 1..40),
        offset in 0usize..5, seed: u64,
    ) {
        // Indices from `offset` on; some past src_rows, which give NaN rows.
        let offset = offset.min(idx.len() - 1);
        let m = idx.len() - offset;
        let x = values(src_rows * cols, 3.0, seed);
        let x16 = to_bf16(&x);
        let mut want = Vec::new();
        let mut want16 = Vec::new();
        for &r in &idx[offset..] {
            let r = r as usize;
            if r < src_rows {
                want.extend_from_slice(&x[r * cols..][..cols]);
                want16.extend_from_slice(&x16[r * cols..][..cols]);
            } else {
                want.extend(std::iter::repeat_n(f32::from_bits(0x7fff_ffff), cols));
                want16.extend(std::iter::repeat_n(0xffffu16, cols));
            }
        }
        let k = kernels();
        let (dx, dx16, didx) =
            (k.stream().clone_htod(&x).unwrap(), k.stream().clone_htod(&x16).unwrap(), k.stream().clone_htod(&idx).unwrap());
        // One spare row in each output: the op writes m rows only.
        let mut out = k.stream().alloc_zeros::<f32>((m + 1) * cols).unwrap();
        let mut out16 = k.stream().alloc_zeros::<u16>((m + 1) * cols).unwrap();
        kdtree_kernels::gather_rows_f32(k, &dx, cols, &didx, offset, m, &mut out).unwrap();
        kdtree_kernels::gather_rows_u16(k, &dx16, cols, &didx, offset, m, &mut out16).unwrap();
        let (got, got16) = (k.stream().clone_dtoh(&out).unwrap(), k.stream().clone_dtoh(&out16).unwrap());
        prop_assert_eq!(bits(&got[..m * cols]), bits(&want));
        prop_assert_eq!(&got16[..m * cols], &want16[..]);
        prop_assert!(got[m * cols..].iter().all(|&v| v == 0.0) && got16[m * cols..].iter().all(|&v| v == 0));
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn scatter_writes_widened_rows_to_distinct_destinations(dst_rows in 1usize..50, cols in 1usize..300, seed: u64, offset in 0usize..3) {
        // A permutation of the destination rows, its first few skipped through idx_offset, and one index
        // past the end, which writes nothing.
        let mut perm: Vec<u32> = (0..dst_rows as u32).collect();
        let mut s = seed;
        for i in (1..perm.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            perm.swap(i, (s >> 33) as usize % (i + 1));
        }
        perm.push(dst_rows as u32 + 7);
        let offset = offset.min(perm.len() - 1);
        let m = perm.len() - offset;
        let src = to_bf16(&values(m * cols, 3.0, seed));
        let mut want = vec![-1.0f32; dst_rows * cols];
        for (i, &r) in perm[offset..].iter().enumerate() {
            if (r as usize) < dst_rows {
                want[r as usize * cols..][..cols].copy_from_slice(&widen(&src[i * cols..][..cols]));
            }
        }
        let k = kernels();
        let (dsrc, didx) = (k.stream().clone_htod(&src).unwrap(), k.stream().clone_htod(&perm).unwrap());
        let mut dst = k.stream().clone_htod(&vec![-1.0f32; dst_rows * cols]).unwrap();
        kdtree_kernels::scatter_rows_bf16_to_f32(k, &dsrc, cols, &didx, offset, m, &mut dst).unwrap();
        prop_assert_eq!(k.stream().clone_dtoh(&dst).unwrap(), want);
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn embedding_bf16_matches_the_cpu_on_the_widened_table(
        vocab in 1usize..300, dim in 1usize..700, ids in proptest::collection::vec(any::<u32>(), 1..20), seed: u64,
    ) {
        let ids: Vec<u32> = ids.iter().map(|&i| i % vocab as u32).collect();
        let table = to_bf16(&values(vocab * dim, 1.0, seed));
        let mut want = vec![0.0; ids.len() * dim];
        cpu::embedding(&widen(&table), dim, &ids, &mut want).unwrap();
        let k = kernels();
        let (dt, dids) = (k.stream().clone_htod(&table).unwrap(), k.stream().clone_htod(&ids).unwrap());
        let mut out = k.stream().alloc_zeros::<f32>(want.len()).unwrap();
        kdtree_kernels::embedding_bf16(k, &dt, dim, &dids, &mut out).unwrap();
        prop_assert_eq!(k.stream().clone_dtoh(&out).unwrap(), want);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn an_out_of_range_device_id_gives_a_nan_row() {
    let k = kernels();
    let table = k.stream().clone_htod(&to_bf16(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])).unwrap();
    let ids = k.stream().clone_htod(&[2u32, 3, 0]).unwrap();
    let mut out = k.stream().alloc_zeros::<f32>(6).unwrap();
    kdtree_kernels::embedding_bf16(k, &table, 2, &ids, &mut out).unwrap();
    let got = k.stream().clone_dtoh(&out).unwrap();
    assert_eq!((got[0], got[1], got[4], got[5]), (5.0, 6.0, 1.0, 2.0));
    assert!(got[2].is_nan() && got[3].is_nan(), "{got:?}");
}
