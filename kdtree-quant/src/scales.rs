//! Group scales: one 16-bit float per (output row, group of K), kept as raw bits so that
//! they travel to files and to the GPU unchanged.

use crate::dtype::Dtype;
use half::{bf16, f16};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scales {
    pub dtype: Dtype,
    pub bits: Vec<u16>,
}

impl Scales {
    pub fn len(&self) -> usize {
        self.bits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }

    pub fn get(&self, i: usize) -> f32 {
        to_f32(self.dtype, self.bits[i])
    }

    pub fn to_f32(&self) -> Vec<f32> {
        self.bits.iter().map(|&b| to_f32(self.dtype, b)).collect()
    }
}

fn to_f32(dtype: Dtype, bits: u16) -> f32 {
    match dtype {
        Dtype::F16 => f16::from_bits(bits).to_f32(),
        Dtype::Bf16 => bf16::from_bits(bits).to_f32(),
    }
}

/// The smallest value of `dtype` that is >= `x` (x finite and >= 0), as bits.
///
/// Scales are rounded up, not to nearest, so that `|w| / s <= 7.5` still holds after the
/// rounding and the clamp to [-8, 7] never costs more than half a quantization step.
pub fn round_up(dtype: Dtype, x: f32) -> u16 {
    let (bits, back) = match dtype {
        Dtype::F16 => {
            let h = f16::from_f32(x);
            (h.to_bits(), h.to_f32())
        }
        Dtype::Bf16 => {
            let h = bf16::from_f32(x);
            (h.to_bits(), h.to_f32())
        }
    };
    // Positive finite values: the next representable value up is bits + 1.
    if back < x { bits + 1 } else { bits }
}
