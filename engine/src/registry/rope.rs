//! Rotary embedding as the backends take it: the host's cos/sin tables, the same tables on a backend,
//! and which columns of each head [`Backend::rope`] rotates.

use super::Backend;
use crate::error::Result;

/// How the rotary part of a head is laid out (config `rope_interleave`): one type for the CPU
/// reference and the GPU rope kernel.
pub use kdtree_kernels::RopeLayout;

/// Which columns of each head [`Backend::rope`] rotates: heads of `stride` columns, columns
/// `offset..offset + dim` of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeSpan {
    pub stride: usize,
    pub offset: usize,
    pub dim: usize,
    pub layout: RopeLayout,
}

/// cos/sin tables, `[max_pos, half]` each, `half = head_dim / 2`.
#[derive(Clone, Debug)]
pub struct RopeTable {
    pub half: usize,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// Tables for positions `0..max_pos`, angles computed in f64, each multiplied by `mscale`
    /// (YaRN's cos/sin factor; 1 without scaling).
    pub fn new(inv_freq: &[f64], max_pos: usize, mscale: f64) -> Self {
        let half = inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(max_pos * half), Vec::with_capacity(max_pos * half));
        for p in 0..max_pos {
            for &f in inv_freq {
                let angle = p as f64 * f;
                cos.push((angle.cos() * mscale) as f32);
                sin.push((angle.sin() * mscale) as f32);
            }
        }
        Self { half, cos, sin }
    }

    pub(crate) fn max_positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }
}

/// The rotary tables of a model on its backend.
pub(crate) struct Rope<B: Backend> {
    pub cos: B::Vector,
    pub sin: B::Vector,
    pub max_positions: usize,
}

impl<B: Backend> Rope<B> {
    pub(crate) fn new(backend: &B, table: &RopeTable) -> Result<Self> {
        Ok(Self {
            cos: backend.vector(&table.cos)?,
            sin: backend.vector(&table.sin)?,
            max_positions: table.max_positions(),
        })
    }
}
