//! The raw launchers: one `#[kernel]` per CUDA source under `cuda/`. They trust their scalar arguments
//! to describe the buffers, hence `unsafe`; [`crate::ops`] wraps each in a function that checks lengths.

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::{KernelDef, kernel};

/// RMSNorm of `rows` rows of `cols`: `out = x / sqrt(mean(x²) + eps) * weight`.
#[kernel(file = "cuda/rmsnorm.cu", grid = rows, block = 256)]
pub unsafe fn rmsnorm(
    x: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    rows: u32,
    cols: u32,
    eps: f32,
);

/// `out = silu(gate) * up` over `n` elements.
#[kernel(file = "cuda/silu_mul.cu", grid = n.div_ceil(256), block = 256)]
pub unsafe fn silu_mul(gate: &CudaSlice<f32>, up: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u32);

/// Rotates adjacent pairs of `x` ([rows, heads, head_dim]) in place by the table rows `positions`.
#[kernel(file = "cuda/rope_interleaved.cu", grid = (rows * heads * (head_dim / 2)).div_ceil(256), block = 256)]
pub unsafe fn rope_interleaved(
    x: &mut CudaSlice<f32>,
    positions: &CudaSlice<u32>,
    cos: &CudaSlice<f32>,
    sin: &CudaSlice<f32>,
    rows: u32,
    heads: u32,
    head_dim: u32,
);

/// Row-wise softmax of `rows` rows of `cols`, in place.
#[kernel(template = "cuda/softmax.cu.tera", params(BLOCK = 1024), grid = rows, block = 1024)]
pub unsafe fn softmax(x: &mut CudaSlice<f32>, rows: u32, cols: u32);

/// Row-wise argmax of `rows` rows of `cols` into `out` ([rows]).
#[kernel(template = "cuda/argmax.cu.tera", params(BLOCK = 1024), grid = rows, block = 1024)]
pub unsafe fn argmax(x: &CudaSlice<f32>, out: &mut CudaSlice<u32>, rows: u32, cols: u32);

/// Gathers rows `ids` of `table` ([vocab, dim]) into `out` ([n_ids, dim]).
#[kernel(file = "cuda/embedding.cu", grid = n_ids, block = 256)]
pub unsafe fn embedding(
    table: &CudaSlice<f32>,
    ids: &CudaSlice<u32>,
    out: &mut CudaSlice<f32>,
    n_ids: u32,
    vocab: u32,
    dim: u32,
);

/// This crate's kernels; naming them also links their registrations into the program.
pub fn all() -> [&'static KernelDef; 6] {
    [
        &rmsnorm::KERNEL,
        &silu_mul::KERNEL,
        &rope_interleaved::KERNEL,
        &softmax::KERNEL,
        &argmax::KERNEL,
        &embedding::KERNEL,
    ]
}
