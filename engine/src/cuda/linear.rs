//! A W4A16 linear layer resident on the GPU: its weight repacked and uploaded once, and the
//! compiled kernels of its shape's plan.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice};
use kdtree_jit::Gpu;
use kdtree_jit::tune::problem::{from_bits, to_bits};
use kdtree_jit::w4a16::{self, GemmBuffers, W4a16};
use kdtree_quant::QuantizedWeight;

use super::select::{Plan, WeightShape};
use crate::error::{EngineError, Result};

/// The loaded kernels of one weight shape, shared by every weight of that shape.
pub struct ShapeKernels {
    pub shape: WeightShape,
    pub plan: Plan,
    functions: HashMap<W4a16, CudaFunction>,
}

impl ShapeKernels {
    /// `functions` must hold every variant of `plan`.
    pub fn new(shape: WeightShape, plan: Plan, functions: &HashMap<W4a16, CudaFunction>) -> Result<Self> {
        let functions = plan
            .variants()
            .into_iter()
            .map(|v| {
                let f = functions.get(&v).ok_or_else(|| missing(&v))?;
                Ok((v, f.clone()))
            })
            .collect::<Result<_>>()?;
        Ok(Self { shape, plan, functions })
    }

    /// The variant for `m` rows and its function.
    fn for_rows(&self, m: usize) -> Result<(&W4a16, &CudaFunction)> {
        let v = self.plan.variant_for(m);
        Ok((v, self.functions.get(v).ok_or_else(|| missing(v))?))
    }
}

fn missing(v: &W4a16) -> EngineError {
    EngineError::InvalidArgument(format!("the kernel of {} was not loaded", kdtree_jit::Variant::name(v)))
}

/// An INT4 weight on the GPU. The host copy stays for the CPU reference (and `dequantized`).
pub struct CudaLinear {
    pub host: QuantizedWeight,
    packed: CudaSlice<u32>,
    scales: CudaSlice<u16>,
    kernels: Arc<ShapeKernels>,
    gpu: Gpu,
}

impl std::fmt::Debug for CudaLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaLinear").field("shape", &self.kernels.shape).field("plan", &self.kernels.plan).finish()
    }
}

/// Equal when they hold the same weight under the same plan (device buffers are not compared).
impl PartialEq for CudaLinear {
    fn eq(&self, other: &Self) -> bool {
        self.host == other.host && self.kernels.plan == other.kernels.plan
    }
}

impl CudaLinear {
    /// Repacks `w` into the kernels' layout (every W4A16 variant reads the same one, so a plan of
    /// several variants needs one copy) and uploads it.
    pub fn upload(gpu: &Gpu, w: &QuantizedWeight, kernels: Arc<ShapeKernels>) -> Result<Self> {
        let d = w4a16::repack(&kernels.plan.general.variant, w)?;
        let packed = gpu.stream.clone_htod(&d.packed)?;
        let scales = gpu.stream.clone_htod(&d.scales)?;
        Ok(Self { host: w.clone(), packed, scales, kernels, gpu: gpu.clone() })
    }

    pub fn variant_for(&self, m: usize) -> &W4a16 {
        self.kernels.plan.variant_for(m)
    }

    /// `y[m, n] = x[m, k] · dequant(W)ᵀ` on the GPU. X is rounded to the activation dtype on the
    /// way up and Y comes back in it, widened to f32.
    ///
    /// Activations cross host <-> device on every call; keeping them on the device between ops
    /// (device-resident activations, the other ops on the GPU too) is the next step.
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let (n, k, dtype) = (self.host.n, self.host.k, self.kernels.shape.dtype);
        if x.len() != m * k {
            return Err(EngineError::InvalidArgument(format!(
                "w4a16 linear: x holds {} values, {m} rows of {k} need {}",
                x.len(),
                m * k
            )));
        }
        if m == 0 {
            return Ok(Vec::new());
        }
        let (v, f) = self.kernels.for_rows(m)?;
        let s = &self.gpu.stream;
        let bits: Vec<u16> = x.iter().map(|&x| to_bits(dtype, x)).collect();
        let xd = s.clone_htod(&bits)?;
        let mut y = s.alloc_zeros::<u16>(m * n)?;
        // Zeroed: split-K variants keep their tile counters here (the kernel leaves them at zero).
        let mut workspace = s.alloc_zeros::<f32>(w4a16::workspace_len(v, m, n).max(1))?;
        let b =
            GemmBuffers { x: &xd, packed: &self.packed, scales: &self.scales, y: &mut y, workspace: &mut workspace };
        w4a16::launch(&self.gpu, f, v, m, n, k, b)?;
        Ok(s.clone_dtoh(&y)?.into_iter().map(|b| from_bits(dtype, b)).collect())
    }
}
