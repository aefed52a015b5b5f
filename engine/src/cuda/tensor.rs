//! The CUDA backend's activations and per-forward inputs.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::{EngineError, Result};
use crate::mask::TreeMask;

/// f32 rows on the GPU; `data` holds exactly `rows * cols` values.
pub struct CudaTensor {
    pub data: CudaSlice<f32>,
    pub rows: usize,
    pub cols: usize,
}

impl CudaTensor {
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One forward's inputs on the GPU, uploaded once and read by every layer.
pub struct CudaBatch {
    pub n: usize,
    pub tokens: CudaSlice<u32>,
    pub positions: CudaSlice<u32>,
    /// Visibility among the new tokens, `[n, words]` with `words = n.div_ceil(32)`: bit `b` of
    /// word `w` of row `i` is whether token `i` sees token `32 w + b`.
    pub mask: CudaSlice<u32>,
    /// One value: the cache's committed entries, after which the batch's are appended. On the device
    /// so that a recorded graph of the forward reads each replay's own.
    pub past: CudaSlice<u32>,
}

/// A forward's inputs on the host, in the layout of [`CudaBatch`].
pub(super) struct HostBatch {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    mask: Vec<u32>,
    past: u32,
}

impl HostBatch {
    pub(super) fn new(tokens: &[u32], positions: &[usize], mask: &TreeMask, past: usize) -> Result<HostBatch> {
        let over = |what: &str, v: usize| EngineError::InvalidArgument(format!("batch: {what} {v} is over u32"));
        let positions =
            positions.iter().map(|&p| u32::try_from(p).map_err(|_| over("position", p))).collect::<Result<_>>()?;
        Ok(HostBatch {
            tokens: tokens.to_vec(),
            positions,
            mask: kdtree_kernels::mask_words(mask.len(), |i, j| mask.visible(i, j)),
            past: u32::try_from(past).map_err(|_| over("cache length", past))?,
        })
    }

    pub(super) fn upload(&self, s: &Arc<CudaStream>) -> Result<CudaBatch> {
        Ok(CudaBatch {
            n: self.tokens.len(),
            tokens: s.clone_htod(&self.tokens)?,
            positions: s.clone_htod(&self.positions)?,
            mask: s.clone_htod(&self.mask)?,
            past: s.clone_htod(&[self.past])?,
        })
    }

    /// Overwrites `batch`, a batch of as many tokens, with these inputs.
    pub(super) fn write(&self, s: &Arc<CudaStream>, batch: &mut CudaBatch) -> Result<()> {
        if batch.n != self.tokens.len() {
            return Err(EngineError::InvalidArgument(format!(
                "batch: {} tokens written over a batch of {}",
                self.tokens.len(),
                batch.n
            )));
        }
        s.memcpy_htod(&self.tokens, &mut batch.tokens)?;
        s.memcpy_htod(&self.positions, &mut batch.positions)?;
        s.memcpy_htod(&self.mask, &mut batch.mask)?;
        s.memcpy_htod(&[self.past], &mut batch.past)?;
        Ok(())
    }
}
