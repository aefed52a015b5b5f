//! Counting the values that are not finite (NaN, ±inf): the engine's check that a forward's logits
//! are numbers, cheap enough to run on every forward (one read of the logits, a few bytes back).

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use crate::error::{Error, Result};
use crate::{launch, shape};

/// `count[0]` = how many values of `x` are NaN or infinite, as the engine's CPU
/// `ops::cpu::count_nonfinite`. `count` holds at least one value; this zeroes it, then launches the
/// kernel, which adds to it. Nothing is read back: the caller copies `count` when it syncs anyway
/// (the engine, with the argmax ids).
pub fn count_nonfinite(k: &Kernels, x: &CudaSlice<f32>, count: &mut CudaSlice<u32>) -> Result<()> {
    let op = "count_nonfinite";
    if count.is_empty() {
        return Err(Error::Shape { op, reason: "count holds no value".into() });
    }
    let n = shape::count(op, "x", x.len())?;
    k.stream().memset_zeros(count)?;
    if n > 0 {
        // SAFETY: x holds n values, count at least one, zeroed above on the same stream.
        unsafe { launch::count_nonfinite(k, x, count, n) }?;
    }
    Ok(())
}
