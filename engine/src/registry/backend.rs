//! What an op runs on, and how the implementation of one (op, shape) is chosen.

use std::fmt;
use std::sync::Arc;

use crate::cuda::CudaBackend;

/// The device every op of a model runs on, chosen once at startup; every op keeps its CPU
/// implementation as the reference.
#[derive(Clone, Debug, Default)]
pub enum Backend {
    /// The deterministic, batch-invariant reference ops of [`crate::ops::cpu`].
    #[default]
    Cpu,
    /// W4A16 linears on a GPU with tuned kernels; the other ops on the CPU reference.
    Cuda(Arc<CudaBackend>),
}

/// Backends are equal when they are the same device: the CPU, or the same opened GPU.
impl PartialEq for Backend {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Backend::Cpu, Backend::Cpu) => true,
            (Backend::Cuda(a), Backend::Cuda(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backend::Cpu => f.write_str("cpu"),
            Backend::Cuda(c) => write!(f, "cuda ({}, {})", c.gpu().name, c.gpu().arch),
        }
    }
}

/// The ops of the registry, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpName {
    Linear,
    W4a16Linear,
    RmsNorm,
    Rope,
    Attention,
    SiluMul,
    Softmax,
    Argmax,
    Embedding,
}

impl OpName {
    pub const ALL: [OpName; 9] = [
        OpName::Linear,
        OpName::W4a16Linear,
        OpName::RmsNorm,
        OpName::Rope,
        OpName::Attention,
        OpName::SiluMul,
        OpName::Softmax,
        OpName::Argmax,
        OpName::Embedding,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OpName::Linear => "linear",
            OpName::W4a16Linear => "w4a16_linear",
            OpName::RmsNorm => "rmsnorm",
            OpName::Rope => "rope",
            OpName::Attention => "attention",
            OpName::SiluMul => "silu_mul",
            OpName::Softmax => "softmax",
            OpName::Argmax => "argmax",
            OpName::Embedding => "embedding",
        }
    }
}

impl fmt::Display for OpName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The problem an implementation is chosen for: the op and its GEMM-like sizes (rows `m`,
/// output features `n`, reduction `k`; ops without one of them put 0), plus the INT4 group size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShapeKey {
    pub op: OpName,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub group_size: usize,
}

/// One implementation of an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Impl {
    /// The CPU reference op.
    CpuReference,
    /// The GPU kernel the CUDA backend planned for the weight's shape at load (from the tuning DB;
    /// see [`crate::cuda::plan`]). Only W4A16 linears have one; a weight that was not uploaded runs
    /// the CPU reference.
    CudaKernel,
}

/// Overrides the implementation of one (op, shape) on a backend, per call (e.g. the CPU reference
/// for one shape while debugging a kernel). `None` leaves the backend's default. Which GPU kernel
/// variant a shape runs is not chosen here but at load, from the tuning DB, since kernels must be
/// compiled and weights uploaded before the first call (see [`crate::cuda`]).
pub trait ImplChooser: Send + Sync {
    fn choose(&self, backend: &Backend, key: &ShapeKey) -> Option<Impl>;
}

impl Backend {
    /// The implementation used when no chooser has an opinion.
    pub fn default_impl(&self, key: &ShapeKey) -> Impl {
        match (self, key.op) {
            (Backend::Cuda(_), OpName::W4a16Linear) => Impl::CudaKernel,
            _ => Impl::CpuReference,
        }
    }
}
