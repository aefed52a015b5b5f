//! [`MlaF32Kernel`]: the [`MlaF32`] variant's five entries loaded on one GPU, and their checked
//! launches: the attention here, its four companions through [`Companions`]. Every one computes a row from that row's inputs alone (and, for the attention, the
//! row's compact sequence), in an order fixed by the shape: batch invariant.

use cudarc::driver::{CudaFunction, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use super::MlaF32;
use crate::launch::short_buffer;
use crate::mla::companions::{CompanionFns, Companions, Entry, Need};
use crate::mla::launch::unsupported;
use crate::mla::{DeviceMask, MlaShape, PagedCache, shape_error};
use crate::{Cache, Compiled, Gpu, Result, Variant, compile_variant};

/// The most `nope` absorb takes: its query row lives in shared memory (the template's MAX_NOPE).
pub(crate) const MAX_NOPE: usize = 256;
/// The most rows a launch takes: absorb, attention and unabsorb put rows on the grid's y.
pub(crate) const MAX_ROWS: usize = 65_535;

pub struct MlaF32Kernel {
    variant: MlaF32,
    attention: CudaFunction,
    fns: CompanionFns,
}

impl MlaF32Kernel {
    /// Loads `compiled`, which must be `variant`'s module, with its five entries.
    pub fn load(gpu: &Gpu, variant: MlaF32, compiled: &Compiled) -> Result<MlaF32Kernel> {
        if compiled.name != variant.name() {
            return Err(unsupported(&variant.name(), format!("the cubin given holds `{}`", compiled.name)));
        }
        let [attention, absorb, unabsorb, append, gather] = gpu.load_entries(compiled, variant.entry_names())?;
        Ok(MlaF32Kernel { variant, attention, fns: CompanionFns { absorb, unabsorb, append, gather } })
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

    fn grid(&self, grid: (usize, usize, usize)) -> LaunchConfig {
        let (x, y, z) = grid;
        LaunchConfig {
            grid_dim: (x as u32, y as u32, z as u32),
            block_dim: (self.variant.threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The shape checks every entry shares, and the buffers' lengths.
    fn check_rows(&self, s: &MlaShape, n: usize, needs: &[Need]) -> Result<()> {
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
        self.check_rows(s, n, &needs)?;
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
        unsafe { args.launch(self.grid((s.heads, n, 1))) }?;
        Ok(())
    }
}

impl Companions for MlaF32Kernel {
    type Elem = f32;

    fn functions(&self) -> &CompanionFns {
        &self.fns
    }

    fn check(&self, _: Entry, s: &MlaShape, n: usize, needs: &[Need]) -> Result<()> {
        self.check_rows(s, n, needs)
    }

    /// Absorb's blocks also split the latent columns, one a thread; unabsorb's split the values, one
    /// a warp; append and gather take a block an entry.
    fn config(&self, entry: Entry, s: &MlaShape, n: usize) -> LaunchConfig {
        match entry {
            Entry::Absorb => self.grid((s.heads, n, s.latent.div_ceil(self.threads()))),
            Entry::Unabsorb => self.grid((s.heads, n, s.v.div_ceil(self.threads() / 32))),
            Entry::Append | Entry::Gather => self.grid((n, 1, 1)),
        }
    }
}
