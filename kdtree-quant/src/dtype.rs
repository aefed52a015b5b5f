//! The 16-bit float types the format and the GEMM speak: activations and scales.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// A 16-bit floating-point type: the activation dtype of a W4A16 GEMM, or a scale dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F16,
    Bf16,
}

impl Dtype {
    pub const ALL: [Dtype; 2] = [Dtype::F16, Dtype::Bf16];

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    pub fn safetensors(self) -> safetensors::Dtype {
        match self {
            Dtype::F16 => safetensors::Dtype::F16,
            Dtype::Bf16 => safetensors::Dtype::BF16,
        }
    }

    pub fn from_safetensors(dtype: safetensors::Dtype) -> Option<Dtype> {
        match dtype {
            safetensors::Dtype::F16 => Some(Dtype::F16),
            safetensors::Dtype::BF16 => Some(Dtype::Bf16),
            _ => None,
        }
    }

    /// Round an f32 to this dtype (to nearest, ties to even) and back.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F16 => f16::from_f32(x).to_f32(),
            Dtype::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }

    /// Machine epsilon: the spacing of this dtype's values just above 1.
    pub fn epsilon(self) -> f32 {
        match self {
            Dtype::F16 => f16::EPSILON.to_f32(),
            Dtype::Bf16 => bf16::EPSILON.to_f32(),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f16" | "fp16" | "float16" => Ok(Dtype::F16),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            other => Err(format!("unknown dtype `{other}`: expected f16 or bf16")),
        }
    }
}

/// A 16-bit float stored as its bits: `f16` or `bf16`, converted through f32.
pub trait Half: Copy + Send + Sync + bytemuck::Pod + 'static {
    const DTYPE: Dtype;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Half for f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Half for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}
