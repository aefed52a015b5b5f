//! Safe entry points: the engine's CPU op signatures (`engine/src/ops/cpu`) on device buffers, each
//! checking the lengths its kernel relies on ([`crate::shape`]) before launching it.
//!
//! The ops of a GPU-resident forward ([`cast`], [`elementwise`], [`rows`], [`rope`],
//! [`moe`], [`moe_align`], [`finite`]) take every input on the device, position and index buffers
//! included, so that a forward copies nothing to the device per op; an empty operation launches nothing.

pub mod attention;
pub mod cast;
pub mod elementwise;
pub mod finite;
pub mod moe;
pub mod moe_align;
pub mod rope;
pub mod rows;
pub mod top_k;

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::{launch, shape};

/// Rows of `weight.len()`: `out = x / sqrt(mean(x²) + eps) * weight`; with `bits`, also `out`
/// rounded to bf16 (the cast's bits) into its first `x.len()` values, for a GEMM that reads bf16.
pub fn rmsnorm(
    k: &Kernels,
    x: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    eps: f32,
    out: &mut CudaSlice<f32>,
    bits: Option<&mut CudaSlice<u16>>,
) -> Result<()> {
    rmsnorm_columns(k, (x, weight.len(), 0), weight, eps, out, bits)
}

/// [`rmsnorm`] of columns `start .. start + weight.len()` of `x`'s rows of `x_cols` (`x` is
/// `(x, x_cols, start)`), read where they lie: `out` is `[rows, weight.len()]`.
pub fn rmsnorm_columns(
    k: &Kernels,
    (x, x_cols, start): (&CudaSlice<f32>, usize, usize),
    weight: &CudaSlice<f32>,
    eps: f32,
    out: &mut CudaSlice<f32>,
    bits: Option<&mut CudaSlice<u16>>,
) -> Result<()> {
    let (rows, cols) = norm_shape("rmsnorm", out.len(), weight.len(), out.len(), bits.as_deref())?;
    let (x_rows, x_stride) = shape::rows("rmsnorm", x.len(), x_cols)?;
    shape::same("rmsnorm", "x's rows and out's", x_rows as usize, rows as usize)?;
    shape::within_row("rmsnorm", start, weight.len(), x_cols)?;
    if rows == 0 {
        return Ok(());
    }
    let x = x.slice(start..);
    // SAFETY: x holds rows rows of x_stride from `start`, each with cols columns past it (checked
    // above); out holds rows * cols values, weight cols, bits at least rows * cols.
    match bits {
        None => unsafe { launch::rmsnorm(k, &x, weight, out, rows, cols, x_stride, eps) }?,
        Some(bits) => unsafe { launch::rmsnorm_bf16(k, &x, weight, out, bits, rows, cols, x_stride, eps) }?,
    }
    Ok(())
}

/// The residual add and the next norm in one launch: `x += y`, then [`rmsnorm`] of the sum (the bits
/// of `add_assign` followed by `rmsnorm`).
pub fn add_rmsnorm(
    k: &Kernels,
    x: &mut CudaSlice<f32>,
    y: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    eps: f32,
    out: &mut CudaSlice<f32>,
    bits: Option<&mut CudaSlice<u16>>,
) -> Result<()> {
    shape::same("add_rmsnorm", "x and y", x.len(), y.len())?;
    let (rows, cols) = norm_shape("add_rmsnorm", x.len(), weight.len(), out.len(), bits.as_deref())?;
    // SAFETY: x, y and out hold rows * cols values, weight cols, bits at least rows * cols.
    match bits {
        None => unsafe { launch::add_rmsnorm(k, x, y, weight, out, rows, cols, eps) }?,
        Some(bits) => unsafe { launch::add_rmsnorm_bf16(k, x, y, weight, out, bits, rows, cols, eps) }?,
    }
    Ok(())
}

/// The rows and columns of a norm of `x` by `weight` into `out` (and `bits`, at least as long).
fn norm_shape(
    op: &'static str,
    x: usize,
    weight: usize,
    out: usize,
    bits: Option<&CudaSlice<u16>>,
) -> Result<(u32, u32)> {
    let shape = shape::rows(op, x, weight)?;
    shape::same(op, "x and out", x, out)?;
    if let Some(bits) = bits {
        shape::at_least(op, x, x, bits.len())?;
    }
    Ok(shape)
}

/// `out = silu(gate) * up`, element-wise.
pub fn silu_mul(k: &Kernels, gate: &CudaSlice<f32>, up: &CudaSlice<f32>, out: &mut CudaSlice<f32>) -> Result<()> {
    shape::same("silu_mul", "gate and up", gate.len(), up.len())?;
    shape::same("silu_mul", "gate and out", gate.len(), out.len())?;
    let n = shape::count("silu_mul", "n", gate.len())?;
    // SAFETY: the three buffers hold n values.
    unsafe { launch::silu_mul(k, gate, up, out, n) }?;
    Ok(())
}

/// Rotates adjacent pairs of every head of `x` ([rows, heads, head_dim], row r at `positions[r]`) in
/// place; `cos`/`sin` are `[max_pos, head_dim / 2]`.
pub fn rope_interleaved(
    k: &Kernels,
    x: &mut CudaSlice<f32>,
    head_dim: usize,
    positions: &[usize],
    cos: &CudaSlice<f32>,
    sin: &CudaSlice<f32>,
) -> Result<()> {
    let (rows, heads, head_dim, positions) = shape::rope(x.len(), head_dim, positions, (cos.len(), sin.len()))?;
    let positions = k.stream().clone_htod(&positions)?;
    // SAFETY: x is [rows, heads, head_dim]; every position is below the tables' rows.
    unsafe { launch::rope_interleaved(k, x, &positions, cos, sin, rows, heads, head_dim) }?;
    Ok(())
}

/// Row-wise softmax over rows of `cols`, in place.
pub fn softmax(k: &Kernels, x: &mut CudaSlice<f32>, cols: usize) -> Result<()> {
    let (rows, cols) = shape::rows("softmax", x.len(), cols)?;
    // SAFETY: x holds rows * cols values.
    unsafe { launch::softmax(k, x, rows, cols) }?;
    Ok(())
}

/// Row-wise index of the largest value into `out` (one per row); ties go to the lowest index.
pub fn argmax(k: &Kernels, x: &CudaSlice<f32>, cols: usize, out: &mut CudaSlice<u32>) -> Result<()> {
    let (rows, cols) = shape::rows("argmax", x.len(), cols)?;
    shape::same("argmax", "out and the rows of x", out.len(), rows as usize)?;
    let (chunk, chunks) = shape::argmax_chunks(rows, cols);
    let partials = rows as usize * chunks as usize;
    let (mut part_v, mut part_i) = (k.stream().alloc_zeros::<f32>(partials)?, k.stream().alloc_zeros::<u32>(partials)?);
    // SAFETY: x holds rows * cols values; the partials rows * chunks, chunks = cols.div_ceil(chunk); out rows.
    unsafe {
        launch::argmax_partial(k, x, &mut part_v, &mut part_i, rows, cols, chunk)?;
        launch::argmax_finish(k, &part_v, &part_i, out, rows, chunks)?;
    }
    Ok(())
}

/// Copies row `ids[i]` of `table` ([vocab, dim]) to row `i` of `out`; an id past the table is an error.
pub fn embedding(k: &Kernels, table: &CudaSlice<f32>, dim: usize, ids: &[u32], out: &mut CudaSlice<f32>) -> Result<()> {
    let (vocab, dim) = shape::embedding(table.len(), dim, ids, out.len())?;
    if ids.is_empty() {
        return Ok(());
    }
    let n = shape::count("embedding", "ids", ids.len())?;
    let device_ids = k.stream().clone_htod(ids)?;
    // SAFETY: every id is below vocab; out holds n * dim values.
    unsafe { launch::embedding(k, table, &device_ids, out, n, vocab, dim) }?;
    Ok(())
}
