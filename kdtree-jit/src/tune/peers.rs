//! What every result is compared with, measured in the same run: cuBLAS bf16 and f16 GEMM on the
//! dequantized weight (what a W4A16 kernel must beat to be worth having), and the device's copy
//! bandwidth (what it cannot beat).

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream};
use kdtree_quant::Dtype;
use serde::{Deserialize, Serialize};

use super::bench::{BenchConfig, Timing, measure};
use super::clock::CudaClock;
use super::error::Result;
use super::flush::Flusher;
use super::problem::{Problem, to_bits};
use crate::cublas::{self, GemmType};

/// The peers of one (shape, M).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peers {
    pub cublas_bf16: Option<Timing>,
    pub cublas_f16: Option<Timing>,
    /// Device-to-device copy bandwidth, read plus write bytes, GB/s.
    pub copy_gbps: f64,
}

/// The copy bandwidth: a 1 GiB device-to-device copy, 20x the L2 of current GPUs, so no rep is
/// served from cache and no flush is needed.
pub fn copy_bandwidth(stream: &Arc<CudaStream>, clock: &mut CudaClock) -> Result<f64> {
    const BYTES: usize = 1 << 30;
    let src = stream.alloc_zeros::<u8>(BYTES)?;
    let mut dst = stream.alloc_zeros::<u8>(BYTES)?;
    let cfg = BenchConfig { warmup: 2, reps: 20, batch: 10, give_up: f64::INFINITY };
    let t = measure(clock, &cfg, None, || Ok(()), || Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    Ok(2.0 * BYTES as f64 / (t.median_us * 1e3))
}

/// The dequantized weight in one dtype on the device, with activations and output for cuBLAS.
pub(crate) struct DensePeer {
    dtype: Dtype,
    w: CudaSlice<u16>,
    x: CudaSlice<u16>,
    y: CudaSlice<u16>,
}

impl DensePeer {
    /// Uploads `problem`'s weight, dequantized and rounded to `dtype`, and its activations in `dtype`.
    pub(crate) fn new(stream: &Arc<CudaStream>, problem: &Problem, dtype: Dtype) -> Result<DensePeer> {
        let bits = |v: &[f32]| -> Vec<u16> { v.iter().map(|&f| to_bits(dtype, f)).collect() };
        let w = stream.clone_htod(&bits(&problem.weight.dequantize()))?;
        let x = stream.clone_htod(&bits(&problem.x_f32()))?;
        let y = stream.alloc_zeros::<u16>(problem.m_max * problem.weight.n)?;
        Ok(DensePeer { dtype, w, x, y })
    }

    pub(crate) fn time(
        &mut self,
        blas: &CudaBlas,
        stream: &Arc<CudaStream>,
        clock: &mut CudaClock,
        flusher: &mut Flusher,
        (m, n, k): (usize, usize, usize),
    ) -> Result<Timing> {
        let DensePeer { dtype, w, x, y } = self;
        let types = (GemmType::of(*dtype), GemmType::of(*dtype));
        let (x, w) = (x.as_view(), w.as_view());
        measure(
            clock,
            &BenchConfig::FINAL,
            None,
            || flusher.flush(stream),
            || Ok(cublas::gemm(blas, stream, types, (m, n, k), &x, &w, &mut y.as_view_mut())?),
        )
    }
}
