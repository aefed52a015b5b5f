//! Host round trips of the [`MlaF32Kernel`] entries, for the GPU tests that check them against the CPU
//! reference ([`crate::mla::reference`]).

use cudarc::driver::{CudaSlice, DevicePtr};

use super::MlaF32Kernel;
use crate::mla::launch::unsupported;
use crate::mla::{DeviceMask, MlaShape, NewMask, PagedCache};
use crate::{Gpu, Result};

/// Builds a paged f32 cache on the device from `kv`, `[entries, width]` in logical order, as layer
/// `layer` of `layers`: pages of `page` entries in a shuffled order in one pool, the other layers
/// filled with NaN so that a wrong address shows (as [`crate::mla::upload_cache`] does in bf16).
/// Returns the pool and the page table.
pub fn upload_cache_f32(
    gpu: &Gpu,
    kv: &[f32],
    width: usize,
    page: usize,
    layers: usize,
    layer: usize,
) -> Result<(CudaSlice<f32>, CudaSlice<u64>)> {
    let entries = kv.len() / width;
    let pages = entries.div_ceil(page).max(1);
    let slot = |p: usize| if !pages.is_multiple_of(5) { (p * 5 + 3) % pages } else { pages - 1 - p };
    let page_len = layers * page * width;
    let mut pool = vec![f32::NAN; pages * page_len];
    for t in 0..entries {
        let at = slot(t / page) * page_len + (layer * page + t % page) * width;
        pool[at..at + width].copy_from_slice(&kv[t * width..][..width]);
    }
    let pool = gpu.stream.clone_htod(&pool)?;
    let base = {
        let (ptr, _sync) = pool.device_ptr(&gpu.stream);
        ptr
    };
    let table: Vec<u64> = (0..pages).map(|p| base + (slot(p) * page_len * 4) as u64).collect();
    let table = gpu.stream.clone_htod(&table)?;
    Ok((pool, table))
}

/// [`MlaF32Kernel::absorb`] from host data: returns `q_lat`, `[n, heads, latent + rope]`.
pub fn absorb_host(gpu: &Gpu, kernel: &MlaF32Kernel, s: &MlaShape, q: &[f32], kv_b: &[f32]) -> Result<Vec<f32>> {
    let n = q.len() / (s.heads * (s.nope + s.rope));
    let st = &gpu.stream;
    let (qd, wd) = (st.clone_htod(q)?, st.clone_htod(kv_b)?);
    let mut out = st.alloc_zeros::<f32>((n * s.heads * s.width()).max(1))?;
    kernel.absorb(gpu, s, n, &qd.as_view(), &wd.as_view(), &mut out.as_view_mut())?;
    let mut out = st.clone_dtoh(&out)?;
    out.truncate(n * s.heads * s.width());
    Ok(out)
}

/// [`MlaF32Kernel::unabsorb`] from host data: returns `o`, `[n, heads, v]`.
pub fn unabsorb_host(gpu: &Gpu, kernel: &MlaF32Kernel, s: &MlaShape, o_lat: &[f32], kv_b: &[f32]) -> Result<Vec<f32>> {
    let n = o_lat.len() / (s.heads * s.latent);
    let st = &gpu.stream;
    let (od, wd) = (st.clone_htod(o_lat)?, st.clone_htod(kv_b)?);
    let mut out = st.alloc_zeros::<f32>((n * s.heads * s.v).max(1))?;
    kernel.unabsorb(gpu, s, n, &od.as_view(), &wd.as_view(), &mut out.as_view_mut())?;
    let mut out = st.clone_dtoh(&out)?;
    out.truncate(n * s.heads * s.v);
    Ok(out)
}

/// One attention launch from host data: `q` `[n, heads, width]` and `kv` `[past + n, width]` (logical
/// order, the new rows' entries last), the cache laid out by [`upload_cache_f32`] (shuffled pages of
/// `page` entries, layer 1 of 2). Returns `o_lat`, `[n, heads, latent]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_host(
    gpu: &Gpu,
    kernel: &MlaF32Kernel,
    s: &MlaShape,
    q: &[f32],
    kv: &[f32],
    past: usize,
    mask: &NewMask,
    page: usize,
) -> Result<Vec<f32>> {
    let width = s.width();
    let n = q.len() / (s.heads * width);
    if kv.len() != (past + n) * width {
        return Err(unsupported("attention_host", format!("kv holds {} values, not {} entries", kv.len(), past + n)));
    }
    let st = &gpu.stream;
    let (_pool, table) = upload_cache_f32(gpu, kv, width, page, 2, 1)?;
    let (qd, past_d) = (st.clone_htod(q)?, st.clone_htod(&[past as u32])?);
    let bits = match mask {
        NewMask::Bits(words) => st.clone_htod(words)?,
        _ => st.clone_htod(&[0u32])?,
    };
    let dmask = match mask {
        NewMask::Causal => DeviceMask::Causal,
        NewMask::Full => DeviceMask::Full,
        NewMask::Bits(_) => DeviceMask::Bits(bits.as_view()),
    };
    let mut o_lat = st.alloc_zeros::<f32>((n * s.heads * s.latent).max(1))?;
    let cache = PagedCache { table: table.as_view(), page, layer: 1 };
    kernel.attention(gpu, s, n, &qd.as_view(), &cache, &past_d.as_view(), &dmask, &mut o_lat.as_view_mut())?;
    let mut out = st.clone_dtoh(&o_lat)?;
    out.truncate(n * s.heads * s.latent);
    Ok(out)
}
