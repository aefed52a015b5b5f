//! The dense W4A16 candidates on the GPU: one shape's device buffers, and the [`Runner`] that gates
//! and times variants on them. The weight is repacked and uploaded once per shape in each layout
//! its candidates read (the tiles' shared one, wgmma's).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use cudarc::driver::CudaSlice;

use super::error::{Result, TuneError};
use super::flush::Flusher;
use super::problem::{Problem, from_bits};
use super::search::Runner;
use crate::Gpu;
use crate::w4a16::GemmBuffers;
use crate::w4a16::dense::{DenseFamily, DenseKernel, DenseVariant, Layout};

/// One shape's inputs and outputs on the device, sized for the problem's largest M.
pub(crate) struct ShapeBuffers {
    x: CudaSlice<u16>,
    /// The weight in each layout a candidate reads: (packed, scales).
    weights: HashMap<Layout, (CudaSlice<u32>, CudaSlice<u16>)>,
    y: CudaSlice<u16>,
    workspace: CudaSlice<f32>,
    /// NaN in both f16 and bf16 (all bits set), written over Y before each gated run.
    poison: Vec<u16>,
}

impl ShapeBuffers {
    /// Uploads `problem` in the layout of `variants` (all of which must be for its group size and dtype).
    pub(crate) fn upload(gpu: &Gpu, problem: &Problem, variants: &[DenseVariant]) -> Result<ShapeBuffers> {
        let (n, m_max) = (problem.weight.n, problem.m_max);
        if variants.is_empty() {
            return Err(TuneError::Problem(format!("no variant for {}", problem.shape)));
        }
        let s = &gpu.stream;
        let mut weights = HashMap::new();
        for v in variants {
            if let Entry::Vacant(slot) = weights.entry(v.layout()) {
                let repacked = v.repack(&problem.weight)?;
                slot.insert((s.clone_htod(&repacked.packed)?, s.clone_htod(&repacked.scales)?));
            }
        }
        let workspace_len = variants.iter().map(|v| v.workspace_len(m_max, n)).max().unwrap_or(0);
        Ok(ShapeBuffers {
            x: s.clone_htod(&problem.x)?,
            weights,
            y: s.alloc_zeros(m_max * n)?,
            // Zeroed once: split-K variants keep their tile counters here and leave them at zero.
            workspace: s.alloc_zeros(workspace_len.max(1))?,
            poison: vec![u16::MAX; m_max * n],
        })
    }
}

/// Runs dense W4A16 variants on one (shape, M).
pub(crate) struct W4a16Runner<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) problem: &'a Problem,
    pub(crate) kernels: &'a HashMap<String, DenseKernel>,
    pub(crate) buffers: &'a mut ShapeBuffers,
    pub(crate) flusher: &'a mut Flusher,
    pub(crate) m: usize,
}

impl Runner for W4a16Runner<'_> {
    type Candidate = DenseVariant;

    fn name(&self, v: &DenseVariant) -> String {
        crate::Variant::name(v)
    }

    fn output(&mut self, v: &DenseVariant) -> Result<Vec<f32>> {
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

    fn tolerance(&self, v: &DenseVariant) -> f64 {
        v.tolerance()
    }

    fn prepare(&mut self, _: &DenseVariant) -> Result<()> {
        // Variants keep their split-K counters at different places of the shared workspace, where
        // others store partials: counters left nonzero would skip reductions and time too fast.
        // A correct run leaves its own counters at zero, so zeroing once before a variant's runs
        // is enough.
        Ok(self.gpu.stream.memset_zeros(&mut self.buffers.workspace)?)
    }

    fn launch(&mut self, v: &DenseVariant) -> Result<()> {
        let (n, k) = (self.problem.weight.n, self.problem.weight.k);
        let kernels: &HashMap<String, DenseKernel> = self.kernels;
        let name = crate::Variant::name(v);
        let kernel = kernels.get(&name).ok_or_else(|| TuneError::Problem(format!("{name} was not compiled")))?;
        let b = &mut *self.buffers;
        let (packed, scales) = b
            .weights
            .get(&v.layout())
            .ok_or_else(|| TuneError::Problem(format!("{name}: its weight layout was not uploaded")))?;
        let buffers =
            GemmBuffers { x: b.x.as_view(), packed, scales, y: b.y.as_view_mut(), workspace: &mut b.workspace };
        Ok(kernel.launch(self.gpu, self.m, n, k, buffers)?)
    }

    fn flush(&mut self) -> Result<()> {
        self.flusher.flush(&self.gpu.stream)
    }
}
