//! What the tuner times per shape: only variants that can run the shape, without tiles far taller
//! than M, and without split-K once the grid fills the device; on sm_90, wgmma tiles from M = 16.

use kdtree_jit::tune::key::{KIMI_K2, Shape};
use kdtree_jit::tune::prune::{Scope, prune};
use kdtree_jit::w4a16::dense::{DenseFamily, DenseVariant};
use kdtree_jit::w4a16::wgmma::W4a16Wgmma;
use kdtree_jit::w4a16::{Algo, W4a16};
use kdtree_jit::{Arch, Variant};
use kdtree_quant::Dtype;

/// An H200 has 132 SMs.
fn scope(m: u32, shape: Shape) -> Scope {
    Scope { m, shape, group_size: 32, dtype: Dtype::Bf16, sms: 132 }
}

/// Both families' candidates on an H200.
fn candidates(m: u32, shape: Shape) -> Vec<DenseVariant> {
    prune(&DenseVariant::valid_on(Arch(90)), &scope(m, shape))
}

/// The tiles' candidates.
fn kept(m: u32, shape: Shape) -> Vec<W4a16> {
    let tiles = candidates(m, shape).into_iter();
    tiles.filter_map(|v| if let DenseVariant::Tiles(t) = v { Some(t) } else { None }).collect()
}

fn wgmma(m: u32, shape: Shape) -> Vec<W4a16Wgmma> {
    let all = candidates(m, shape).into_iter();
    all.filter_map(|v| if let DenseVariant::Wgmma(w) = v { Some(w) } else { None }).collect()
}

#[test]
fn every_kimi_k2_problem_keeps_candidates_that_can_run_it() {
    for &shape in KIMI_K2.shapes {
        for &m in KIMI_K2.ms {
            let kept = candidates(m, shape);
            assert!(!kept.is_empty(), "{shape} M={m}: nothing left");
            for v in &kept {
                assert_eq!(v.dtype(), Dtype::Bf16);
                assert!(v.name().contains("_g32_"), "{}", v.name());
                assert!(v.supports(m as usize, shape.n as usize, shape.k as usize));
                assert!(v.check_on(Arch(90)).is_ok());
            }
        }
    }
}

#[test]
fn small_m_keeps_gemv_stream_and_the_smallest_tiles() {
    let shape = Shape { n: 4096, k: 7168 };
    let one = kept(1, shape);
    assert!(one.iter().any(|v| v.algo == Algo::Gemv));
    assert!(one.iter().all(|v| v.bm <= 16), "no 32- or 64-row tile for one row");
    assert!(one.iter().filter(|v| v.algo == Algo::Gemv).all(|v| v.bm <= 4));
    let stream = |vs: &[W4a16]| vs.iter().filter(|v| v.algo == Algo::Stream).map(|v| v.bm).collect::<Vec<_>>();
    assert!(stream(&one).contains(&1) && stream(&one).iter().all(|&bm| bm <= 4), "no 8-row stream for one row");
    let sixteen = kept(16, shape);
    assert!(!stream(&sixteen).is_empty() && stream(&sixteen).iter().all(|&bm| bm == 16));
    let many = kept(128, shape);
    assert!(many.iter().all(|v| v.algo == Algo::Mma), "gemv and stream cannot do 128 rows");
    assert!(many.iter().any(|v| v.bm == 64));
}

#[test]
fn split_k_is_dropped_once_the_grid_fills_four_waves() {
    // 128 rows in 16-row tiles over 18432 columns in 64-column tiles: 8 x 288 blocks, 17 waves.
    let wide = kept(128, Shape { n: 18432, k: 7168 });
    assert!(!wide.iter().any(|v| v.bm == 16 && v.bn == 64 && v.split_k > 1));
    // One row over 7168 columns: 56 to 112 blocks, under one wave: split-K stays.
    let narrow = kept(1, Shape { n: 7168, k: 2048 });
    assert!(narrow.iter().any(|v| v.split_k > 1));
}

#[test]
fn wgmma_tiles_join_from_16_rows_with_token_tiles_near_m() {
    let shape = Shape { n: 18432, k: 7168 };
    assert!(wgmma(8, shape).is_empty(), "below 16 rows the streaming kernels own M");
    let bms = |m| {
        let mut bms: Vec<u32> = wgmma(m, shape).iter().map(|v| v.bm).collect();
        bms.sort_unstable();
        bms.dedup();
        bms
    };
    assert_eq!(bms(16), [16]);
    assert_eq!(bms(64), [32, 64]);
    assert_eq!(bms(128), [64, 128]);
    // Split-K stays where the tiles leave the 132 SMs short: 144 blocks of 128 features at M = 64.
    assert!(wgmma(64, shape).iter().any(|v| v.split_k > 1));
    // No wgmma on a device without sm_90a.
    let sm120 = prune(&DenseVariant::valid_on(Arch(120)), &Scope { sms: 188, ..scope(64, shape) });
    assert!(!sm120.is_empty() && sm120.iter().all(|v| matches!(v, DenseVariant::Tiles(_))));
}
