//! Absorbed MLA of an f32 model on the GPU: kdtree-jit's f32 family ([`MlaF32Kernel`]) in the
//! engine's types. The same three steps as the bf16 family ([`super::mla`]), absorb, attention over
//! the paged latent cache, unabsorb, with the queries, `kv_b_proj`'s weight and the cache in f32: an
//! f32 checkpoint's attention rounds nothing to 16 bits.

use cudarc::driver::CudaSlice;
use kdtree_jit::mla::{Companions, PagedCache};
use kdtree_jit::mla_f32::{MlaF32, MlaF32Kernel};
use kdtree_jit::{Cache, Gpu, Target};

use super::mla::PAGE_TOKENS;
use super::{CudaBackend, CudaBatch};
use crate::error::Result;
use crate::registry::Heads;

/// The f32 MLA kernels of one GPU.
pub(crate) struct MlaF32Kernels {
    pub(super) gpu: Gpu,
    pub(super) kernel: MlaF32Kernel,
}

impl std::fmt::Debug for MlaF32Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlaF32Kernels").field("variant", self.kernel.variant()).finish()
    }
}

impl MlaF32Kernels {
    /// Compiles (through the cubin cache) and loads the f32 family for `gpu`.
    pub(super) fn load(gpu: &Gpu, cache: Option<&Cache>) -> Result<MlaF32Kernels> {
        let variant = MlaF32::default_for(&Target { arch: gpu.arch });
        Ok(MlaF32Kernels { gpu: gpu.clone(), kernel: MlaF32Kernel::compile(gpu, variant, cache)? })
    }

    pub(crate) fn variant(&self) -> &MlaF32 {
        self.kernel.variant()
    }

    /// Absorbed attention of the batch's queries `q` (`[n, heads, nope + rope]` f32, rope applied) over
    /// layer `layer`, whose entries for the batch are written, with `kv_b` f32: `out` is `[n, heads, v]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        b: &CudaBackend,
        q: &CudaSlice<f32>,
        table: &CudaSlice<u64>,
        h: Heads,
        layer: usize,
        batch: &CudaBatch,
        kv_b: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (s, n, gpu) = (h.mla, batch.n, &self.gpu);
        let mut q_lat = b.output::<f32>(n * s.heads * s.width())?;
        self.kernel.absorb(gpu, &s, n, &q.as_view(), &kv_b.as_view(), &mut q_lat.as_view_mut())?;
        let mut o_lat = b.output::<f32>(n * s.heads * s.latent)?;
        let mask = batch.device_mask();
        let cache = PagedCache { table: table.as_view(), page: PAGE_TOKENS, layer };
        let (past, q_lat) = (batch.past.as_view(), q_lat.as_view());
        self.kernel.attention(gpu, &s, n, &q_lat, &cache, &past, &mask, &mut o_lat.as_view_mut())?;
        self.kernel.unabsorb(gpu, &s, n, &o_lat.as_view(), &kv_b.as_view(), &mut out.as_view_mut())?;
        Ok(())
    }
}
