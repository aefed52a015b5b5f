//! The small MLA kernels of a bf16 or FP8 cache ([`MlaAux`]): query absorption, output
//! unabsorption, cache append and gather, launched through [`Companions`], and an FP8 cache's
//! widening of a layer to bf16.

use cudarc::driver::{CudaFunction, CudaView, LaunchConfig, PushKernelArg};

use crate::launch::short_buffer;
use crate::mla::companions::{CompanionFns, Companions, Entry, Need};
use crate::mla::launch::{shape_error, unsupported};
use crate::mla::rules::MAX_NEW;
use crate::mla::space::MlaKv;
use crate::mla::{MlaAux, MlaShape, PagedCache};
use crate::{Cache, Compiled, Gpu, Result, Variant, compile_variant};

/// The most `nope` absorb takes: its query rows live in shared memory (K2's is 128).
pub const MAX_NOPE: usize = 256;

/// The aux variant's entries, loaded on one GPU: the four companions, and an FP8 cache's widen.
pub struct AuxKernel {
    variant: MlaAux,
    fns: CompanionFns,
    widen: Option<CudaFunction>,
}

/// The aux kernels' block size (the template's THREADS).
const THREADS: usize = 256;
/// Widen's grid, whatever the count (its warps stride over the entries): 8192 warps, a few dozen
/// per SM.
const WIDEN_BLOCKS: usize = 1024;

fn grid(x: usize, y: usize, z: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (x as u32, y as u32, z as u32), block_dim: (THREADS as u32, 1, 1), shared_mem_bytes: 0 }
}

impl AuxKernel {
    /// Loads `compiled`, which must be `variant`'s module, with its entries.
    pub fn load(gpu: &Gpu, variant: MlaAux, compiled: &Compiled) -> Result<AuxKernel> {
        if compiled.name != variant.name() {
            return Err(unsupported(&variant.name(), format!("the cubin given holds `{}`", compiled.name)));
        }
        let mut entries = gpu.load_named(compiled, &variant.entry_names())?.into_iter();
        let mut next = || entries.next().ok_or_else(|| unsupported(&variant.name(), "an entry is missing".into()));
        let fns = CompanionFns { absorb: next()?, unabsorb: next()?, append: next()?, gather: next()? };
        let widen = match variant.kv {
            MlaKv::Fp8 => Some(next()?),
            MlaKv::Bf16 => None,
        };
        Ok(AuxKernel { variant, fns, widen })
    }

    /// Compiles (through `cache`) and loads `variant` for `gpu`.
    pub fn compile(gpu: &Gpu, variant: MlaAux, cache: Option<&Cache>) -> Result<AuxKernel> {
        let compiled = compile_variant(&variant, gpu.arch, cache)?;
        AuxKernel::load(gpu, variant, &compiled)
    }

    pub fn variant(&self) -> &MlaAux {
        &self.variant
    }

    /// Writes entries `0..past + n` of `cache.layer`, an FP8 cache's (`past` read on the device), to
    /// layer 0 of the bf16 pages `wide` addresses (pages of `cache.page` entries of `latent + rope`
    /// bf16), as the values the FP8 decode variants widen them to, bit for bit: the variant's bf16
    /// twin over `wide` computes what the FP8 variant computes over the cache. `wide` must cover the
    /// entries' pages.
    pub fn widen(
        &self,
        gpu: &Gpu,
        s: &MlaShape,
        n: usize,
        cache: &PagedCache,
        past: &CudaView<u32>,
        wide: &CudaView<u64>,
    ) -> Result<()> {
        let Some(function) = &self.widen else {
            return Err(unsupported(&self.variant.name(), "only an FP8 cache's entries widen".into()));
        };
        let needs =
            [("past", past.len(), 1), ("the page table", cache.table.len(), 1), ("the bf16 pages", wide.len(), 1)];
        self.check(Entry::Append, s, n, &needs)?;
        let page_shift = cache.page_shift()?;
        let [ni, latent, rope, layer] = [n, s.latent, s.rope, cache.layer].map(|x| x as i32);
        let mut args = gpu.stream.launch_builder(function);
        args.arg(&cache.table).arg(wide).arg(past).arg(&ni).arg(&latent).arg(&rope).arg(&layer).arg(&page_shift);
        // SAFETY: the FP8 aux module's widen entry, signature (table, wide, past, n, latent, rope,
        // layer, page_shift); both tables cover entries 0..past + n, the caller's contract
        // (PagedCache), as for append.
        unsafe { args.launch(grid(WIDEN_BLOCKS, 1, 1)) }?;
        Ok(())
    }
}

impl Companions for AuxKernel {
    type Elem = u16;

    fn functions(&self) -> &CompanionFns {
        &self.fns
    }

    fn check(&self, entry: Entry, s: &MlaShape, n: usize, needs: &[Need]) -> Result<()> {
        let fail = |reason| unsupported(&self.variant.name(), reason);
        if let Some(reason) = shape_error(s) {
            return Err(fail(reason));
        }
        if s.nope > MAX_NOPE || s.v == 0 || s.v > 1 << 16 {
            return Err(fail(format!("nope {} (at most {MAX_NOPE}), v {}", s.nope, s.v)));
        }
        // Append takes a block an entry on the grid's x; gather's indices are u32.
        let most = match entry {
            Entry::Append => MAX_NEW * 64,
            Entry::Gather => u32::MAX as usize / 2,
            Entry::Absorb | Entry::Unabsorb => usize::MAX,
        };
        if n > most {
            return Err(fail(format!("{n} entries at once")));
        }
        short_buffer(needs).map_or(Ok(()), |reason| Err(fail(reason)))
    }

    /// Absorb's blocks also split the latent columns, one a thread (the template's ABSORB_COLS);
    /// unabsorb's split the values, one a warp (UNABSORB_VALUES); rows go `rows` a block.
    fn config(&self, entry: Entry, s: &MlaShape, n: usize) -> LaunchConfig {
        let rows = n.div_ceil(self.variant.rows as usize);
        match entry {
            Entry::Absorb => grid(s.heads, rows, s.latent.div_ceil(THREADS)),
            Entry::Unabsorb => grid(s.heads, rows, s.v.div_ceil(THREADS / 32)),
            Entry::Append | Entry::Gather => grid(n, 1, 1),
        }
    }
}
