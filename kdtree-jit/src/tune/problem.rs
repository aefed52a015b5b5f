//! One tuning problem's data: a random int4 weight, activations for the largest M, and the CPU
//! reference output, computed once for all M (the reference is batch-invariant, so the first m
//! rows of its output are the output for M = m).

use kdtree_quant::{Dtype, QuantizedWeight};

use super::error::Result;
use super::key::Shape;
use crate::w4a16::accuracy::RandomGemm;

pub struct Problem {
    pub shape: Shape,
    pub dtype: Dtype,
    pub weight: QuantizedWeight,
    /// Activations [m_max, K], bits of `dtype`.
    pub x: Vec<u16>,
    pub m_max: usize,
    /// The reference output [m_max, N] in f32, before rounding to `dtype`.
    reference: Vec<f32>,
}

impl Problem {
    /// [`RandomGemm::random`] for `m_max` rows, seeded: the data the kernels' own tests use.
    pub fn random(shape: Shape, group_size: u32, dtype: Dtype, m_max: usize, seed: u64) -> Result<Problem> {
        let (n, k) = (shape.n as usize, shape.k as usize);
        let p = RandomGemm::random(m_max, n, k, group_size as usize, dtype, seed)?;
        Ok(Problem { shape, dtype, weight: p.w, x: p.x, m_max, reference: p.reference })
    }

    /// The activations in f32 (exact).
    pub fn x_f32(&self) -> Vec<f32> {
        self.x.iter().map(|&b| from_bits(self.dtype, b)).collect()
    }

    /// The reference output for the first `m` rows, [m, N].
    pub fn reference(&self, m: usize) -> &[f32] {
        &self.reference[..m.min(self.m_max) * self.weight.n]
    }

    /// What one run must move at least: int4 weights, scales, activations in and output out.
    pub fn bytes(&self, m: usize) -> u64 {
        (self.weight.bytes() + 2 * m * (self.weight.k + self.weight.n)) as u64
    }
}

/// An f32 rounded to `dtype`, as bits.
pub fn to_bits(dtype: Dtype, v: f32) -> u16 {
    match dtype {
        Dtype::F16 => half::f16::from_f32(v).to_bits(),
        Dtype::Bf16 => half::bf16::from_f32(v).to_bits(),
    }
}

pub fn from_bits(dtype: Dtype, bits: u16) -> f32 {
    match dtype {
        Dtype::F16 => half::f16::from_bits(bits).to_f32(),
        Dtype::Bf16 => half::bf16::from_bits(bits).to_f32(),
    }
}
