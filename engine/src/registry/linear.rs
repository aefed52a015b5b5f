//! A linear layer's weight as the checkpoint stores it.

use kdtree_quant::QuantizedWeight;

/// `y = x · Wᵀ` with W `[n, k]`: dense (bf16/f16/f32 on disk, f32 in memory) or W4A16.
#[derive(Clone, Debug, PartialEq)]
pub enum LinearWeight {
    Dense { n: usize, k: usize, w: Vec<f32> },
    W4a16(QuantizedWeight),
}

impl LinearWeight {
    /// Output features.
    pub fn n(&self) -> usize {
        match self {
            LinearWeight::Dense { n, .. } => *n,
            LinearWeight::W4a16(q) => q.n,
        }
    }

    /// Input features.
    pub fn k(&self) -> usize {
        match self {
            LinearWeight::Dense { k, .. } => *k,
            LinearWeight::W4a16(q) => q.k,
        }
    }

    pub fn is_quantized(&self) -> bool {
        matches!(self, LinearWeight::W4a16(_))
    }

    /// The dense f32 equivalent (INT4 weights dequantized): what tests compare against.
    pub fn dequantized(&self) -> LinearWeight {
        match self {
            LinearWeight::Dense { .. } => self.clone(),
            LinearWeight::W4a16(q) => LinearWeight::Dense { n: q.n, k: q.k, w: q.dequantize() },
        }
    }
}
