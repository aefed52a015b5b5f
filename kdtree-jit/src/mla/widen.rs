//! Attention of many rows over an FP8 cache. The FP8 decode variants widen each tile they read, so
//! a launch of n rows widens the cache n times (a block is one row's heads). From [`WIDE_ROWS`]
//! rows, the layer is widened once into bf16 pages ([`AuxKernel::widen`]) and the variant's
//! `twin` runs over them: the same point of the space, so the same arithmetic in the same order
//! and the same bits over the values the FP8 entries hold. The engine launches through [`launch`],
//! and the tuner times what the engine runs.

use cudarc::driver::{CudaSlice, CudaView, DevicePtr};

use crate::mla::{AuxKernel, MlaBuffers, MlaDecode, MlaKernel, MlaKv, MlaShape, PagedCache};
use crate::{Arch, Gpu, Result, Target, Variant};

/// Rows from which widening once beats the FP8 variant: on an H100 at K2's sizes 1.06x (32768
/// entries) and 1.11x (131072) at 8 rows, 0.96x and 0.94x at 4.
pub const WIDE_ROWS: usize = 8;

/// The bf16 variant at `v`'s point.
pub(crate) fn twin(v: &MlaDecode) -> MlaDecode {
    MlaDecode { kv: MlaKv::Bf16, ..*v }
}

/// The twin an FP8 variant widens for on `arch`: `None` for a bf16 variant, or a twin `arch`
/// cannot run (that variant then reads its FP8 tiles at every row count).
pub fn twin_on(v: &MlaDecode, arch: Arch) -> Option<MlaDecode> {
    let t = twin(v);
    (v.kv == MlaKv::Fp8 && t.check(&Target { arch }).is_ok()).then_some(t)
}

/// The bf16 twin, the FP8 aux kernels and the bf16 pages (one layer, `b.cache`'s page size) a
/// launch of many rows widens into.
pub struct Widening<'a> {
    pub twin: &'a MlaKernel,
    pub aux: &'a AuxKernel,
    pub pages: CudaView<'a, u64>,
}

/// `decode` over `n` rows of `b`, as the engine runs it: with `wide` and at least [`WIDE_ROWS`]
/// rows, the layer widened into `wide.pages` and the twin over them; otherwise `decode` itself.
pub fn launch(
    gpu: &Gpu,
    s: &MlaShape,
    n: usize,
    decode: &MlaKernel,
    wide: Option<Widening>,
    b: MlaBuffers,
) -> Result<()> {
    match wide {
        Some(Widening { twin, aux, pages }) if n >= WIDE_ROWS => {
            aux.widen(gpu, s, n, &b.cache, &b.past, &pages)?;
            let cache = PagedCache { table: pages, page: b.cache.page, layer: 0 };
            twin.launch(gpu, s, n, MlaBuffers { cache, ..b })
        }
        _ => decode.launch(gpu, s, n, b),
    }
}

/// Zeroed bf16 pages for `entries` entries of `width` values, `page` entries a page, in order, and
/// their table: room to widen one layer into.
pub fn bf16_pages(gpu: &Gpu, entries: usize, page: usize, width: usize) -> Result<(CudaSlice<u16>, CudaSlice<u64>)> {
    let pages = entries.div_ceil(page.max(1)).max(1);
    let values = gpu.stream.alloc_zeros::<u16>(pages * page * width)?;
    let base = values.device_ptr(&gpu.stream).0;
    let addresses: Vec<u64> = (0..pages).map(|p| base + (2 * p * page * width) as u64).collect();
    let table = gpu.stream.clone_htod(&addresses)?;
    Ok((values, table))
}
