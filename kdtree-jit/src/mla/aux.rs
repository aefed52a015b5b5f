//! Launching the small MLA kernels ([`MlaAux`]): query absorption, output unabsorption, cache
//! append and gather. Every one computes a row from that row's inputs alone, in an order fixed by
//! the shape: batch invariant.

use cudarc::driver::{CudaFunction, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use crate::launch::short_buffer;
use crate::mla::launch::{PagedCache, shape_error, unsupported};
use crate::mla::rules::MAX_NEW;
use crate::mla::{MlaAux, MlaShape};
use crate::{Cache, Compiled, Gpu, Result, Variant, compile_variant};

/// The most `nope` absorb takes: its query rows live in shared memory (K2's is 128).
pub const MAX_NOPE: usize = 256;

/// The aux variant's four entries, loaded on one GPU.
pub struct AuxKernel {
    variant: MlaAux,
    absorb: CudaFunction,
    unabsorb: CudaFunction,
    append: CudaFunction,
    gather: CudaFunction,
}

/// The aux kernels' block size (the template's THREADS).
const THREADS: usize = 256;

fn grid(x: usize, y: usize, z: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (x as u32, y as u32, z as u32), block_dim: (THREADS as u32, 1, 1), shared_mem_bytes: 0 }
}

impl AuxKernel {
    /// Loads `compiled`, which must be `variant`'s module, with its four entries.
    pub fn load(gpu: &Gpu, variant: MlaAux, compiled: &Compiled) -> Result<AuxKernel> {
        if compiled.name != variant.name() {
            return Err(unsupported(&variant.name(), format!("the cubin given holds `{}`", compiled.name)));
        }
        let names = [variant.name(), variant.unabsorb_name(), variant.append_name(), variant.gather_name()];
        let [absorb, unabsorb, append, gather] = gpu.load_entries(compiled, names)?;
        Ok(AuxKernel { variant, absorb, unabsorb, append, gather })
    }

    /// Compiles (through `cache`) and loads `variant` for `gpu`.
    pub fn compile(gpu: &Gpu, variant: MlaAux, cache: Option<&Cache>) -> Result<AuxKernel> {
        let compiled = compile_variant(&variant, gpu.arch, cache)?;
        AuxKernel::load(gpu, variant, &compiled)
    }

    pub fn variant(&self) -> &MlaAux {
        &self.variant
    }

    fn check(&self, s: &MlaShape, needs: &[(&str, usize, usize)]) -> Result<()> {
        let fail = |reason| unsupported(&self.variant.name(), reason);
        if let Some(reason) = shape_error(s) {
            return Err(fail(reason));
        }
        if s.nope > MAX_NOPE || s.v == 0 || s.v > 1 << 16 {
            return Err(fail(format!("nope {} (at most {MAX_NOPE}), v {}", s.nope, s.v)));
        }
        short_buffer(needs).map_or(Ok(()), |reason| Err(fail(reason)))
    }

    /// `q_lat = [q_nope · W_UK | q_pe]` per row and head, as [`crate::mla::reference::absorb_query`]
    /// computes it (bit for bit before the bf16 rounding): `q` `[n, heads, nope + rope]` f32, `kv_b`
    /// `[heads * (nope + v), latent]` bf16 bits, `q_lat` `[n, heads, latent + rope]` bf16 bits.
    pub fn absorb(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        n: usize,
        q: &CudaView<f32>,
        kv_b: &CudaView<u16>,
        q_lat: &mut CudaViewMut<u16>,
    ) -> Result<()> {
        let kv_b_len = s.heads * (s.nope + s.v) * s.latent;
        let needs = [
            ("q", q.len(), n * s.heads * (s.nope + s.rope)),
            ("kv_b", kv_b.len(), kv_b_len),
            ("q_lat", q_lat.len(), n * s.heads * s.width()),
        ];
        self.check(s, &needs)?;
        if n == 0 {
            return Ok(());
        }
        let [ni, heads, nope, rope, v, latent] = [n, s.heads, s.nope, s.rope, s.v, s.latent].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(&self.absorb);
        args.arg(q).arg(kv_b).arg(q_lat).arg(&ni).arg(&heads).arg(&nope).arg(&rope).arg(&v).arg(&latent);
        // SAFETY: the variant's absorb entry, signature (q, kv_b, q_lat, n, heads, nope, rope, v,
        // latent); every buffer holds what the shape indexes (checked above), nope fits its shared rows.
        // Blocks also split the latent columns, one a thread (the template's ABSORB_COLS).
        unsafe { args.launch(grid(s.heads, n.div_ceil(self.variant.rows as usize), s.latent.div_ceil(THREADS))) }?;
        Ok(())
    }

    /// `o = W_UV · o_lat` per row and head: `o_lat` `[n, heads, latent]` f32, `kv_b` bf16 bits,
    /// `o` `[n, heads, v]` f32. Each value sums over the latent index in a fixed order (lane-strided,
    /// then a butterfly): within f32 rounding of [`crate::mla::reference::unabsorb_output`].
    pub fn unabsorb(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        n: usize,
        o_lat: &CudaView<f32>,
        kv_b: &CudaView<u16>,
        o: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let needs = [
            ("o_lat", o_lat.len(), n * s.heads * s.latent),
            ("kv_b", kv_b.len(), s.heads * (s.nope + s.v) * s.latent),
            ("o", o.len(), n * s.heads * s.v),
        ];
        self.check(s, &needs)?;
        if n == 0 {
            return Ok(());
        }
        let [ni, heads, nope, v, latent] = [n, s.heads, s.nope, s.v, s.latent].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(&self.unabsorb);
        args.arg(o_lat).arg(kv_b).arg(o).arg(&ni).arg(&heads).arg(&nope).arg(&v).arg(&latent);
        // SAFETY: the variant's unabsorb entry, signature (o_lat, kv_b, o, n, heads, nope, v, latent);
        // buffers checked above; latent <= MAX_LATENT fits its shared rows.
        // Blocks also split the values, one a warp (the template's UNABSORB_VALUES).
        unsafe { args.launch(grid(s.heads, n.div_ceil(self.variant.rows as usize), s.v.div_ceil(THREADS / 32))) }?;
        Ok(())
    }

    /// Writes `n` new entries `[latent[j] | k_pe[j]]` (f32 `[n, latent]` and `[n, rope]`, rounded to
    /// bf16) at logical positions `past .. past + n` of `cache.layer`, `past` read on the device.
    #[allow(clippy::too_many_arguments)]
    pub fn append(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        n: usize,
        latent: &CudaView<f32>,
        k_pe: &CudaView<f32>,
        cache: &PagedCache,
        past: &CudaView<u32>,
    ) -> Result<()> {
        let needs = [
            ("latent", latent.len(), n * s.latent),
            ("k_pe", k_pe.len(), n * s.rope),
            ("past", past.len(), 1),
            ("the page table", cache.table.len(), 1),
        ];
        self.check(s, &needs)?;
        if n > MAX_NEW * 64 {
            return Err(unsupported(&self.variant.name(), format!("{n} entries at once")));
        }
        let page_shift = cache.page_shift()?;
        if n == 0 {
            return Ok(());
        }
        let [ni, lat, rope, layer] = [n, s.latent, s.rope, cache.layer].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(&self.append);
        args.arg(latent).arg(k_pe).arg(&cache.table).arg(past).arg(&ni).arg(&lat).arg(&rope).arg(&layer);
        args.arg(&page_shift);
        // SAFETY: the variant's append entry, signature (latent, k_pe, table, past, n, latent, rope,
        // layer, page_shift); the inputs are checked above, the pages are the caller's (PagedCache).
        unsafe { args.launch(grid(n, 1, 1)) }?;
        Ok(())
    }

    /// Reads logical entries `idx` of `cache.layer` into `out`, `[idx.len(), latent + rope]` f32
    /// (exact). `idx` must name entries the table covers.
    pub fn gather(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        idx: &CudaView<u32>,
        cache: &PagedCache,
        out: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let k = idx.len();
        let needs = [("out", out.len(), k * s.width()), ("the page table", cache.table.len(), 1)];
        self.check(s, &needs)?;
        let page_shift = cache.page_shift()?;
        if k == 0 {
            return Ok(());
        }
        if k > u32::MAX as usize / 2 {
            return Err(unsupported(&self.variant.name(), format!("{k} entries at once")));
        }
        let [ki, width, layer] = [k, s.width(), cache.layer].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(&self.gather);
        args.arg(idx).arg(&cache.table).arg(out).arg(&ki).arg(&width).arg(&layer).arg(&page_shift);
        // SAFETY: the variant's gather entry, signature (idx, table, out, k, width, layer,
        // page_shift); out holds k entries (checked above); idx's entries are the caller's contract.
        unsafe { args.launch(grid(k, 1, 1)) }?;
        Ok(())
    }
}

/// [`AuxKernel::absorb`] from host data (q f32, kv_b bf16 bits): returns q_lat's bf16 bits.
pub fn absorb_host(gpu: &Gpu, kernel: &AuxKernel, s: &MlaShape, q: &[f32], kv_b: &[u16]) -> Result<Vec<u16>> {
    let n = q.len() / (s.heads * (s.nope + s.rope));
    let st = &gpu.stream;
    let (qd, wd) = (st.clone_htod(q)?, st.clone_htod(kv_b)?);
    let mut out = st.alloc_zeros::<u16>((n * s.heads * s.width()).max(1))?;
    kernel.absorb(gpu, s, n, &qd.as_view(), &wd.as_view(), &mut out.as_view_mut())?;
    let mut out = st.clone_dtoh(&out)?;
    out.truncate(n * s.heads * s.width());
    Ok(out)
}

/// [`AuxKernel::unabsorb`] from host data: returns `o`, `[n, heads, v]`.
pub fn unabsorb_host(gpu: &Gpu, kernel: &AuxKernel, s: &MlaShape, o_lat: &[f32], kv_b: &[u16]) -> Result<Vec<f32>> {
    let n = o_lat.len() / (s.heads * s.latent);
    let st = &gpu.stream;
    let (od, wd) = (st.clone_htod(o_lat)?, st.clone_htod(kv_b)?);
    let mut out = st.alloc_zeros::<f32>((n * s.heads * s.v).max(1))?;
    kernel.unabsorb(gpu, s, n, &od.as_view(), &wd.as_view(), &mut out.as_view_mut())?;
    let mut out = st.clone_dtoh(&out)?;
    out.truncate(n * s.heads * s.v);
    Ok(out)
}
