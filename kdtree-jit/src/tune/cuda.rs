//! The tuner's raw CUDA calls, each behind a safe function.

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, result as blas, sys as blas_sys};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg, sys as driver_sys,
};
use kdtree_quant::Dtype;

use super::error::{Result, TuneError};

/// The CUDA driver's version, e.g. 13000 for CUDA 13.0.
pub fn driver_version() -> Result<i32> {
    let mut version = 0;
    // SAFETY: the call writes one int through a valid pointer; the driver library is loaded
    // (a context exists before any environment is read).
    unsafe { driver_sys::cuDriverGetVersion(&mut version) }.result()?;
    Ok(version)
}

/// Whether libcublas can be loaded (any other first cuBLAS call panics when it cannot).
pub fn cublas_present() -> bool {
    // SAFETY: only tries to open the library by its known names.
    unsafe { blas_sys::is_culib_present() }
}

/// Row-major `Y[M, N] = X[M, K] · W[N, K]ᵀ` in `dtype` with f32 accumulation, by cuBLAS.
///
/// cuBLAS is column-major: it sees row-major W as Wᵀ [K, N] and Y as Yᵀ [N, M], so it computes
/// `Yᵀ = op(W) · Xᵀ` with op = transpose, leading dimensions K, K and N.
pub fn gemm(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    dtype: Dtype,
    (m, n, k): (usize, usize, usize),
    x: &CudaSlice<u16>,
    w: &CudaSlice<u16>,
    y: &mut CudaSlice<u16>,
) -> Result<()> {
    if x.len() < m * k || w.len() < n * k || y.len() < m * n {
        return Err(TuneError::Problem(format!("cuBLAS GEMM {m}x{n}x{k}: buffers too small")));
    }
    let int = |v: usize| i32::try_from(v).map_err(|_| TuneError::Problem(format!("GEMM dimension {v} too large")));
    let (m, n, k) = (int(m)?, int(n)?, int(k)?);
    let ty = match dtype {
        Dtype::F16 => blas_sys::cudaDataType_t::CUDA_R_16F,
        Dtype::Bf16 => blas_sys::cudaDataType_t::CUDA_R_16BF,
    };
    let (alpha, beta) = (1f32, 0f32);
    let (xp, _x_sync) = x.device_ptr(stream);
    let (wp, _w_sync) = w.device_ptr(stream);
    let (yp, _y_sync) = y.device_ptr_mut(stream);
    // SAFETY: the sizes were checked against the buffers above; the pointers stay valid while the
    // sync guards live (until the end of this function, after the work is enqueued on `stream`,
    // which is the handle's stream); alpha and beta are f32 as CUBLAS_COMPUTE_32F requires.
    unsafe {
        blas::gemm_ex(
            *blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            n,
            m,
            k,
            (&alpha) as *const f32 as *const _,
            wp as *const _,
            ty,
            k,
            xp as *const _,
            ty,
            k,
            (&beta) as *const f32 as *const _,
            yp as *mut _,
            ty,
            n,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )?;
    }
    Ok(())
}

/// Launches the L2 flush's read kernel (`flush.rs`) over all of `buf` with `blocks` blocks of 256.
pub fn read_all(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    buf: &CudaSlice<u8>,
    sink: &mut CudaSlice<u32>,
    blocks: u32,
) -> Result<()> {
    let chunks = (buf.len() / 16) as u64;
    let cfg = LaunchConfig { grid_dim: (blocks.max(1), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut args = stream.launch_builder(f);
    args.arg(buf).arg(&chunks).arg(sink);
    // SAFETY: the arguments match the kernel's (const uint4*, unsigned long long, unsigned*): it reads
    // `chunks` 16-byte chunks of `buf` (cudarc allocations are 256-byte aligned) and writes at most
    // one u32 of `sink`, which holds one.
    unsafe { args.launch(cfg) }?;
    Ok(())
}
