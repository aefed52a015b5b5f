//! The four entries beside an attention kernel, whatever the cache's dtype: query absorption,
//! output unabsorption, cache append and gather. [`AuxKernel`](super::AuxKernel) (a bf16 cache,
//! beside the tensor-core family) and [`MlaF32Kernel`](crate::mla_f32::MlaF32Kernel) (f32) have them
//! with the same signatures; [`Companions`] holds their buffer checks and launches once, and each
//! family says only its limits and grids. Every entry computes a row from that row's inputs alone,
//! in an order fixed by the shape: batch invariant.

use cudarc::driver::{CudaFunction, CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};

use crate::mla::{MlaShape, PagedCache};
use crate::{Gpu, Result};

/// Which of the four entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Absorb,
    Unabsorb,
    Append,
    Gather,
}

/// The four loaded entries.
pub struct CompanionFns {
    pub absorb: CudaFunction,
    pub unabsorb: CudaFunction,
    pub append: CudaFunction,
    pub gather: CudaFunction,
}

impl CompanionFns {
    pub(crate) fn get(&self, entry: Entry) -> &CudaFunction {
        match entry {
            Entry::Absorb => &self.absorb,
            Entry::Unabsorb => &self.unabsorb,
            Entry::Append => &self.append,
            Entry::Gather => &self.gather,
        }
    }
}

/// A buffer a launch reads or writes: its name, its length, and the length the shape needs.
pub(crate) type Need<'a> = (&'a str, usize, usize);

/// A family's four companion entries, loaded.
pub trait Companions {
    /// What `kv_b` and the absorbed queries hold: bf16 bits (u16) or f32.
    type Elem: DeviceRepr + ValidAsZeroBits + Copy + Unpin;

    /// The loaded entries.
    fn functions(&self) -> &CompanionFns;

    /// The loaded entry.
    fn function(&self, entry: Entry) -> &CudaFunction {
        self.functions().get(entry)
    }

    /// `Err` when the family cannot run `entry` for `s` over `n` rows (entries, for append and
    /// gather), or a buffer in `needs` is short.
    fn check(&self, entry: Entry, s: &MlaShape, n: usize, needs: &[Need]) -> Result<()>;

    /// The launch shape of `entry` over `n` rows (entries).
    fn config(&self, entry: Entry, s: &MlaShape, n: usize) -> LaunchConfig;

    /// `q_lat = [q_nope · W_UK | q_pe]` per row and head, as [`super::reference::absorb_query`]
    /// computes it (bit for bit, then rounded to `Elem`): `q` `[n, heads, nope + rope]` f32, `kv_b`
    /// `[heads * (nope + v), latent]`, `q_lat` `[n, heads, latent + rope]`.
    fn absorb(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        n: usize,
        q: &CudaView<f32>,
        kv_b: &CudaView<Self::Elem>,
        q_lat: &mut CudaViewMut<Self::Elem>,
    ) -> Result<()> {
        let needs = [
            ("q", q.len(), n * s.heads * (s.nope + s.rope)),
            ("kv_b", kv_b.len(), s.heads * (s.nope + s.v) * s.latent),
            ("q_lat", q_lat.len(), n * s.heads * s.width()),
        ];
        self.check(Entry::Absorb, s, n, &needs)?;
        if n == 0 {
            return Ok(());
        }
        let [ni, heads, nope, rope, v, latent] = [n, s.heads, s.nope, s.rope, s.v, s.latent].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(self.function(Entry::Absorb));
        args.arg(q).arg(kv_b).arg(q_lat).arg(&ni).arg(&heads).arg(&nope).arg(&rope).arg(&v).arg(&latent);
        // SAFETY: the family's absorb entry, signature (q, kv_b, q_lat, n, heads, nope, rope, v,
        // latent); every buffer holds what the shape indexes (checked above), and `check` bounds nope
        // by the entry's shared query row.
        unsafe { args.launch(self.config(Entry::Absorb, s, n)) }?;
        Ok(())
    }

    /// `o = W_UV · o_lat` per row and head: `o_lat` `[n, heads, latent]` f32, `kv_b` as for absorb,
    /// `o` `[n, heads, v]` f32. Each value sums over the latent index in a fixed order (lane-strided,
    /// then a butterfly): within f32 rounding of [`super::reference::unabsorb_output`].
    fn unabsorb(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        n: usize,
        o_lat: &CudaView<f32>,
        kv_b: &CudaView<Self::Elem>,
        o: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let needs = [
            ("o_lat", o_lat.len(), n * s.heads * s.latent),
            ("kv_b", kv_b.len(), s.heads * (s.nope + s.v) * s.latent),
            ("o", o.len(), n * s.heads * s.v),
        ];
        self.check(Entry::Unabsorb, s, n, &needs)?;
        if n == 0 {
            return Ok(());
        }
        let [ni, heads, nope, v, latent] = [n, s.heads, s.nope, s.v, s.latent].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(self.function(Entry::Unabsorb));
        args.arg(o_lat).arg(kv_b).arg(o).arg(&ni).arg(&heads).arg(&nope).arg(&v).arg(&latent);
        // SAFETY: the family's unabsorb entry, signature (o_lat, kv_b, o, n, heads, nope, v, latent);
        // buffers checked above, latent bounded by `check`.
        unsafe { args.launch(self.config(Entry::Unabsorb, s, n)) }?;
        Ok(())
    }

    /// Writes `n` entries `[latent[j] | k_pe[j]]` (f32 `[n, latent]` and `[n, rope]`, stored as the
    /// cache stores them: rounded to its dtype, or quantized for an FP8 cache) at logical positions
    /// `past .. past + n` of `cache.layer`, `past` read on the device.
    #[allow(clippy::too_many_arguments)]
    fn append(
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
        self.check(Entry::Append, s, n, &needs)?;
        let page_shift = cache.page_shift()?;
        if n == 0 {
            return Ok(());
        }
        let [ni, lat, rope, layer] = [n, s.latent, s.rope, cache.layer].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(self.function(Entry::Append));
        args.arg(latent).arg(k_pe).arg(&cache.table).arg(past).arg(&ni).arg(&lat).arg(&rope).arg(&layer);
        args.arg(&page_shift);
        // SAFETY: the family's append entry, signature (latent, k_pe, table, past, n, latent, rope,
        // layer, page_shift); the inputs are checked above, the pages are the caller's (PagedCache).
        unsafe { args.launch(self.config(Entry::Append, s, n)) }?;
        Ok(())
    }

    /// Reads logical entries `idx` of `cache.layer` into `out`, `[idx.len(), latent + rope]` f32
    /// (the values the cache holds, exactly). `idx` must name entries the table covers.
    fn gather(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        idx: &CudaView<u32>,
        cache: &PagedCache,
        out: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let k = idx.len();
        let needs = [("out", out.len(), k * s.width()), ("the page table", cache.table.len(), 1)];
        self.check(Entry::Gather, s, k, &needs)?;
        let page_shift = cache.page_shift()?;
        if k == 0 {
            return Ok(());
        }
        let [ki, latent, rope, layer] = [k, s.latent, s.rope, cache.layer].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(self.function(Entry::Gather));
        args.arg(idx).arg(&cache.table).arg(out).arg(&ki).arg(&latent).arg(&rope).arg(&layer).arg(&page_shift);
        // SAFETY: the family's gather entry, signature (idx, table, out, k, latent, rope, layer,
        // page_shift);
        // out holds k entries (checked above); idx's entries are the caller's contract.
        unsafe { args.launch(self.config(Entry::Gather, s, k)) }?;
        Ok(())
    }
}

/// [`Companions::absorb`] from host data: returns `q_lat`.
pub fn absorb_host<K: Companions>(gpu: &Gpu, k: &K, s: &MlaShape, q: &[f32], kv_b: &[K::Elem]) -> Result<Vec<K::Elem>> {
    let n = q.len() / (s.heads * (s.nope + s.rope));
    let st = &gpu.stream;
    let (qd, wd) = (st.clone_htod(q)?, st.clone_htod(kv_b)?);
    let mut out = st.alloc_zeros::<K::Elem>((n * s.heads * s.width()).max(1))?;
    k.absorb(gpu, s, n, &qd.as_view(), &wd.as_view(), &mut out.as_view_mut())?;
    let mut out = st.clone_dtoh(&out)?;
    out.truncate(n * s.heads * s.width());
    Ok(out)
}

/// [`Companions::unabsorb`] from host data: returns `o`, `[n, heads, v]`.
pub fn unabsorb_host<K: Companions>(
    gpu: &Gpu,
    k: &K,
    s: &MlaShape,
    o_lat: &[f32],
    kv_b: &[K::Elem],
) -> Result<Vec<f32>> {
    let n = o_lat.len() / (s.heads * s.latent);
    let st = &gpu.stream;
    let (od, wd) = (st.clone_htod(o_lat)?, st.clone_htod(kv_b)?);
    let mut out = st.alloc_zeros::<f32>((n * s.heads * s.v).max(1))?;
    k.unabsorb(gpu, s, n, &od.as_view(), &wd.as_view(), &mut out.as_view_mut())?;
    let mut out = st.clone_dtoh(&out)?;
    out.truncate(n * s.heads * s.v);
    Ok(out)
}
