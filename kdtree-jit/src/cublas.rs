//! Dense GEMMs through cuBLAS, for the engine's dense linears and router and for the tuner's cuBLAS
//! peers: row-major `Y[m, n] = X[m, k] · W[n, k]ᵀ`, f32 accumulation.
//!
//! Why `cublasGemmEx` by hand: cudarc's typed `Gemm` (behind its `f16` feature) multiplies bf16
//! into bf16 and f16 into f16, but the engine needs bf16/f16 inputs with an f32 output (its
//! residual stream stays f32), which only `cublasGemmEx` computes. This is the one call of it in
//! the workspace: the tuner's peers (output in the input's dtype) and the engine (f32 output) both
//! come here, with the output type a parameter.

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, result as blas, sys as blas_sys};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr};
use kdtree_quant::Dtype;

use crate::launch::short_buffer;
use crate::{Error, Result};

/// Whether libcublas can be loaded: probe before any cuBLAS call, which panics when it cannot.
pub fn present() -> bool {
    // SAFETY: only tries to open the library by its known names.
    unsafe { blas_sys::is_culib_present() }
}

/// The workspace NVIDIA recommends for Hopper and newer.
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

/// Gives `blas` a workspace of `WORKSPACE_BYTES` on `stream` (the handle's), so that cuBLAS never
/// allocates one of its own while a stream is captured into a CUDA graph. The caller keeps the
/// buffer alive as long as the handle, and drops the handle first.
pub fn set_workspace(blas: &CudaBlas, stream: &Arc<CudaStream>) -> Result<CudaSlice<u8>> {
    let mut workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?;
    let (ptr, sync) = workspace.device_ptr_mut(stream);
    // SAFETY: a live handle and a device buffer of the size given, which the caller keeps alive while
    // the handle may use it.
    unsafe { blas_sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut _, WORKSPACE_BYTES) }.result()?;
    drop(sync);
    Ok(workspace)
}

/// The element type of a GEMM operand. bf16 and f16 live in `u16` buffers (their bits), f32 in
/// `f32` ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmType {
    Bf16,
    F16,
    F32,
}

impl GemmType {
    /// The half type of an activation dtype.
    pub fn of(dtype: Dtype) -> GemmType {
        match dtype {
            Dtype::Bf16 => GemmType::Bf16,
            Dtype::F16 => GemmType::F16,
        }
    }

    fn bytes(self) -> usize {
        match self {
            GemmType::Bf16 | GemmType::F16 => 2,
            GemmType::F32 => 4,
        }
    }

    fn cuda(self) -> blas_sys::cudaDataType_t {
        match self {
            GemmType::Bf16 => blas_sys::cudaDataType_t::CUDA_R_16BF,
            GemmType::F16 => blas_sys::cudaDataType_t::CUDA_R_16F,
            GemmType::F32 => blas_sys::cudaDataType_t::CUDA_R_32F,
        }
    }
}

/// How a GEMM computes: both accumulate in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compute {
    /// `CUBLAS_COMPUTE_32F`: with the handle's default math mode, f32 inputs are never rounded to
    /// TF32; cuBLAS is free to pick any other algorithm.
    F32,
    /// `CUBLAS_COMPUTE_32F_PEDANTIC`: f32 in every stage whatever the math mode or the
    /// `NVIDIA_TF32_OVERRIDE` environment variable say, no TF32 and no tensor-op shortcut: what an f32
    /// model's weights are multiplied with, so that its arithmetic is f32 as its checkpoint's is.
    F32Pedantic,
}

impl Compute {
    fn cuda(self) -> blas_sys::cublasComputeType_t {
        match self {
            Compute::F32 => blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            Compute::F32Pedantic => blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
        }
    }
}

/// `y[m, n] = x[m, k] · w[n, k]ᵀ`, row-major, with X and W of type `input` and Y of type `output`,
/// accumulated in f32 ([`Compute::F32`]), enqueued on `stream`, which must be `blas`'s. The buffers'
/// element types must have the size of their GEMM types (u16 for bf16/f16, f32 for f32) and hold at
/// least what cuBLAS reads and writes.
///
/// cuBLAS is column-major: it sees row-major W as Wᵀ [k, n] and Y as Yᵀ [n, m], so it computes
/// `Yᵀ = op(W) · Xᵀ` with op = transpose, leading dimensions k, k and n.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: DeviceRepr, U: DeviceRepr>(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    types: (GemmType, GemmType),
    dims: (usize, usize, usize),
    x: &CudaView<'_, T>,
    w: &CudaView<'_, T>,
    y: &mut CudaViewMut<'_, U>,
) -> Result<()> {
    gemm_with(blas, stream, Compute::F32, types, dims, x, w, y)
}

/// `gemm` computed as `compute` says.
#[allow(clippy::too_many_arguments)]
pub fn gemm_with<T: DeviceRepr, U: DeviceRepr>(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    compute: Compute,
    (input, output): (GemmType, GemmType),
    (m, n, k): (usize, usize, usize),
    x: &CudaView<'_, T>,
    w: &CudaView<'_, T>,
    y: &mut CudaViewMut<'_, U>,
) -> Result<()> {
    let fail = |reason: String| Error::Unsupported { variant: format!("cuBLAS GEMM {m}x{n}x{k}"), reason };
    if size_of::<T>() != input.bytes() || size_of::<U>() != output.bytes() {
        return Err(fail(format!(
            "{input:?} inputs in {}-byte elements, {output:?} output in {}-byte ones",
            size_of::<T>(),
            size_of::<U>()
        )));
    }
    let needs = [("x", x.len(), m * k), ("w", w.len(), n * k), ("y", y.len(), m * n)];
    if let Some(reason) = short_buffer(&needs) {
        return Err(fail(reason));
    }
    let int = |v: usize| i32::try_from(v).map_err(|_| fail(format!("dimension {v} is over i32")));
    let (mi, ni, ki) = (int(m)?, int(n)?, int(k)?);
    let mut on: blas_sys::cudaStream_t = std::ptr::null_mut();
    // SAFETY: a live handle and one valid out-pointer.
    unsafe { blas_sys::cublasGetStream_v2(*blas.handle(), &mut on) }.result()?;
    if on.cast::<std::ffi::c_void>() != stream.cu_stream().cast::<std::ffi::c_void>() {
        return Err(fail("the cuBLAS handle is bound to another stream than the one given".into()));
    }
    let (alpha, beta) = (1f32, 0f32);
    let (xp, _x_sync) = x.device_ptr(stream);
    let (wp, _w_sync) = w.device_ptr(stream);
    let (yp, _y_sync) = y.device_ptr_mut(stream);
    // SAFETY: the element sizes and the lengths were checked against the types and dimensions above;
    // the pointers stay valid while the sync guards live (until the end of this function, after the
    // work is enqueued on `stream`, which was checked to be the handle's); alpha and beta are f32 as
    // both f32 compute types require.
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
            input.cuda(),
            ki,
            xp as *const _,
            input.cuda(),
            ki,
            (&beta) as *const f32 as *const _,
            yp as *mut _,
            output.cuda(),
            ni,
            compute.cuda(),
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )?;
    }
    Ok(())
}
