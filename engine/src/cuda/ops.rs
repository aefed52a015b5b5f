//! The CUDA backend's calls of kdtree-kernels' safe ops, in the engine's types: which kernel serves a
//! dtype, and the engine's structs turned into the kernels' (kdtree-kernels does not depend on the
//! engine, whose CPU ops its tests check it against).

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;
use kdtree_kernels as kk;
use kdtree_quant::Dtype;

use crate::error::{EngineError, Result};
use crate::registry::RopeSpan;
use crate::registry::Routing;

fn bf16_only(op: &'static str, dtype: Dtype) -> Result<()> {
    match dtype {
        Dtype::Bf16 => Ok(()),
        Dtype::F16 => Err(EngineError::UnsupportedInput {
            op,
            input: "f16 activations".into(),
            accepted: "bf16 ones on CUDA (f16 is not supported yet)".into(),
        }),
    }
}

/// The first `x.len()` values of `out` = `x` rounded to `dtype` bits.
pub(crate) fn to_half(k: &Kernels, x: &CudaSlice<f32>, dtype: Dtype, out: &mut CudaSlice<u16>) -> Result<()> {
    match dtype {
        Dtype::Bf16 => kk::f32_to_bf16(k, x, out, x.len())?,
        Dtype::F16 => kk::f32_to_f16(k, x, out, x.len())?,
    }
    Ok(())
}

/// `out` = the first `out.len()` values of `x` widened from `dtype` bits.
pub(crate) fn from_half(k: &Kernels, x: &CudaSlice<u16>, dtype: Dtype, out: &mut CudaSlice<f32>) -> Result<()> {
    let n = out.len();
    match dtype {
        Dtype::Bf16 => kk::bf16_to_f32(k, x, out, n)?,
        Dtype::F16 => kk::f16_to_f32(k, x, out, n)?,
    }
    Ok(())
}

/// Rotates `span` of every head of rows of `cols`, row r at `positions[r]`.
pub(crate) fn rope(
    k: &Kernels,
    x: &mut CudaSlice<f32>,
    cols: usize,
    span: RopeSpan,
    positions: &CudaSlice<u32>,
    cos: &CudaSlice<f32>,
    sin: &CudaSlice<f32>,
) -> Result<()> {
    let RopeSpan { stride, offset, dim, layout } = span;
    let heads = cols.checked_div(stride).unwrap_or(0);
    let columns = kk::RopeColumns { heads, head_stride: stride, offset, dim, layout };
    Ok(kk::rope_strided(k, x, columns, positions, cos, sin)?)
}

/// DeepSeek-V3's router: ids and weights `[tokens, top_k]`.
pub(crate) fn route(
    k: &Kernels,
    logits: &CudaSlice<f32>,
    bias: &CudaSlice<f32>,
    r: &Routing,
    ids: &mut CudaSlice<u32>,
    weights: &mut CudaSlice<f32>,
) -> Result<()> {
    Ok(kk::route_noaux_tc(k, logits, bias, r, ids, weights)?)
}

/// `dst[idx[start + i]] = f32(src[i])` for `i < m`, half rows of `cols`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_rows_to_f32(
    k: &Kernels,
    src: &CudaSlice<u16>,
    dtype: Dtype,
    idx: &CudaSlice<u32>,
    start: usize,
    m: usize,
    cols: usize,
    dst: &mut CudaSlice<f32>,
) -> Result<()> {
    bf16_only("scatter", dtype)?;
    Ok(kk::scatter_rows_bf16_to_f32(k, src, cols, idx, start, m, dst)?)
}

/// `out = silu(a) * b`, half rows `[a | b]` of `cols`, into half rows.
pub(crate) fn silu_mul_halves_u16(
    k: &Kernels,
    x: &CudaSlice<u16>,
    rows: usize,
    cols: usize,
    dtype: Dtype,
    out: &mut CudaSlice<u16>,
) -> Result<()> {
    bf16_only("silu_mul", dtype)?;
    Ok(kk::silu_mul_halves_bf16(k, x, rows, cols / 2, out)?)
}

/// Rows `ids` of a half table `[vocab, dim]` into f32 rows; ids were checked on the host.
pub(crate) fn embedding(
    k: &Kernels,
    table: &CudaSlice<u16>,
    dtype: Dtype,
    dim: usize,
    ids: &CudaSlice<u32>,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    bf16_only("embedding", dtype)?;
    Ok(kk::embedding_bf16(k, table, dim, ids, out)?)
}

/// Enqueues the row-wise argmax of `x` (rows of `cols`) into `ids`, and how many values of `x` are
/// NaN or infinite into `count` (one value); [`read_argmax_checked`] reads both back, waiting for the
/// GPU once.
pub(crate) fn argmax_checked(
    k: &Kernels,
    x: &CudaSlice<f32>,
    cols: usize,
    ids: &mut CudaSlice<u32>,
    count: &mut CudaSlice<u32>,
) -> Result<()> {
    kk::argmax(k, x, cols, ids)?;
    kk::count_nonfinite(k, x, count)?;
    Ok(())
}

/// The ids and the count [`argmax_checked`] wrote.
pub(crate) fn read_argmax_checked(
    k: &Kernels,
    ids: &CudaSlice<u32>,
    count: &CudaSlice<u32>,
) -> Result<(Vec<u32>, usize)> {
    let ids = k.stream().clone_dtoh(ids)?;
    let count = k.stream().clone_dtoh(count)?;
    Ok((ids, count[0] as usize))
}
