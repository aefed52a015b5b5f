//! Dense 16-bit linears of a few rows on kdtree-jit's streamed family ([`kdtree_jit::dense16`]),
//! where the tuning DB holds a variant for the weight's shape that beat cuBLAS there; cuBLAS
//! otherwise, and for forwards of more than [`MAX_STREAMED_ROWS`] rows (prefill chunks).
//!
//! Exactness: a streamed variant computes a row from its own row of X (its K split depends on K
//! and the variant alone), so one variant per shape for every forward of up to
//! [`MAX_STREAMED_ROWS`] rows keeps decode steps and DDTree's trees bit-identical row for row, as
//! cuBLAS's padded 128-row chunks did. Exact mode asks the DB at its M's bucket and uses the family
//! only when that M is at most [`MAX_STREAMED_ROWS`] (a larger tree would straddle both paths);
//! fast mode asks at M = 1, a decode step. Both paths sum exact products in f32, in different
//! orders: switching changes a logit's last bits, as a tuning DB change does for W4A16.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use kdtree_jit::dense16::{Dense16, Dense16Buffers, Dense16Kernel};
use kdtree_jit::tune::dense16::tuned_variant;
use kdtree_jit::tune::key::Shape;

use super::CudaBackend;
use super::select::Mode;
use crate::error::{EngineError, Result};
use crate::model::DenseShape;

/// The most rows a forward may have and run on the streamed family; the most DDTree verifies.
pub const MAX_STREAMED_ROWS: usize = 128;

/// The M whose DB entry picks a shape's variant in `mode`: exact mode's own, where the family may
/// run it; a decode step's in fast mode.
pub(crate) fn planned_m(mode: Mode) -> Option<usize> {
    match mode {
        Mode::Exact { m } if m <= MAX_STREAMED_ROWS => Some(m),
        Mode::Exact { .. } => None,
        Mode::Fast => Some(1),
    }
}

/// The streamed variant for `shape` in `mode`, if the DB has one that beat cuBLAS at the M asked.
pub(crate) fn choose(b: &CudaBackend, shape: DenseShape, mode: Mode) -> Option<Dense16> {
    let m = planned_m(mode)?;
    let (n, k) = (u32::try_from(shape.n).ok()?, u32::try_from(shape.k).ok()?);
    let v = tuned_variant(&b.tuning.db, &b.tuning.env, b.gpu.arch, Shape { n, k }, shape.dtype, m as u32)?;
    v.unsupported(1, shape.n, shape.k).is_none().then_some(v)
}

/// `Y = X · Wᵀ` of `m` rows (at most [`MAX_STREAMED_ROWS`]) of 16-bit `x` by `kernel`, in blocks of
/// its rows, into f32.
pub(super) fn forward(
    b: &CudaBackend,
    kernel: &Dense16Kernel,
    x: &CudaSlice<u16>,
    w: &CudaSlice<u16>,
    (m, n, k): (usize, usize, usize),
) -> Result<CudaSlice<f32>> {
    if m > MAX_STREAMED_ROWS {
        let limit = format!("the streamed family runs at most {MAX_STREAMED_ROWS}");
        return Err(EngineError::ArgumentOutOfRange {
            what: "a streamed linear's rows".into(),
            value: m as u64,
            limit,
        });
    }
    let rows = kernel.variant().rows as usize;
    let mut y = b.output::<f32>(m * n)?;
    // Zeroed: split-K's tile counters start at zero and are left there, for every block of rows.
    let len = kernel.variant().workspace_len(rows.min(m), n);
    let mut workspace = if len == 0 { b.output::<f32>(1)? } else { b.stream().alloc_zeros::<f32>(len)? };
    for start in (0..m).step_by(rows) {
        let r = rows.min(m - start);
        let buffers = Dense16Buffers {
            x: x.slice(start * k..(start + r) * k),
            w: w.as_view(),
            y: y.slice_mut(start * n..(start + r) * n),
            workspace: workspace.as_view_mut(),
        };
        kernel.launch(b.gpu(), (r, n, k), buffers)?;
    }
    Ok(y)
}

impl CudaBackend {
    /// The streamed kernel of `shape`, chosen ([`choose`]) and compiled the first time a weight of
    /// that shape is loaded; `None` where cuBLAS runs it.
    pub(super) fn streamed_kernel(&self, shape: DenseShape) -> Result<Option<Arc<Dense16Kernel>>> {
        let mut shapes = self.weights.streamed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(k) = shapes.get(&shape) {
            return Ok(k.clone());
        }
        let kernel = match choose(self, shape, self.tuning.mode) {
            Some(v) => Some(Arc::new(Dense16Kernel::compile(&self.gpu, v, self.tuning.cubins.as_ref())?)),
            None => None,
        };
        shapes.insert(shape, kernel.clone());
        Ok(kernel)
    }

    /// Every dense weight shape loaded so far and the streamed variant it runs (`None`: cuBLAS).
    pub fn streamed_plans(&self) -> Vec<(DenseShape, Option<Dense16>)> {
        let shapes = self.weights.streamed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        shapes.iter().map(|(s, k)| (*s, k.as_ref().map(|k| *k.variant()))).collect()
    }
}
