//! What the tuner times per shape: only variants that can run the shape, without tiles far taller
//! than M, and without split-K once the grid fills the device.

use kdtree_jit::tune::key::{KIMI_K2, Shape};
use kdtree_jit::tune::prune::{Scope, prune};
use kdtree_jit::w4a16::{self, Algo, W4a16};
use kdtree_jit::{Arch, Target, Variant};
use kdtree_quant::Dtype;

/// An H200 has 132 SMs.
fn scope(m: u32, shape: Shape) -> Scope {
    Scope { m, shape, group_size: 32, dtype: Dtype::Bf16, sms: 132 }
}

fn kept(m: u32, shape: Shape) -> Vec<W4a16> {
    prune(&W4a16::valid(&Target { arch: Arch(90) }), &scope(m, shape))
}

#[test]
fn every_kimi_k2_problem_keeps_candidates_that_can_run_it() {
    for &shape in KIMI_K2.shapes {
        for &m in KIMI_K2.ms {
            let kept = kept(m, shape);
            assert!(!kept.is_empty(), "{shape} M={m}: nothing left");
            for v in &kept {
                assert_eq!((v.dtype, v.group_size), (Dtype::Bf16, 32));
                assert!(w4a16::supports(v, m as usize, shape.n as usize, shape.k as usize));
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
