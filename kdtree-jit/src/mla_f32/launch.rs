//! [`MlaF32Kernel`]: the [`MlaF32`] variant's five entries loaded on one GPU, and their checked
//! launches. Every one computes a row from that row's inputs alone (and, for the attention, the
//! row's compact sequence), in an order fixed by the shape: batch invariant.

use cudarc::driver::{CudaFunction, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::MlaF32;
use crate::launch::short_buffer;
use crate::mla::launch::unsupported;
use crate::mla::{DeviceMask, MlaShape, PagedCache, shape_error};
use crate::{Cache, Compiled, Gpu, Result, Variant, compile_variant};

/// The most `nope` absorb takes: its query row lives in shared memory (the template's MAX_NOPE).
pub const MAX_NOPE: usize = 256;
/// The most rows a launch takes: absorb, attention and unabsorb put rows on the grid's y.
pub const MAX_ROWS: usize = 65_535;

pub struct MlaF32Kernel {
    variant: MlaF32,
    attention: CudaFunction,
    absorb: CudaFunction,
    unabsorb: CudaFunction,
    append: CudaFunction,
    gather: CudaFunction,
}

impl MlaF32Kernel {
    /// Loads `compiled`, which must be `variant`'s module, with its five entries.
    pub fn load(gpu: &Gpu, variant: MlaF32, compiled: &Compiled) -> Result<MlaF32Kernel> {
        if compiled.name != variant.name() {
            return Err(unsupported(&variant.name(), format!("the cubin given holds `{}`", compiled.name)));
        }
        let [attention, absorb, unabsorb, append, gather] = gpu.load_entries(compiled, variant.entry_names())?;
        Ok(MlaF32Kernel { variant, attention, absorb, unabsorb, append, gather })
    }

    /// Compiles (through `cache`) and loads `variant` for `gpu`.
    pub fn compile(gpu: &Gpu, variant: MlaF32, cache: Option<&Cache>) -> Result<MlaF32Kernel> {
        let compiled = compile_variant(&variant, gpu.arch, cache)?;
        MlaF32Kernel::load(gpu, variant, &compiled)
    }

    pub fn variant(&self) -> &MlaF32 {
        &self.variant
    }

    fn threads(&self) -> usize {
        self.variant.threads as usize
    }

    fn config(&self, grid: (usize, usize, usize)) -> LaunchConfig {
        let (x, y, z) = grid;
        LaunchConfig {
            grid_dim: (x as u32, y as u32, z as u32),
            block_dim: (self.variant.threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The shape checks every entry shares, and the buffers' lengths.
    fn check(&self, s: &MlaShape, n: usize, needs: &[(&str, usize, usize)]) -> Result<()> {
        let fail = |reason| unsupported(&self.variant.name(), reason);
        if let Some(reason) = shape_error(s) {
            return Err(fail(reason));
        }
        if s.nope > MAX_NOPE || s.v == 0 || s.v > 1 << 16 || s.latent > 4 * self.threads() {
            return Err(fail(format!("nope {} (at most {MAX_NOPE}), v {}, latent {}", s.nope, s.v, s.latent)));
        }
        // Rows (entries, for append and gather) are the grid's y or x: y holds at most 65535.
        if n > MAX_ROWS {
            return Err(fail(format!("{n} rows at once; a launch takes at most {MAX_ROWS}")));
        }
        short_buffer(needs).map_or(Ok(()), |reason| Err(fail(reason)))
    }

    /// `q_lat = [q_nope · W_UK | q_pe]` per row and head, as [`crate::mla::reference::absorb_query`]
    /// computes it, bit for bit: `q` `[n, heads, nope + rope]`, `kv_b` `[heads * (nope + v), latent]`,
    /// `q_lat` `[n, heads, latent + rope]`, all f32.
    pub fn absorb(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        n: usize,
        q: &CudaView<f32>,
        kv_b: &CudaView<f32>,
        q_lat: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let needs = [
            ("q", q.len(), n * s.heads * (s.nope + s.rope)),
            ("kv_b", kv_b.len(), s.heads * (s.nope + s.v) * s.latent),
            ("q_lat", q_lat.len(), n * s.heads * s.width()),
        ];
        self.check(s, n, &needs)?;
        if n == 0 {
            return Ok(());
        }
        let [ni, heads, nope, rope, v, latent] = [n, s.heads, s.nope, s.rope, s.v, s.latent].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(&self.absorb);
        args.arg(q).arg(kv_b).arg(q_lat).arg(&ni).arg(&heads).arg(&nope).arg(&rope).arg(&v).arg(&latent);
        // SAFETY: the variant's absorb entry, signature (q, kv_b, q_lat, n, heads, nope, rope, v, latent);
        // every buffer holds what the shape indexes (checked above); nope fits its shared row.
        unsafe { args.launch(self.config((s.heads, n, s.latent.div_ceil(self.threads())))) }?;
        Ok(())
    }

    /// `o = W_UV · o_lat` per row and head: `o_lat` `[n, heads, latent]`, `kv_b` as for absorb, `o`
    /// `[n, heads, v]`, all f32; each value a lane-strided sum then a butterfly, within f32 rounding of
    /// [`crate::mla::reference::unabsorb_output`].
    pub fn unabsorb(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        n: usize,
        o_lat: &CudaView<f32>,
        kv_b: &CudaView<f32>,
        o: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let needs = [
            ("o_lat", o_lat.len(), n * s.heads * s.latent),
            ("kv_b", kv_b.len(), s.heads * (s.nope + s.v) * s.latent),
            ("o", o.len(), n * s.heads * s.v),
        ];
        self.check(s, n, &needs)?;
        if n == 0 {
            return Ok(());
        }
        let [ni, heads, nope, v, latent] = [n, s.heads, s.nope, s.v, s.latent].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(&self.unabsorb);
        args.arg(o_lat).arg(kv_b).arg(o).arg(&ni).arg(&heads).arg(&nope).arg(&v).arg(&latent);
        // SAFETY: the variant's unabsorb entry, signature (o_lat, kv_b, o, n, heads, nope, v, latent);
        // buffers checked above. Blocks split the values, one a warp.
        unsafe { args.launch(self.config((s.heads, n, s.v.div_ceil(self.threads() / 32)))) }?;
        Ok(())
    }

    /// Attention of `n` new rows over `cache.layer` (each row's heads over its compact sequence, see
    /// [`crate::mla::reference::attention`] with f32 weights): `q_lat` `[n, heads, latent + rope]`,
    /// `o_lat` `[n, heads, latent]`, f32; `past` one u32 on the device, the new rows' entries written
    /// at `past .. past + n` before the launch.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        n: usize,
        q_lat: &CudaView<f32>,
        cache: &PagedCache,
        past: &CudaView<u32>,
        mask: &DeviceMask,
        o_lat: &mut CudaViewMut<f32>,
    ) -> Result<()> {
        let mut needs = vec![
            ("q_lat", q_lat.len(), n * s.heads * s.width()),
            ("past", past.len(), 1),
            ("the page table", cache.table.len(), 1),
            ("o_lat", o_lat.len(), n * s.heads * s.latent),
        ];
        if let DeviceMask::Bits(bits) = mask {
            needs.push(("the mask bits", bits.len(), n * n.div_ceil(32)));
        }
        self.check(s, n, &needs)?;
        let page_shift = cache.page_shift()?;
        if n == 0 {
            return Ok(());
        }
        let (mode, bits): (i32, &CudaView<u32>) = match mask {
            DeviceMask::Causal => (0, past),
            DeviceMask::Full => (1, past),
            DeviceMask::Bits(bits) => (2, bits),
        };
        let [ni, heads, latent, rope, layer] = [n, s.heads, s.latent, s.rope, cache.layer].map(|x| x as i32);
        let scale_log2 = s.scale * std::f32::consts::LOG2_E;
        let mut args = gpu.stream.launch_builder(&self.attention);
        args.arg(q_lat).arg(&cache.table).arg(past).arg(bits).arg(o_lat);
        args.arg(&ni).arg(&heads).arg(&latent).arg(&rope).arg(&layer).arg(&page_shift).arg(&mode).arg(&scale_log2);
        // SAFETY: the variant's attention entry, signature (q_lat, table, past, bits, o_lat, n, heads,
        // latent, rope, layer, page_shift, mode, scale_log2); q_lat and o_lat hold n rows of every head,
        // the bits n rows when mode is 2 (read only then; any buffer serves as the pointer otherwise),
        // past one u32; `check` bounds the width by the template's shared query and latent by its
        // columns a thread. The page table and its pages are the caller's contract (PagedCache).
        unsafe { args.launch(self.config((s.heads, n, 1))) }?;
        Ok(())
    }

    /// Writes `n` entries `[latent[j] | k_pe[j]]` (f32 `[n, latent]` and `[n, rope]`) at logical
    /// positions `past .. past + n` of `cache.layer`, `past` read on the device.
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
        self.check(s, n, &needs)?;
        let page_shift = cache.page_shift()?;
        if n == 0 {
            return Ok(());
        }
        let [ni, lat, rope, layer] = [n, s.latent, s.rope, cache.layer].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(&self.append);
        args.arg(latent).arg(k_pe).arg(&cache.table).arg(past).arg(&ni).arg(&lat).arg(&rope).arg(&layer);
        args.arg(&page_shift);
        // SAFETY: the variant's append entry, signature (latent, k_pe, table, past, n, latent, rope, layer,
        // page_shift); the inputs are checked above, the pages are the caller's (PagedCache).
        unsafe { args.launch(self.config((n, 1, 1))) }?;
        Ok(())
    }

    /// Reads logical entries `idx` of `cache.layer` into `out`, `[idx.len(), latent + rope]` f32.
    /// `idx` must name entries the table covers.
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
        self.check(s, k, &needs)?;
        let page_shift = cache.page_shift()?;
        if k == 0 {
            return Ok(());
        }
        let [ki, width, layer] = [k, s.width(), cache.layer].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(&self.gather);
        args.arg(idx).arg(&cache.table).arg(out).arg(&ki).arg(&width).arg(&layer).arg(&page_shift);
        // SAFETY: the variant's gather entry, signature (idx, table, out, k, width, layer, page_shift);
        // out holds k entries (checked above); idx's entries are the caller's contract.
        unsafe { args.launch(self.config((k, 1, 1))) }?;
        Ok(())
    }
}
