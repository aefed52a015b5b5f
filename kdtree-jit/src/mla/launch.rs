//! Launching MLA attention. [`MlaKernel`] binds a [`MlaDecode`] variant to its two loaded entries
//! (the split kernel and the combine), so no safe call launches a function with another's arguments.

use cudarc::driver::{CudaFunction, CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::launch::{allow_shared, short_buffer};
use crate::mla::rules::{MAX_LATENT, MAX_NEW, MAX_ROPE, dynamic_smem, static_smem};
use crate::mla::{MlaDecode, MlaShape, NewMask};
use crate::{Cache, Compiled, Error, Gpu, Result, Variant, compile_variant};

/// Which new tokens each new row sees, on the device ([`NewMask`]'s forms).
pub enum DeviceMask<'a> {
    Causal,
    Full,
    /// `[n, n.div_ceil(32)]` words: bit `j % 32` of word `i * words + j / 32` says row i sees token j.
    Bits(CudaView<'a, u32>),
}

impl DeviceMask<'_> {
    /// The kernels' `mode` argument.
    fn mode(&self) -> i32 {
        match self {
            DeviceMask::Causal => 0,
            DeviceMask::Full => 1,
            DeviceMask::Bits(_) => 2,
        }
    }
}

/// A paged latent cache as the kernels address it: logical entry t of layer `layer` is the `words =
/// kv.entry_words(shape)` 16-bit words at `table[t / page] + (layer * page + t % page) * words` (for
/// a bf16 cache the `latent + rope` values, [`crate::mla::MlaKv`]): a page holds every layer of its
/// `page` tokens. `page` is a power of two; each page pointer is
/// 16-byte aligned. The table must cover every entry a launch reads (`past + n` entries); its
/// contents, like `past`, may change between launches (CUDA graph replays).
pub struct PagedCache<'a> {
    pub table: CudaView<'a, u64>,
    pub page: usize,
    pub layer: usize,
}

impl PagedCache<'_> {
    pub(crate) fn page_shift(&self) -> Result<i32> {
        if !self.page.is_power_of_two() || self.page > 1 << 20 {
            return Err(unsupported("mla cache", format!("a page of {} entries is not a power of two", self.page)));
        }
        if i32::try_from(self.layer).is_err() {
            return Err(unsupported("mla cache", format!("layer {}", self.layer)));
        }
        Ok(self.page.trailing_zeros() as i32)
    }
}

pub(crate) fn unsupported(variant: &str, reason: String) -> Error {
    Error::Unsupported { variant: variant.to_owned(), reason }
}

/// The device buffers of one attention launch of `n` new rows.
pub struct MlaBuffers<'a> {
    /// `[n, heads, latent + rope]` bf16 bits: the absorbed queries.
    pub q: CudaView<'a, u16>,
    pub cache: PagedCache<'a>,
    /// One u32: the committed entries. The new rows' own entries are at `past .. past + n`, written
    /// before the launch.
    pub past: CudaView<'a, u32>,
    pub mask: DeviceMask<'a>,
    /// At least [`MlaDecode::workspace_len`]`(1, heads, latent)` f32: the launch runs the rows in
    /// slices of as many rows as the workspace holds (all `n` with `workspace_len(n, ..)`), so a long
    /// prompt chunk needs no more than a decode step.
    pub workspace: CudaViewMut<'a, f32>,
    /// `[n, heads, latent]` f32: each row's and head's softmax-weighted sum of its entries' latents.
    pub o_lat: CudaViewMut<'a, f32>,
}

/// A decode variant and its two entries, loaded on one GPU.
pub struct MlaKernel {
    variant: MlaDecode,
    decode: CudaFunction,
    combine: CudaFunction,
}

/// Why the kernels cannot take `s`, if they cannot: latent a multiple of 32 up to 512, rope a
/// multiple of 16 up to 64 (K2's 512 and 64 are the bounds).
pub fn shape_error(s: &MlaShape) -> Option<String> {
    if s.heads == 0 || s.heads > 1 << 16 {
        return Some(format!("{} heads", s.heads));
    }
    if s.latent == 0 || !s.latent.is_multiple_of(32) || s.latent > MAX_LATENT {
        return Some(format!("latent {} is not a multiple of 32 in 32..={MAX_LATENT}", s.latent));
    }
    if !s.rope.is_multiple_of(16) || s.rope > MAX_ROPE {
        return Some(format!("rope {} is not a multiple of 16 up to {MAX_ROPE}", s.rope));
    }
    None
}

impl MlaKernel {
    /// Loads `compiled`, which must be `variant`'s kernel, with both of its template's entries.
    pub fn load(gpu: &Gpu, variant: MlaDecode, compiled: &Compiled) -> Result<MlaKernel> {
        if compiled.name != variant.name() {
            return Err(unsupported(&variant.name(), format!("the cubin given holds `{}`", compiled.name)));
        }
        let [decode, combine] = gpu.load_entries(compiled, [compiled.name.clone(), variant.combine_name()])?;
        Ok(MlaKernel { variant, decode, combine })
    }

    /// Compiles (through `cache`) and loads `variant` for `gpu`.
    pub fn compile(gpu: &Gpu, variant: MlaDecode, cache: Option<&Cache>) -> Result<MlaKernel> {
        let compiled = compile_variant(&variant, variant.compile_arch(gpu.arch), cache)?;
        MlaKernel::load(gpu, variant, &compiled)
    }

    pub fn variant(&self) -> &MlaDecode {
        &self.variant
    }

    /// Enqueues attention of `n` new rows (each row's heads over its compact sequence, see
    /// [`crate::mla::reference::attention`]) and the combine of its splits into `b.o_lat`, on `gpu`'s
    /// stream. `s.nope` and `s.v` are not read. `n` is at most `MAX_NEW`; `n = 0` does nothing.
    pub fn launch(&self, gpu: &Gpu, s: &MlaShape, n: usize, b: MlaBuffers) -> Result<()> {
        let v = &self.variant;
        let fail = |reason: String| unsupported(&v.name(), reason);
        if n == 0 {
            return Ok(());
        }
        if let Some(reason) = shape_error(s) {
            return Err(fail(reason));
        }
        if n > MAX_NEW {
            return Err(fail(format!("{n} new rows; a launch takes at most {MAX_NEW}")));
        }
        let page_shift = b.cache.page_shift()?;
        let width = s.width();
        let mut needs = vec![
            ("q", b.q.len(), n * s.heads * width),
            ("past", b.past.len(), 1),
            ("the page table", b.cache.table.len(), 1),
            ("the workspace", b.workspace.len(), v.workspace_len(1, s.heads, s.latent)),
            ("o_lat", b.o_lat.len(), n * s.heads * s.latent),
        ];
        if let DeviceMask::Bits(bits) = &b.mask {
            needs.push(("the mask bits", bits.len(), n * n.div_ceil(32)));
        }
        if let Some(reason) = short_buffer(&needs) {
            return Err(fail(reason));
        }
        let head_groups = s.heads.div_ceil(v.hb as usize);
        let mode = b.mask.mode();
        // Not read unless mode is 2: any device buffer serves as the pointer.
        let bits: &CudaView<u32> = match &b.mask {
            DeviceMask::Bits(bits) => bits,
            _ => &b.past,
        };
        let smem = dynamic_smem(v, s.latent, s.rope);
        allow_shared(&self.decode, smem, static_smem(v))?;
        let slice = n.min(b.workspace.len() / v.workspace_len(1, s.heads, s.latent));
        let split = slice * v.max_splits as usize * s.heads * s.latent;
        let mut workspace = b.workspace;
        let (mut part_o, mut part_ml) = workspace.split_at_mut(split);
        let mut o_lat = b.o_lat;
        let (ni, heads, latent, rope) = (n as i32, s.heads as i32, s.latent as i32, s.rope as i32);
        let layer = b.cache.layer as i32;
        let scale_log2 = s.scale * std::f32::consts::LOG2_E;
        for row0 in (0..n).step_by(slice) {
            let rows = slice.min(n - row0) as u32;
            let row0 = row0 as i32;
            let cfg = LaunchConfig {
                grid_dim: (rows, head_groups as u32, v.max_splits),
                block_dim: (v.hb / 16 * 64, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            let mut args = gpu.stream.launch_builder(&self.decode);
            args.arg(&b.q).arg(&b.cache.table).arg(&b.past).arg(bits).arg(&mut part_o).arg(&mut part_ml);
            args.arg(&row0).arg(&ni).arg(&heads).arg(&latent).arg(&rope).arg(&layer).arg(&page_shift);
            args.arg(&mode).arg(&scale_log2);
            // SAFETY: `decode` is this variant's entry (checked by name when loaded), signature (q,
            // table, past, bits, part_o, part_ml, row0, n, heads, latent, rope, layer, page_shift,
            // mode, scale_log2). q holds n rows of `heads` entries, the workspace `slice` rows of
            // max_splits partials of every head (rows row0 .. row0 + rows <= n), the bits n rows
            // when mode is 2 (read only then), past one u32; `shape_error` bounds latent and rope by
            // what the template's registers and shared memory hold, n by its visible list. The page
            // table and the pages it points to are the caller's contract (PagedCache).
            unsafe { args.launch(cfg) }?;
            let cfg = LaunchConfig { grid_dim: (rows, s.heads as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
            let mut args = gpu.stream.launch_builder(&self.combine);
            args.arg(&b.past).arg(bits).arg(&mut part_o).arg(&mut part_ml).arg(&mut o_lat);
            args.arg(&row0).arg(&ni).arg(&heads).arg(&latent).arg(&mode);
            // SAFETY: `combine` is this variant's second entry, signature (past, bits, part_o,
            // part_ml, o_lat, row0, n, heads, latent, mode); it reads what the launch above wrote,
            // for the splits each row's length gives (at most max_splits), and writes rows row0 ..
            // row0 + rows of o_lat's n x heads x latent, checked above.
            unsafe { args.launch(cfg) }?;
        }
        Ok(())
    }
}

/// A value a paged cache holds: bf16 bits or f32, with the NaN [`upload_cache`] fills the other
/// layers with.
pub trait CacheValue: DeviceRepr + Copy {
    const NAN: Self;
}

impl CacheValue for u16 {
    const NAN: u16 = 0x7fc0;
}

impl CacheValue for f32 {
    const NAN: f32 = f32::NAN;
}

/// Builds a paged cache on the device from `kv`, `[entries, width]` values in logical order, as
/// layer `layer` of `layers`: pages of `page` entries in a shuffled order in one pool, the other
/// layers filled with NaN so that a wrong address shows. Returns the pool and the page table.
pub fn upload_cache<T: CacheValue>(
    gpu: &Gpu,
    kv: &[T],
    width: usize,
    page: usize,
    layers: usize,
    layer: usize,
) -> Result<(cudarc::driver::CudaSlice<T>, cudarc::driver::CudaSlice<u64>)> {
    use cudarc::driver::DevicePtr;
    let entries = kv.len() / width;
    let pages = entries.div_ceil(page).max(1);
    // Page p lives in slot (p * 5 + 3) mod pages when that is a permutation, else in reverse.
    let slot = |p: usize| if !pages.is_multiple_of(5) { (p * 5 + 3) % pages } else { pages - 1 - p };
    let page_len = layers * page * width;
    let mut pool = vec![T::NAN; pages * page_len];
    for t in 0..entries {
        let at = slot(t / page) * page_len + (layer * page + t % page) * width;
        pool[at..at + width].copy_from_slice(&kv[t * width..][..width]);
    }
    let pool = gpu.stream.clone_htod(&pool)?;
    let base = {
        let (ptr, _sync) = pool.device_ptr(&gpu.stream);
        ptr
    };
    let table: Vec<u64> = (0..pages).map(|p| base + (slot(p) * page_len * size_of::<T>()) as u64).collect();
    let table = gpu.stream.clone_htod(&table)?;
    Ok((pool, table))
}

/// One attention launch from host data, for tests and the tuner: `q` `[n, heads, width]` as bf16 bits
/// and `kv` `[past + n]` entries (logical order, the new rows' entries last) as the words of the
/// kernel's cache ([`crate::mla::MlaKv::encode`]); the cache is laid out
/// by [`upload_cache`] (shuffled pages of `page` entries, layer 1 of 2). Returns `o_lat`, `[n, heads,
/// latent]`.
#[allow(clippy::too_many_arguments)]
pub fn mla_host(
    gpu: &Gpu,
    kernel: &MlaKernel,
    s: &MlaShape,
    q: &[u16],
    kv: &[u16],
    past: usize,
    mask: &NewMask,
    page: usize,
) -> Result<Vec<f32>> {
    let words = kernel.variant().kv.entry_words(s);
    let (inputs, n) = HostInputs::upload(gpu, "mla_host", s, q, kv, words, past, mask, page)?;
    let st = &gpu.stream;
    let mut workspace = st.alloc_zeros::<f32>(kernel.variant().workspace_len(n, s.heads, s.latent).max(1))?;
    let mut o_lat = st.alloc_zeros::<f32>((n * s.heads * s.latent).max(1))?;
    let b = MlaBuffers {
        q: inputs.q.as_view(),
        cache: inputs.cache(page),
        past: inputs.past.as_view(),
        mask: inputs.mask(mask),
        workspace: workspace.as_view_mut(),
        o_lat: o_lat.as_view_mut(),
    };
    kernel.launch(gpu, s, n, b)?;
    let mut out = st.clone_dtoh(&o_lat)?;
    out.truncate(n * s.heads * s.latent);
    Ok(out)
}

/// What a host round trip of attention puts on the device: the cache as [`upload_cache`] lays it out
/// (layer 1 of 2), the queries, `past`, and the mask's bits (one unread word unless the mask is bits).
pub(crate) struct HostInputs<T: CacheValue> {
    _pool: cudarc::driver::CudaSlice<T>,
    table: cudarc::driver::CudaSlice<u64>,
    pub q: cudarc::driver::CudaSlice<T>,
    pub past: cudarc::driver::CudaSlice<u32>,
    bits: cudarc::driver::CudaSlice<u32>,
}

impl<T: CacheValue> HostInputs<T> {
    /// Uploads `q` `[n, heads, width]` and `kv` `[past + n, stride]` (logical order, the new rows'
    /// entries last) in pages of `page`; returns them with n. `origin` names the caller in errors.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn upload(
        gpu: &Gpu,
        origin: &str,
        s: &MlaShape,
        q: &[T],
        kv: &[T],
        stride: usize,
        past: usize,
        mask: &NewMask,
        page: usize,
    ) -> Result<(HostInputs<T>, usize)> {
        let n = q.len() / (s.heads * s.width());
        if kv.len() != (past + n) * stride {
            let reason = format!("kv holds {} values, not past + n = {} entries", kv.len(), past + n);
            return Err(unsupported(origin, reason));
        }
        let st = &gpu.stream;
        let (_pool, table) = upload_cache(gpu, kv, stride, page, 2, 1)?;
        let bits = match mask {
            NewMask::Bits(words) => st.clone_htod(words)?,
            _ => st.clone_htod(&[0u32])?,
        };
        let (q, past) = (st.clone_htod(q)?, st.clone_htod(&[past as u32])?);
        Ok((HostInputs { _pool, table, q, past, bits }, n))
    }

    pub(crate) fn cache(&self, page: usize) -> PagedCache<'_> {
        PagedCache { table: self.table.as_view(), page, layer: 1 }
    }

    /// `mask` on the device: the uploaded bits when it is bits.
    pub(crate) fn mask(&self, mask: &NewMask) -> DeviceMask<'_> {
        match mask {
            NewMask::Causal => DeviceMask::Causal,
            NewMask::Full => DeviceMask::Full,
            NewMask::Bits(_) => DeviceMask::Bits(self.bits.as_view()),
        }
    }
}
