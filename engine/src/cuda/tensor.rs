//! The CUDA backend's activations and per-forward inputs.

use cudarc::driver::CudaSlice;

/// f32 rows on the GPU; `data` holds exactly `rows * cols` values.
pub struct CudaTensor {
    pub data: CudaSlice<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl CudaTensor {
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One forward's inputs on the GPU, uploaded once and read by every layer.
pub struct CudaBatch {
    pub n: usize,
    pub tokens: CudaSlice<u32>,
    pub positions: CudaSlice<u32>,
    /// Visibility among the new tokens, `[n, words]` with `words = n.div_ceil(32)`: bit `b` of
    /// word `w` of row `i` is whether token `i` sees token `32 w + b`.
    pub mask: CudaSlice<u32>,
}
