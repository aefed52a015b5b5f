//! The residual add and SwiGLU's gate on the fused gate_up GEMM's output.

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::{launch, shape};

/// `x += y`, element-wise; the buffers have the same length.
pub fn add_assign(k: &Kernels, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
    shape::same("add_assign", "x and y", x.len(), y.len())?;
    let n = shape::count("add_assign", "n", x.len())?;
    if n > 0 {
        // SAFETY: x and y hold n values.
        unsafe { launch::add_assign(k, x, y, n) }?;
    }
    Ok(())
}

/// `out[r] = bf16(silu(a) * b)` for `r < rows`, where row r of `x` ([rows, 2 * inter], f32) is
/// `[a | b]` and `out` is [rows, inter] bf16 bits; computed in f32 as the engine's CPU `silu_mul`.
pub fn silu_mul_halves_f32(
    k: &Kernels,
    x: &CudaSlice<f32>,
    rows: usize,
    inter: usize,
    out: &mut CudaSlice<u16>,
) -> Result<()> {
    let (rows, inter) = shape::silu_halves("silu_mul_halves_f32", x.len(), out.len(), rows, inter)?;
    if rows > 0 {
        // SAFETY: x holds at least rows * 2 * inter values, out rows * inter.
        unsafe { launch::silu_mul_halves_f32(k, x, out, rows, inter) }?;
    }
    Ok(())
}

/// [`silu_mul_halves_f32`] with `x` in bf16 bits, each value widened to f32 exactly first.
pub fn silu_mul_halves_bf16(
    k: &Kernels,
    x: &CudaSlice<u16>,
    rows: usize,
    inter: usize,
    out: &mut CudaSlice<u16>,
) -> Result<()> {
    let (rows, inter) = shape::silu_halves("silu_mul_halves_bf16", x.len(), out.len(), rows, inter)?;
    if rows > 0 {
        // SAFETY: x holds at least rows * 2 * inter values, out rows * inter.
        unsafe { launch::silu_mul_halves_bf16(k, x, out, rows, inter) }?;
    }
    Ok(())
}
