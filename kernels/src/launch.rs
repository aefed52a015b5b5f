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

/// The best (value, index) of each `chunk` columns of `rows` rows of `cols`, into `part_v`/`part_i`
/// ([rows, cols.div_ceil(chunk)]); `chunk` is a multiple of 4.
#[kernel(template = "cuda/argmax.cu.tera", params(BLOCK = 1024), grid = (rows, cols.div_ceil(chunk)), block = 1024)]
pub unsafe fn argmax_partial(
    x: &CudaSlice<f32>,
    part_v: &mut CudaSlice<f32>,
    part_i: &mut CudaSlice<u32>,
    rows: u32,
    cols: u32,
    chunk: u32,
);

/// Each row's argmax from its `chunks` partial results, into `out` ([rows]).
#[kernel(template = "cuda/argmax.cu.tera", params(BLOCK = 1024), grid = rows, block = 32)]
pub unsafe fn argmax_finish(
    part_v: &CudaSlice<f32>,
    part_i: &CudaSlice<u32>,
    out: &mut CudaSlice<u32>,
    rows: u32,
    chunks: u32,
);

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
pub fn all() -> [&'static KernelDef; 7] {
    [
        &rmsnorm::KERNEL,
        &silu_mul::KERNEL,
        &rope_interleaved::KERNEL,
        &softmax::KERNEL,
        &argmax_partial::KERNEL,
        &argmax_finish::KERNEL,
        &embedding::KERNEL,
    ]
}
