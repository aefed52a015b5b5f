//! Absorbed MLA on the GPU: kdtree-jit's MLA family (the tuned decode kernel and its fixed
//! companions) called in the engine's types.

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use super::{CudaBackend, CudaBatch};
use crate::cpu::CpuAbsorb;
use crate::error::{EngineError, Result};
use crate::registry::{Heads, HostLinear};

fn pending() -> EngineError {
    EngineError::BackendUnavailable { reason: "the MLA kernel family is not wired in yet".into() }
}

/// Entries `idx` of layer `layer`, widened to f32: `[idx.len(), width]`.
pub(super) fn gather(
    _k: &Kernels,
    _table: &CudaSlice<u64>,
    _h: Heads,
    _layer: usize,
    _idx: &CudaSlice<u32>,
) -> Result<CudaSlice<f32>> {
    Err(pending())
}

/// Writes `n` f32 entries `[n, width]` to layer `layer` at entries `at[0]..`.
pub(super) fn append_entries(
    _k: &Kernels,
    _table: &CudaSlice<u64>,
    _h: Heads,
    _layer: usize,
    _entries: &CudaSlice<f32>,
    _n: usize,
    _at: &CudaSlice<u32>,
) -> Result<()> {
    Err(pending())
}

/// A layer's `kv_b_proj` on the GPU in bf16, `[heads * (nope + v), latent]`.
pub struct CudaAbsorb {
    pub(super) w: CudaSlice<u16>,
}

impl CudaAbsorb {
    pub(super) fn upload(b: &CudaBackend, name: &str, kv_b: &HostLinear, h: Heads) -> Result<CudaAbsorb> {
        let f32s = CpuAbsorb::new(name, kv_b, h)?.0;
        let bits: Vec<u16> = f32s.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
        Ok(CudaAbsorb { w: b.stream().clone_htod(&bits)? })
    }
}

/// Writes the batch's entries `[latent | k_rope]` to layer `layer` at entries `past..`.
pub(super) fn append(
    _k: &Kernels,
    _table: &CudaSlice<u64>,
    _h: Heads,
    _layer: usize,
    _latent: &CudaSlice<f32>,
    _k_rope: &CudaSlice<f32>,
    _batch: &CudaBatch,
) -> Result<()> {
    Err(pending())
}

/// Absorbed attention of the batch's queries over layer `layer`: `out` is `[n, heads, v]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    _b: &CudaBackend,
    _q: &CudaSlice<f32>,
    _table: &CudaSlice<u64>,
    _h: Heads,
    _layer: usize,
    _batch: &CudaBatch,
    _kv_b: &CudaAbsorb,
    _out: &mut CudaSlice<f32>,
) -> Result<()> {
    Err(pending())
}
