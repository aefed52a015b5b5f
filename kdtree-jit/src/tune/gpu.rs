//! The W4A16 candidates on the GPU: one shape's device buffers, and the [`Runner`] that gates and
//! times variants on them. All variants read one weight layout ([`w4a16::layout`]), so the weight
//! is repacked and uploaded once per shape.

use std::collections::HashMap;

use cudarc::driver::CudaSlice;

use super::error::{Result, TuneError};
use super::flush::Flusher;
use super::problem::{Problem, from_bits};
use super::search::Runner;
use crate::Gpu;
use crate::w4a16::{self, GemmBuffers, W4a16, W4a16Kernel};

/// One shape's inputs and outputs on the device, sized for the problem's largest M.
pub(crate) struct ShapeBuffers {
    x: CudaSlice<u16>,
    packed: CudaSlice<u32>,
    scales: CudaSlice<u16>,
    y: CudaSlice<u16>,
    workspace: CudaSlice<f32>,
    /// NaN in both f16 and bf16 (all bits set), written over Y before each gated run.
    poison: Vec<u16>,
}

impl ShapeBuffers {
    /// Uploads `problem` in the layout of `variants` (all of which must be for its group size and dtype).
    pub(crate) fn upload(gpu: &Gpu, problem: &Problem, variants: &[W4a16]) -> Result<ShapeBuffers> {
        let (n, m_max) = (problem.weight.n, problem.m_max);
        let first = variants.first().ok_or_else(|| TuneError::Problem(format!("no variant for {}", problem.shape)))?;
        let repacked = w4a16::repack(first, &problem.weight)?;
        let workspace_len = variants.iter().map(|v| w4a16::workspace_len(v, m_max, n)).max().unwrap_or(0);
        let s = &gpu.stream;
        Ok(ShapeBuffers {
            x: s.clone_htod(&problem.x)?,
            packed: s.clone_htod(&repacked.packed)?,
            scales: s.clone_htod(&repacked.scales)?,
            y: s.alloc_zeros(m_max * n)?,
            // Zeroed once: split-K variants keep their tile counters here and leave them at zero.
            workspace: s.alloc_zeros(workspace_len.max(1))?,
            poison: vec![u16::MAX; m_max * n],
        })
    }
}

/// Runs W4A16 variants on one (shape, M).
pub(crate) struct W4a16Runner<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) problem: &'a Problem,
    pub(crate) kernels: &'a HashMap<String, W4a16Kernel>,
    pub(crate) buffers: &'a mut ShapeBuffers,
    pub(crate) flusher: &'a mut Flusher,
    pub(crate) m: usize,
}

impl Runner for W4a16Runner<'_> {
    type Candidate = W4a16;

    fn name(&self, v: &W4a16) -> String {
        crate::Variant::name(v)
    }

    fn output(&mut self, v: &W4a16) -> Result<Vec<f32>> {
        // An output element the kernel does not write stays NaN and fails the gate (instead of
        // passing with the previous candidate's value).
        let stream = self.gpu.stream.clone();
        stream.memcpy_htod(&self.buffers.poison, &mut self.buffers.y)?;
        self.prepare(v)?;
        self.launch(v)?;
        let y = stream.clone_dtoh(&self.buffers.y)?;
        stream.synchronize()?;
        let len = self.m * self.problem.weight.n;
        Ok(y[..len].iter().map(|&b| from_bits(self.problem.dtype, b)).collect())
    }

    fn tolerance(&self, v: &W4a16) -> f64 {
        w4a16::tolerance(v)
    }

    fn prepare(&mut self, _: &W4a16) -> Result<()> {
        // Variants keep their split-K counters at different places of the shared workspace, where
        // others store partials: counters left nonzero would skip reductions and time too fast.
        // A correct run leaves its own counters at zero, so zeroing once before a variant's runs
        // is enough.
        Ok(self.gpu.stream.memset_zeros(&mut self.buffers.workspace)?)
    }

    fn launch(&mut self, v: &W4a16) -> Result<()> {
        let (n, k) = (self.problem.weight.n, self.problem.weight.k);
        let kernels: &HashMap<String, W4a16Kernel> = self.kernels;
        let name = crate::Variant::name(v);
        let kernel = kernels.get(&name).ok_or_else(|| TuneError::Problem(format!("{name} was not compiled")))?;
        let b = &mut *self.buffers;
        let buffers = GemmBuffers {
            x: b.x.as_view(),
            packed: &b.packed,
            scales: &b.scales,
            y: b.y.as_view_mut(),
            workspace: &mut b.workspace,
        };
        Ok(kernel.launch(self.gpu, self.m, n, k, buffers)?)
    }

    fn flush(&mut self) -> Result<()> {
        self.flusher.flush(&self.gpu.stream)
    }
}
