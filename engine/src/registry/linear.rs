//! A linear layer's weight as the checkpoint stores it, or as a backend holds it.

use std::sync::Arc;

use kdtree_quant::QuantizedWeight;

use crate::cuda::CudaLinear;

/// `y = x · Wᵀ` with W `[n, k]`: dense (bf16/f16/f32 on disk, f32 in memory), W4A16 on the host, or
/// W4A16 uploaded to the GPU by the CUDA backend at load.
#[derive(Clone, Debug, PartialEq)]
pub enum LinearWeight {
    Dense { n: usize, k: usize, w: Vec<f32> },
    W4a16(QuantizedWeight),
    Cuda(Arc<CudaLinear>),
}

impl LinearWeight {
    /// The INT4 weight on the host, for W4A16 weights wherever they live.
    pub fn int4(&self) -> Option<&QuantizedWeight> {
        match self {
            LinearWeight::Dense { .. } => None,
            LinearWeight::W4a16(q) => Some(q),
            LinearWeight::Cuda(d) => Some(&d.host),
        }
    }

    /// Output features.
    pub fn n(&self) -> usize {
        match self {
            LinearWeight::Dense { n, .. } => *n,
            LinearWeight::W4a16(q) => q.n,
            LinearWeight::Cuda(d) => d.host.n,
        }
    }

    /// Input features.
    pub fn k(&self) -> usize {
        match self {
            LinearWeight::Dense { k, .. } => *k,
            LinearWeight::W4a16(q) => q.k,
            LinearWeight::Cuda(d) => d.host.k,
        }
    }

    pub fn is_quantized(&self) -> bool {
        self.int4().is_some()
    }

    /// The dense f32 equivalent (INT4 weights dequantized): what tests compare against.
    pub fn dequantized(&self) -> LinearWeight {
        match self.int4() {
            None => self.clone(),
            Some(q) => LinearWeight::Dense { n: q.n, k: q.k, w: q.dequantize() },
        }
    }
}
