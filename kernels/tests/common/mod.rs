//! What the GPU tests share: one GPU and one set of loaded kernels per test binary.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::sync::OnceLock;

use kdtree_jit::Gpu;
use kdtree_jit::kernel::Kernels;

pub fn kernels() -> &'static Kernels {
    static KERNELS: OnceLock<Kernels> = OnceLock::new();
    KERNELS.get_or_init(|| {
        let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("GPU tests need a GPU: {e}"));
        Kernels::load(&gpu, None).unwrap_or_else(|e| panic!("loading the kernels: {e}"))
    })
}

/// Largest |a - b| / (1 + |b|): absolute near zero, relative for large values.
pub fn max_error(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs() / (1.0 + y.abs())).fold(0.0, f32::max)
}
