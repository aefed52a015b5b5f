//! Dense GEMMs through cuBLAS: `Y[m, n] = X[m, k] · W[n, k]ᵀ` with X and W in bf16/f16 (or both f32,
//! the router) and Y in f32, f32 accumulation.
//!
//! Exactness: cuBLAS picks its kernel (tiles, split-K) by the problem's size, so a row's result may
//! change with M. In exact mode every product therefore runs in chunks of exactly [`EXACT_ROWS`]
//! rows, padded: a GEMM's row depends only on its own row of X, so every chunk computes a row with
//! the same kernel and the same bits whatever M is. cuBLAS is flat in M up to 128 rows on the
//! weight-streaming shapes a decode step runs (GPU.md), so this costs the padded rows' output writes.

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, result as blas, sys as blas_sys};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

use crate::error::{EngineError, Result};

/// The rows of every cuBLAS call in exact mode.
pub const EXACT_ROWS: usize = 128;

/// The element type of X and W.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmInput {
    Bf16,
    F16,
    F32,
}

fn data_type(t: GemmInput) -> blas_sys::cudaDataType_t {
    match t {
        GemmInput::Bf16 => blas_sys::cudaDataType_t::CUDA_R_16BF,
        GemmInput::F16 => blas_sys::cudaDataType_t::CUDA_R_16F,
        GemmInput::F32 => blas_sys::cudaDataType_t::CUDA_R_32F,
    }
}

fn int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| EngineError::InvalidArgument(format!("GEMM dimension {v} is over i32")))
}

/// `y[m, n] = x[m, k] · w[n, k]ᵀ` for buffers of element `T` (u16 bits or f32) already of the sizes
/// cuBLAS reads and writes.
///
/// cuBLAS is column-major: it sees row-major W as Wᵀ [k, n] and Y as Yᵀ [n, m], so it computes
/// `Yᵀ = op(W) · Xᵀ` with op = transpose, leading dimensions k, k and n.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T>(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    input: GemmInput,
    (m, n, k): (usize, usize, usize),
    x: &CudaView<'_, T>,
    w: &CudaView<'_, T>,
    y: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    if x.len() < m * k || w.len() < n * k || y.len() < m * n {
        return Err(EngineError::InvalidArgument(format!("cuBLAS GEMM {m}x{n}x{k}: buffers too small")));
    }
    let (mi, ni, ki) = (int(m)?, int(n)?, int(k)?);
    let ty = data_type(input);
    let (alpha, beta) = (1f32, 0f32);
    let (xp, _x_sync) = x.device_ptr(stream);
    let (wp, _w_sync) = w.device_ptr(stream);
    let (yp, _y_sync) = y.device_ptr_mut(stream);
    // SAFETY: the sizes were checked against the buffers above; the pointers stay valid while the
    // sync guards live (until the end of this function, after the work is enqueued on `stream`,
    // the handle's stream); alpha and beta are f32 as CUBLAS_COMPUTE_32F requires (which, with the
    // handle's default math mode, never rounds f32 inputs to TF32).
    unsafe {
        blas::gemm_ex(
            *blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            ni,
            mi,
            ki,
            (&alpha) as *const f32 as *const _,
            wp as *const _,
            ty,
            ki,
            xp as *const _,
            ty,
            ki,
            (&beta) as *const f32 as *const _,
            yp as *mut _,
            blas_sys::cudaDataType_t::CUDA_R_32F,
            ni,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )?;
    }
    Ok(())
}

/// Rows `m` rounded up to whole exact-mode chunks.
pub fn padded_rows(m: usize) -> usize {
    m.div_ceil(EXACT_ROWS) * EXACT_ROWS
}
