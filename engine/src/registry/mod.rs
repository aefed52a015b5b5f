//! The op registry: every op the model calls, by name, with typed arguments. A [`Backend`] is
//! chosen at startup; for each (op, shape) an optional [`ImplChooser`] may override the
//! implementation, otherwise the backend's default runs. Every op has its CPU reference
//! implementation; the W4A16 linear also has the CUDA backend's tuned kernels
//! ([`Impl::CudaKernel`]). The other ops have no GPU implementation yet: whatever is chosen, the
//! CPU reference runs them.

mod backend;
mod linear;
mod startup;

use std::sync::Arc;

pub use backend::{Backend, Impl, ImplChooser, OpName, ShapeKey};
pub use linear::LinearWeight;
pub use startup::{BackendKind, Selection, select};

use kdtree_quant::QuantizedWeight;

use crate::cuda::CudaLinear;
use crate::error::Result;
use crate::mask::TreeMask;
use crate::ops::cpu::{self, AttentionShape, RopeTable};

/// How the rotary part of a head is laid out (config `rope_interleave`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs, DeepSeek-V3's layout.
    Interleaved,
    /// `(x[i], x[i + d/2])` pairs.
    HalfSplit,
}

#[derive(Clone, Default)]
pub struct OpRegistry {
    backend: Backend,
    chooser: Option<Arc<dyn ImplChooser>>,
}

impl std::fmt::Debug for OpRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpRegistry").field("backend", &self.backend).field("chooser", &self.chooser.is_some()).finish()
    }
}

impl OpRegistry {
    pub fn new(backend: Backend) -> Self {
        Self { backend, chooser: None }
    }

    /// Lets `chooser` pick per-(op, shape) implementations.
    pub fn with_chooser(mut self, chooser: Arc<dyn ImplChooser>) -> Self {
        self.chooser = Some(chooser);
        self
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The implementation that runs `key`.
    pub fn choose(&self, key: &ShapeKey) -> Impl {
        self.chooser
            .as_ref()
            .and_then(|c| c.choose(&self.backend, key))
            .unwrap_or_else(|| self.backend.default_impl(key))
    }

    fn pick(&self, op: OpName, m: usize, n: usize, k: usize) -> Impl {
        self.choose(&ShapeKey { op, m, n, k, group_size: 0 })
    }

    /// `y[m, n] = x[m, k] · Wᵀ`, dispatched on how the weight is stored.
    pub fn linear(&self, x: &[f32], m: usize, w: &LinearWeight) -> Result<Vec<f32>> {
        match w {
            LinearWeight::Dense { n, k, w } => match self.pick(OpName::Linear, m, *n, *k) {
                Impl::CpuReference | Impl::CudaKernel => cpu::linear(x, m, w, *n),
            },
            LinearWeight::W4a16(q) => self.w4a16_linear(x, m, q, None),
            LinearWeight::Cuda(d) => self.w4a16_linear(x, m, &d.host, Some(d)),
        }
    }

    /// The W4A16 linear: the GPU kernel when chosen and the weight is on the GPU, else the CPU reference.
    fn w4a16_linear(&self, x: &[f32], m: usize, q: &QuantizedWeight, gpu: Option<&CudaLinear>) -> Result<Vec<f32>> {
        let key = ShapeKey { op: OpName::W4a16Linear, m, n: q.n, k: q.k, group_size: q.group_size };
        match (self.choose(&key), gpu) {
            (Impl::CudaKernel, Some(d)) => d.forward(x, m),
            (Impl::CudaKernel, None) | (Impl::CpuReference, _) => cpu::w4a16_linear(x, m, q),
        }
    }

    /// Row-wise RMSNorm with rows of `weight.len()`.
    pub fn rmsnorm(&self, x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        match self.pick(OpName::RmsNorm, x.len() / weight.len().max(1), weight.len(), 0) {
            Impl::CpuReference | Impl::CudaKernel => cpu::rmsnorm(x, weight, eps, &mut out),
        }
        out
    }

    /// Rotates `x` (`[positions.len(), heads, head_dim]`) in place.
    pub fn rope(&self, x: &mut [f32], head_dim: usize, positions: &[usize], table: &RopeTable, layout: RopeLayout) {
        match (self.pick(OpName::Rope, positions.len(), x.len() / positions.len().max(1), head_dim), layout) {
            (Impl::CpuReference | Impl::CudaKernel, RopeLayout::Interleaved) => {
                cpu::rope_interleaved(x, head_dim, positions, &table.cos, &table.sin)
            }
            (Impl::CpuReference | Impl::CudaKernel, RopeLayout::HalfSplit) => {
                cpu::rope_half_split(x, head_dim, positions, &table.cos, &table.sin)
            }
        }
    }

    /// Masked attention over the cache; see [`cpu::attention`].
    pub fn attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        past: usize,
        mask: &TreeMask,
        shape: AttentionShape,
    ) -> Vec<f32> {
        match self.pick(OpName::Attention, mask.len(), shape.heads * shape.v_dim, past + mask.len()) {
            Impl::CpuReference | Impl::CudaKernel => cpu::attention(q, k, v, past, mask, shape),
        }
    }

    /// `silu(gate) * up`.
    pub fn silu_mul(&self, gate: &[f32], up: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; gate.len()];
        match self.pick(OpName::SiluMul, 0, gate.len(), 0) {
            Impl::CpuReference | Impl::CudaKernel => cpu::silu_mul(gate, up, &mut out),
        }
        out
    }

    /// Row-wise softmax in place.
    pub fn softmax(&self, x: &mut [f32], cols: usize) {
        match self.pick(OpName::Softmax, x.len() / cols.max(1), cols, 0) {
            Impl::CpuReference | Impl::CudaKernel => cpu::softmax(x, cols),
        }
    }

    /// Row-wise argmax, ties to the lowest index.
    pub fn argmax(&self, x: &[f32], cols: usize) -> Vec<u32> {
        match self.pick(OpName::Argmax, x.len() / cols.max(1), cols, 0) {
            Impl::CpuReference | Impl::CudaKernel => cpu::argmax(x, cols),
        }
    }

    /// Rows of `table` (`[vocab, dim]`) for `ids`.
    pub fn embedding(&self, table: &[f32], dim: usize, ids: &[u32]) -> Result<Vec<f32>> {
        let mut out = vec![0f32; ids.len() * dim];
        match self.pick(OpName::Embedding, ids.len(), dim, 0) {
            Impl::CpuReference | Impl::CudaKernel => cpu::embedding(table, dim, ids, &mut out)?,
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chooser that records what it was asked.
    struct Recorder(std::sync::Mutex<Vec<ShapeKey>>);

    impl ImplChooser for Recorder {
        fn choose(&self, _: &Backend, key: &ShapeKey) -> Option<Impl> {
            self.0.lock().unwrap().push(*key);
            None
        }
    }

    #[test]
    fn linear_dispatches_on_the_stored_weight_and_consults_the_chooser_per_shape() {
        let w: Vec<f32> = (0..4 * 32).map(|i| (i % 11) as f32 / 4.0 - 1.0).collect();
        let q = kdtree_quant::QuantizedWeight::quantize(&w, 4, 32, 32, kdtree_quant::Dtype::Bf16).unwrap();
        let recorder = Arc::new(Recorder(Default::default()));
        let reg = OpRegistry::new(Backend::Cpu).with_chooser(recorder.clone());
        let x = vec![0.5f32; 2 * 32];
        let int4 = LinearWeight::W4a16(q);
        assert_eq!(reg.linear(&x, 2, &int4).unwrap(), reg.linear(&x, 2, &int4.dequantized()).unwrap());
        let asked = recorder.0.lock().unwrap().clone();
        assert_eq!(asked[0], ShapeKey { op: OpName::W4a16Linear, m: 2, n: 4, k: 32, group_size: 32 });
        assert_eq!(asked[1], ShapeKey { op: OpName::Linear, m: 2, n: 4, k: 32, group_size: 0 });
    }
}
