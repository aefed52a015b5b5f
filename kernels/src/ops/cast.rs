//! Casts between f32 and 16-bit floats (bf16 or f16 bits in `u16`), bit for bit as the `half` crate
//! converts: round to nearest even, subnormals kept, NaN kept (made quiet).

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::{launch, shape};

/// `out[i] = bf16(x[i])` (bits, as `half::bf16::from_f32`) for `i < n`.
pub fn f32_to_bf16(k: &Kernels, x: &CudaSlice<f32>, out: &mut CudaSlice<u16>, n: usize) -> Result<()> {
    let n = shape::at_least("f32_to_bf16", n, x.len(), out.len())?;
    if n > 0 {
        // SAFETY: x and out hold at least n values.
        unsafe { launch::f32_to_bf16(k, x, out, n) }?;
    }
    Ok(())
}

/// `out[i] = f16(x[i])` (bits, as `half::f16::from_f32`) for `i < n`.
pub fn f32_to_f16(k: &Kernels, x: &CudaSlice<f32>, out: &mut CudaSlice<u16>, n: usize) -> Result<()> {
    let n = shape::at_least("f32_to_f16", n, x.len(), out.len())?;
    if n > 0 {
        // SAFETY: x and out hold at least n values.
        unsafe { launch::f32_to_f16(k, x, out, n) }?;
    }
    Ok(())
}

/// `out[i] = f32(x[i])` for `i < n`, `x` bf16 bits (exact, as `half::bf16::to_f32`).
pub fn bf16_to_f32(k: &Kernels, x: &CudaSlice<u16>, out: &mut CudaSlice<f32>, n: usize) -> Result<()> {
    let n = shape::at_least("bf16_to_f32", n, x.len(), out.len())?;
    if n > 0 {
        // SAFETY: x and out hold at least n values.
        unsafe { launch::bf16_to_f32(k, x, out, n) }?;
    }
    Ok(())
}

/// `out[i] = f32(x[i])` for `i < n`, `x` f16 bits (exact, as `half::f16::to_f32`).
pub fn f16_to_f32(k: &Kernels, x: &CudaSlice<u16>, out: &mut CudaSlice<f32>, n: usize) -> Result<()> {
    let n = shape::at_least("f16_to_f32", n, x.len(), out.len())?;
    if n > 0 {
        // SAFETY: x and out hold at least n values.
        unsafe { launch::f16_to_f32(k, x, out, n) }?;
    }
    Ok(())
}
