//! W4A16 variants on a GPU against the CPU reference, on shapes that are not multiples of any
//! tile. Run on a GPU machine: `cargo test --release -p kdtree-jit --test gpu_w4a16 -- --ignored`.

use std::collections::HashSet;

use kdtree_jit::w4a16::accuracy::bits_error;
use kdtree_jit::w4a16::dense::{DenseFamily, DenseKernel};
use kdtree_jit::w4a16::{GemmBuffers, RandomGemm, W4a16};
use kdtree_jit::{Gpu, Target, Variant, compile_variant};

/// (M, N, K in groups): odd N, M across tile boundaries, K not a multiple of bk for groups 32/64.
const SHAPES: [(usize, usize, usize); 4] = [(1, 200, 13), (3, 328, 37), (37, 520, 16), (130, 136, 6)];

#[test]
#[ignore = "needs a GPU"]
fn every_algo_group_dtype_and_acc_matches_the_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let valid = W4a16::valid(&Target { arch: gpu.arch });
    // Per (algo, dtype, group, acc): the first variant without and the first with split-K.
    let mut seen = HashSet::new();
    let picked: Vec<W4a16> =
        valid.into_iter().filter(|v| seen.insert((v.algo, v.dtype, v.group_size, v.acc, v.split_k > 1))).collect();
    let mut failures = Vec::new();
    for v in &picked {
        let compiled = compile_variant(v, gpu.arch, None).expect("compiles");
        let kernel = DenseKernel::load(&gpu, *v, &compiled).expect("loads");
        for (i, &(m, n, groups)) in SHAPES.iter().enumerate() {
            let k = groups * v.group_size as usize;
            if !v.supports(m, n, k) {
                continue;
            }
            let p = RandomGemm::random(m, n, k, v.group_size as usize, v.dtype, i as u64).expect("problem");
            let y = kernel.gemm_host(&gpu, &p.x, m, &p.w).expect("runs");
            let err = p.error(v.dtype, &y);
            println!("{:60} m={m:4} n={n:4} k={k:5} error {err:.2e}", v.name());
            if err > v.tolerance() {
                failures.push(format!("{} at {m}x{n}x{k}: {err:.2e} > {:.2e}", v.name(), v.tolerance()));
            }
        }
    }
    // 3 groups x (mma and gemv: 2 f32-acc dtypes x with/without split-K + f16 acc; stream: f32 acc only)
    assert_eq!(picked.len(), 3 * (2 * 5 + 4));
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a GPU"]
fn a_variant_binds_only_its_own_function() {
    let gpu = Gpu::open(0).expect("a GPU");
    let valid = W4a16::valid(&Target { arch: gpu.arch });
    let (own, other) = (valid[0], valid[1]);
    let compiled = compile_variant(&own, gpu.arch, None).expect("compiles");
    let kernel = DenseKernel::load(&gpu, own, &compiled).expect("its own function binds");
    assert_eq!(kernel.variant(), own.into());
    let err = DenseKernel::load(&gpu, other, &compiled).expect_err("another variant's function does not");
    assert!(matches!(err, kdtree_jit::Error::WrongKernel { .. }), "{err}");
}

#[test]
#[ignore = "needs a GPU"]
fn a_row_limited_workspace_zeroed_once_serves_every_smaller_m() {
    // What the engine relies on when a row-limited variant runs M rows in blocks of bm, the last
    // one shorter: its split-K counters (one per column tile) sit where they are for any M, and
    // are left at zero.
    let gpu = Gpu::open(0).expect("a GPU");
    let mut seen = HashSet::new();
    let split: Vec<W4a16> = W4a16::valid(&Target { arch: gpu.arch })
        .into_iter()
        .filter(|v| v.split_k > 1 && v.algo.has_row_limit() && seen.insert((v.algo, v.dtype, v.group_size)))
        .collect();
    let s = &gpu.stream;
    let mut failures = Vec::new();
    for v in &split {
        let compiled = compile_variant(v, gpu.arch, None).expect("compiles");
        let kernel = DenseKernel::load(&gpu, *v, &compiled).expect("loads");
        let (top, n, g) = (v.bm as usize, 328, v.group_size as usize);
        let p = RandomGemm::random(top, n, 37 * g, g, v.dtype, 9).expect("problem");
        let d = v.repack(&p.w).expect("repacks");
        let (x, packed, scales) =
            (s.clone_htod(&p.x).unwrap(), s.clone_htod(&d.packed).unwrap(), s.clone_htod(&d.scales).unwrap());
        let mut workspace = s.alloc_zeros::<f32>(v.workspace_len(top, n)).unwrap();
        let mut ms = vec![top, top.div_ceil(2), 1];
        ms.dedup();
        for m in ms {
            let mut y = s.alloc_zeros::<u16>(m * n).unwrap();
            let b = GemmBuffers {
                x: x.slice(..m * p.w.k),
                packed: &packed,
                scales: &scales,
                y: y.as_view_mut(),
                workspace: &mut workspace,
            };
            kernel.launch(&gpu, m, n, p.w.k, b).expect("launches");
            let err = bits_error(v.dtype, &s.clone_dtoh(&y).unwrap(), &p.reference[..m * n], p.scale);
            println!("{:60} m={m:4} of a workspace for {top}: error {err:.2e}", v.name());
            if err.is_nan() || err > v.tolerance() {
                failures.push(format!("{} at m = {m} after m = {top}: {err:.2e}", v.name()));
            }
        }
    }
    // (gemv, stream) x (f16, bf16) x 3 groups.
    assert_eq!(split.len(), 2 * 2 * 3);
    assert!(failures.is_empty(), "{failures:#?}");
}
