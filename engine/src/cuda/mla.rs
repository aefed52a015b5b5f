//! Absorbed MLA on the GPU: kdtree-jit's MLA family (the decode kernel and its fixed companions)
//! called in the engine's types. A forward's attention is three launches a layer and a split
//! combine: absorb (`q_nope · W_UK`, bf16), attention over the paged latent cache (bf16 or FP8
//! entries), unabsorb (`W_UV`). An f32 model's cache and attention are f32 ([`super::mla_f32`]);
//! [`LatentKernels`] picks by the cache's dtype.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;
use kdtree_jit::mla::widen::{self, Widening};
use kdtree_jit::mla::{
    AuxKernel, Companions, MlaAux, MlaBuffers, MlaDecode, MlaKernel, MlaShape, PagedCache, shape_error,
};
use kdtree_jit::{Cache, Gpu};

use super::mla_f32::MlaF32Kernels;
use super::{CudaBackend, CudaBatch};
use crate::cpu::CpuAbsorb;
use crate::error::{EngineError, Result};
use crate::registry::{Backend, ComputeDtype, Heads, HostLinear, KvDtype};

/// Tokens a page holds: a multiple of every MLA variant's key tile.
pub(crate) const PAGE_TOKENS: usize = 64;
/// The most bytes of split partials one attention launch writes: rows run in slices that fit
/// (K2: 31 rows of 64 heads x 64 splits), so a 1024-token prompt chunk costs no more than a tree.
const WORKSPACE_BYTES: usize = 256 << 20;

/// The MLA kernels of one GPU over one kind of cache: the decode variant and the aux kernels that
/// write and read its entries.
pub(crate) struct MlaKernels {
    pub(super) gpu: Gpu,
    decode: MlaKernel,
    pub(super) aux: AuxKernel,
    /// An FP8 variant's bf16 twin ([`widen::twin`]), for launches of [`widen::WIDE_ROWS`] rows or
    /// more over a widened layer; `None` for a bf16 cache, or a twin the GPU cannot run. A cache over
    /// these kernels keeps bf16 pages for one layer ([`super::CudaKv`]).
    twin: Option<MlaKernel>,
}

impl std::fmt::Debug for MlaKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlaKernels").field("decode", &self.decode.variant()).finish()
    }
}

fn unsupported(h: Heads, reason: String) -> EngineError {
    EngineError::NoKernel { shape: format!("MLA {h:?}"), reason }
}

impl MlaKernels {
    /// Compiles (through the cubin cache) and loads `decode` and the aux kernels of its cache for
    /// `gpu`, and an FP8 variant's bf16 twin when `widening` and the GPU runs it.
    pub(super) fn load(gpu: &Gpu, decode: MlaDecode, widening: bool, cache: Option<&Cache>) -> Result<MlaKernels> {
        let twin = match widen::twin_on(&decode, gpu.arch).filter(|_| widening) {
            Some(twin) => Some(MlaKernel::compile(gpu, twin, cache)?),
            None => None,
        };
        Ok(MlaKernels {
            gpu: gpu.clone(),
            decode: MlaKernel::compile(gpu, decode, cache)?,
            aux: AuxKernel::compile(gpu, MlaAux::beside(&decode), cache)?,
            twin,
        })
    }

    pub(crate) fn variant(&self) -> &MlaDecode {
        self.decode.variant()
    }

    /// Whether attention of many rows widens the layer first: a cache over these kernels then
    /// needs bf16 pages for one layer.
    pub(crate) fn widens(&self) -> bool {
        self.twin.is_some()
    }

    /// Absorbed attention of the batch's queries `q` (`[n, heads, nope + rope]` f32, rope applied)
    /// over layer `layer`, whose entries for the batch are written: `out` is `[n, heads, v]` f32.
    /// `wide` addresses the cache's bf16 pages when [`Self::widens`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        b: &CudaBackend,
        q: &CudaSlice<f32>,
        table: &CudaSlice<u64>,
        wide: Option<&CudaSlice<u64>>,
        h: Heads,
        layer: usize,
        batch: &CudaBatch,
        kv_b: &CudaSlice<u16>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (s, n, gpu) = (h.mla, batch.n, &self.gpu);
        let mut q_lat = b.output::<u16>(n * s.heads * s.width())?;
        self.aux.absorb(gpu, &s, n, &q.as_view(), &kv_b.as_view(), &mut q_lat.as_view_mut())?;
        let row = self.variant().workspace_len(1, s.heads, s.latent);
        let rows = (WORKSPACE_BYTES / 4 / row).clamp(1, n.max(1));
        let mut workspace = b.output::<f32>(rows * row)?;
        let mut o_lat = b.output::<f32>(n * s.heads * s.latent)?;
        let buffers = MlaBuffers {
            q: q_lat.as_view(),
            cache: PagedCache { table: table.as_view(), page: PAGE_TOKENS, layer },
            past: batch.past.as_view(),
            mask: batch.device_mask(),
            workspace: workspace.as_view_mut(),
            o_lat: o_lat.as_view_mut(),
        };
        let wide = match (&self.twin, wide) {
            (Some(twin), Some(pages)) => Some(Widening { twin, aux: &self.aux, pages: pages.as_view() }),
            _ => None,
        };
        widen::launch(gpu, &s, n, &self.decode, wide, buffers)?;
        self.aux.unabsorb(gpu, &s, n, &o_lat.as_view(), &kv_b.as_view(), &mut out.as_view_mut())?;
        Ok(())
    }
}

/// A layer's `kv_b_proj` on the GPU, `[heads * (nope + v), latent]`, in the dtype the kernels of the
/// model's KV cache read: bf16 for the tensor-core family (bf16 and FP8 caches), f32 for f32.
pub enum CudaAbsorb {
    Bf16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

impl CudaAbsorb {
    /// Uploads `kv_b` in `h.kv`'s dtype (bf16: rounded, exact from a bf16 checkpoint), after checking
    /// that the MLA kernels take these head sizes.
    pub(super) fn upload(b: &CudaBackend, name: &str, kv_b: &HostLinear, h: Heads) -> Result<CudaAbsorb> {
        check_shape(h)?;
        let f32s = CpuAbsorb::new(name, kv_b, h)?.0;
        Ok(match h.kv {
            KvDtype::F32 => CudaAbsorb::F32(b.stream().clone_htod(&f32s)?),
            KvDtype::Bf16 | KvDtype::Fp8 => {
                let bits: Vec<u16> = f32s.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
                CudaAbsorb::Bf16(b.stream().clone_htod(&bits)?)
            }
        })
    }

    /// The dtype the weight is held in: the compute dtype of the model it was uploaded for (f32, or
    /// bf16 for a 16-bit one, whose caches, bf16 or fp8, read it in bf16).
    pub(crate) fn dtype(&self) -> ComputeDtype {
        match self {
            CudaAbsorb::Bf16(_) => ComputeDtype::Bf16,
            CudaAbsorb::F32(_) => ComputeDtype::F32,
        }
    }
}

/// The kernels that write, read and attend over a cache of one KV dtype: the tensor-core family
/// (bf16 or FP8 entries, as its variant says) or the f32 one.
#[derive(Clone, Debug)]
pub(crate) enum LatentKernels {
    TensorCore(Arc<MlaKernels>),
    F32(Arc<MlaF32Kernels>),
}

impl LatentKernels {
    /// Whether attention of many rows widens the layer to bf16 pages of the cache first
    /// ([`MlaKernels::widens`]).
    pub(crate) fn widens(&self) -> bool {
        matches!(self, LatentKernels::TensorCore(k) if k.widens())
    }

    /// Entries `idx` of layer `layer`, as f32 (exact): `[idx.len(), width]`.
    pub(super) fn gather(
        &self,
        table: &CudaSlice<u64>,
        h: Heads,
        layer: usize,
        idx: &CudaSlice<u32>,
    ) -> Result<CudaSlice<f32>> {
        match self {
            LatentKernels::TensorCore(k) => gather(&k.gpu, &k.aux, table, h, layer, idx),
            LatentKernels::F32(k) => gather(&k.gpu, &k.kernel, table, h, layer, idx),
        }
    }

    /// Writes `n` entries `[latent | k_rope]` (f32, stored in the cache's dtype) to layer `layer` at
    /// entries `at[0]..`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn append(
        &self,
        table: &CudaSlice<u64>,
        h: Heads,
        layer: usize,
        latent: &CudaSlice<f32>,
        k_rope: &CudaSlice<f32>,
        n: usize,
        at: &CudaSlice<u32>,
    ) -> Result<()> {
        let cache = PagedCache { table: table.as_view(), page: PAGE_TOKENS, layer };
        let (latent, k_rope, at) = (latent.as_view(), k_rope.as_view(), at.as_view());
        Ok(match self {
            LatentKernels::TensorCore(k) => k.aux.append(&k.gpu, &h.mla, n, &latent, &k_rope, &cache, &at),
            LatentKernels::F32(k) => k.kernel.append(&k.gpu, &h.mla, n, &latent, &k_rope, &cache, &at),
        }?)
    }

    /// Writes `n` f32 entries `[n, width]` (from [`Self::gather`]) to layer `layer` at entries
    /// `at[0]..`: their columns split into latent and rope, then appended.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn append_entries(
        &self,
        k: &Kernels,
        table: &CudaSlice<u64>,
        h: Heads,
        layer: usize,
        entries: &CudaSlice<f32>,
        n: usize,
        at: &CudaSlice<u32>,
    ) -> Result<()> {
        let s = k.stream();
        let (mut latent, mut k_rope) = (s.alloc_zeros::<f32>(n * h.mla.latent)?, s.alloc_zeros::<f32>(n * h.mla.rope)?);
        kdtree_kernels::copy_cols(k, entries, h.width(), 0, h.mla.latent, &mut latent)?;
        kdtree_kernels::copy_cols(k, entries, h.width(), h.mla.latent, h.mla.rope, &mut k_rope)?;
        self.append(table, h, layer, &latent, &k_rope, n, at)
    }

    /// Absorbed attention of the batch's queries `q` over layer `layer` with `kv_b`, which must be of
    /// this cache's dtype: `out` is `[n, heads, v]` f32. `wide` addresses the cache's bf16 pages
    /// when [`Self::widens`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        b: &CudaBackend,
        q: &CudaSlice<f32>,
        table: &CudaSlice<u64>,
        wide: Option<&CudaSlice<u64>>,
        h: Heads,
        layer: usize,
        batch: &CudaBatch,
        kv_b: &CudaAbsorb,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        match (self, kv_b) {
            (LatentKernels::TensorCore(k), CudaAbsorb::Bf16(w)) => {
                k.attention(b, q, table, wide, h, layer, batch, w, out)
            }
            (LatentKernels::F32(k), CudaAbsorb::F32(w)) => k.attention(b, q, table, h, layer, batch, w, out),
            _ => Err(EngineError::KvDtype {
                backend: b.describe(),
                compute: kv_b.dtype(),
                kv: h.kv,
                reason: super::KV_FOLLOWS_COMPUTE.into(),
            }),
        }
    }
}

/// Entries `idx` of layer `layer` through `k`, as f32 (exact): `[idx.len(), width]`.
fn gather<K: Companions>(
    gpu: &Gpu,
    k: &K,
    table: &CudaSlice<u64>,
    h: Heads,
    layer: usize,
    idx: &CudaSlice<u32>,
) -> Result<CudaSlice<f32>> {
    let mut out = gpu.stream.alloc_zeros::<f32>((idx.len() * h.width()).max(1))?;
    let cache = PagedCache { table: table.as_view(), page: PAGE_TOKENS, layer };
    k.gather(gpu, &h.mla, &idx.as_view(), &cache, &mut out.as_view_mut())?;
    Ok(out)
}

/// Why the MLA kernels cannot run `h`, as an error before any weight is uploaded.
pub(super) fn check_shape(h: Heads) -> Result<()> {
    let s: MlaShape = h.mla;
    if let Some(reason) = shape_error(&s) {
        return Err(unsupported(h, reason));
    }
    if s.nope > kdtree_jit::mla::aux::MAX_NOPE {
        return Err(unsupported(h, format!("qk_nope_head_dim {} over {}", s.nope, kdtree_jit::mla::aux::MAX_NOPE)));
    }
    Ok(())
}
