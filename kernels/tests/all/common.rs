//! What the GPU tests share: one GPU and one set of loaded kernels for the whole binary.

use std::sync::OnceLock;

use kdtree_jit::Gpu;
use kdtree_jit::kernel::Kernels;
use kdtree_quant::compare::Measure;

pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::open(0).unwrap_or_else(|e| panic!("GPU tests need a GPU: {e}")))
}

/// The kernels, loaded on [`gpu`] (they launch on its stream).
pub fn kernels() -> &'static Kernels {
    static KERNELS: OnceLock<Kernels> = OnceLock::new();
    KERNELS.get_or_init(|| Kernels::load(gpu(), None).unwrap_or_else(|e| panic!("loading the kernels: {e}")))
}

/// How the kernels' outputs are compared with the CPU ops': the workspace's one measure
/// ([`kdtree_quant::compare`]), element-wise with a floor of 1, `max |gpu - cpu| / max(1, |cpu|)`:
/// absolute below 1, relative above. (These tests' bounds were set as `/ (1 + |cpu|)`, which this
/// measure never exceeds by more than twice: each file's bounds say why they keep their margin.)
pub const MEASURE: Measure = Measure::each(1.0);

/// Element-wise and relative without a floor, `max |gpu - cpu| / |cpu|` (a zero output must be exact).
pub const RELATIVE: Measure = Measure::each(f32::MIN_POSITIVE);

/// [`MEASURE`]'s error of `got` against `want`; infinite for another length.
pub fn max_error(got: &[f32], want: &[f32]) -> f64 {
    MEASURE.error(got, want)
}
