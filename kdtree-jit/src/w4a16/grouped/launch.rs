//! Launching a grouped variant. [`GroupedKernel`] binds a variant to its loaded functions (the module
//! checked by name when it is made), so no safe call can launch a function with another kernel's
//! arguments.

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use kdtree_quant::QuantizedWeight;

use crate::launch::{allow_shared, short_buffer};
#[cfg(doc)]
use crate::w4a16::grouped::interleave_gate_up;
use crate::w4a16::grouped::rules::{STATIC_SMEM, dynamic_smem};
use crate::w4a16::grouped::{Alignment, W4a16Grouped, XRows, repack_experts, tile_bound};
use crate::w4a16::layout::lengths;
use crate::w4a16::rules::TILE_N;
use crate::{Cache, Compiled, Error, Gpu, Result, Variant, compile_variant};

/// Which X row each row of Y reads, on the device (see [`XRows`]).
pub enum DeviceRows<'a> {
    /// X row `index[r] / div`; `index` holds at least the rows of Y.
    Gather { index: CudaView<'a, u32>, div: usize },
    /// X row r.
    Identity,
}

/// The device buffers of one grouped product.
pub struct GroupedBuffers<'a> {
    /// X, [x_rows, K] row-major, activation dtype bits.
    pub x: CudaView<'a, u16>,
    pub rows: DeviceRows<'a>,
    /// The experts' words, stacked ([`repack_experts`]).
    pub packed: &'a CudaSlice<u32>,
    /// The experts' scales, stacked.
    pub scales: &'a CudaSlice<u16>,
    /// `[bound][3]` u32 tiles (expert, start, rows), `bound` = [`tile_bound`]`(experts, y rows, bm)`.
    pub tiles: CudaView<'a, u32>,
    /// Its first element: how many tiles are valid.
    pub tile_count: CudaView<'a, u32>,
    /// Y, [y_rows, N] row-major, activation dtype bits: row r is sorted position r.
    pub y: CudaViewMut<'a, u16>,
}

/// The sizes of one grouped product: `experts` weights of [n, k]; X of `x_rows` rows; Y of `y_rows`
/// rows (the assignments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupedShape {
    pub experts: usize,
    pub n: usize,
    pub k: usize,
    pub x_rows: usize,
    pub y_rows: usize,
}

/// A grouped variant and its two entries, loaded on one GPU.
pub struct GroupedKernel {
    variant: W4a16Grouped,
    /// `{name}`: stores Y.
    function: CudaFunction,
    /// `{name}_silu`: stores SwiGLU's product of Y's interleaved gate-up pairs.
    silu: CudaFunction,
}

/// What a launch stores: Y, or silu(gate) * up of a gate-up weight in [`interleave_gate_up`]'s layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// Y, [y_rows, N].
    Store,
    /// `[y_rows, N / 2]`: feature f is `silu(Y[.., f]) * Y[.., N / 2 + f]` of the weight before
    /// interleaving, each sum rounded to the dtype first, as [`Epilogue::Store`] followed by
    /// kdtree-kernels' `silu_mul_halves_bf16` gives it, bit for bit. N even.
    Silu,
}

impl Epilogue {
    /// Columns of the output for a weight of `n` rows.
    pub fn cols(self, n: usize) -> usize {
        match self {
            Epilogue::Store => n,
            Epilogue::Silu => n / 2,
        }
    }
}

impl GroupedKernel {
    /// Loads `compiled`, which must be `variant`'s kernel (its function name is the variant's name),
    /// with both of its template's entries.
    pub fn load(gpu: &Gpu, variant: W4a16Grouped, compiled: &Compiled) -> Result<GroupedKernel> {
        if compiled.name != variant.name() {
            return Err(Error::Unsupported {
                variant: variant.name(),
                reason: format!("the cubin given holds `{}`", compiled.name),
            });
        }
        let [function, silu] = gpu.load_entries(compiled, [compiled.name.clone(), variant.silu_name()])?;
        Ok(GroupedKernel { variant, function, silu })
    }

    /// Compiles (through `cache`) and loads `variant` for `gpu`.
    pub fn compile(gpu: &Gpu, variant: W4a16Grouped, cache: Option<&Cache>) -> Result<GroupedKernel> {
        let compiled = compile_variant(&variant, gpu.arch, cache)?;
        GroupedKernel::load(gpu, variant, &compiled)
    }

    pub fn variant(&self) -> &W4a16Grouped {
        &self.variant
    }

    /// Enqueues `Y[r] = X[row(r)] · dequant(W[e(r)])ᵀ` for every row r of every valid tile on `gpu`'s
    /// stream, stored as `epilogue` says. Rows of Y in no tile are left as they are. The tile table
    /// comes from the device and cannot be checked here; the kernel skips entries whose expert or rows
    /// are out of range.
    pub fn launch(&self, gpu: &Gpu, epilogue: Epilogue, s: GroupedShape, b: GroupedBuffers) -> Result<()> {
        let v = &self.variant;
        let fail = |reason: String| Error::Unsupported { variant: v.name(), reason };
        let GroupedShape { experts, n, k, x_rows, y_rows } = s;
        if y_rows == 0 {
            return Ok(());
        }
        let g = v.group_size as usize;
        if experts == 0 || n == 0 || k == 0 || x_rows == 0 {
            return Err(fail(format!("empty product: {experts} experts of {n} x {k}, {x_rows} rows of X")));
        }
        if epilogue == Epilogue::Silu && !n.is_multiple_of(2) {
            return Err(fail(format!("the SiLU epilogue pairs gate and up columns: N = {n} is odd")));
        }
        if !k.is_multiple_of(g) {
            return Err(fail(format!("K = {k} is not a multiple of the group size {g}")));
        }
        let bound = tile_bound(experts, y_rows, v.bm as usize);
        let int = |x: usize| i32::try_from(x).is_ok();
        if bound > 65_535 || ![n, k, x_rows, y_rows, experts].into_iter().all(int) {
            return Err(fail(format!("{experts} experts, {y_rows} rows of {n} x {k} exceed the kernel's index range")));
        }
        let (packed_len, scales_len) = lengths(n, k, g);
        let mut needs = vec![
            ("x", b.x.len(), x_rows * k),
            ("packed", b.packed.len(), experts * packed_len),
            ("scales", b.scales.len(), experts * scales_len),
            ("tiles", b.tiles.len(), 3 * bound),
            ("tile_count", b.tile_count.len(), 1),
            ("y", b.y.len(), y_rows * epilogue.cols(n)),
        ];
        let (rows_of, row_div) = match &b.rows {
            DeviceRows::Gather { index, div } => {
                needs.push(("the row index", index.len(), y_rows));
                if *div == 0 || !int(*div) {
                    return Err(fail(format!("a row index divided by {div}")));
                }
                (index, *div as i32)
            }
            // Not read with row_div 0; any device buffer serves as the pointer.
            DeviceRows::Identity => (&b.tiles, 0),
        };
        if let Some(reason) = short_buffer(&needs) {
            return Err(fail(reason));
        }
        let function = match epilogue {
            Epilogue::Store => &self.function,
            Epilogue::Silu => &self.silu,
        };
        let smem = dynamic_smem(v);
        allow_shared(function, smem, STATIC_SMEM)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(TILE_N as usize) as u32, bound as u32, 1),
            block_dim: (v.warps * 32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (x_rows, y_rows, experts, n, k) = (x_rows as i32, y_rows as i32, experts as i32, n as i32, k as i32);
        let mut args = gpu.stream.launch_builder(function);
        let mut y = b.y;
        args.arg(&b.x).arg(b.packed).arg(b.scales).arg(&mut y).arg(&b.tiles).arg(&b.tile_count).arg(rows_of);
        args.arg(&row_div).arg(&x_rows).arg(&y_rows).arg(&experts).arg(&n).arg(&k);
        // SAFETY: `function` is an entry of this variant's module (checked by name when loaded); both
        // entries have the signature
        // (x, packed, scales, y, tiles, tile_count, rows_of, row_div, x_rows, y_rows, experts, n, k).
        // Every buffer was checked above to hold what the kernel may index: X x_rows rows (the kernel
        // zero-fills rows past it), the experts' weights, `bound` tiles (the grid's y), the row index
        // y_rows entries (read only when row_div > 0), Y y_rows rows of the epilogue's columns (n / 2,
        // n even, for the SiLU entry; the kernel skips tiles past them).
        unsafe { args.launch(cfg) }?;
        Ok(())
    }
}

/// One grouped product from host data, for tests and correctness gates: stacks and uploads the
/// experts (for [`Epilogue::Silu`], in [`interleave_gate_up`]'s layout), uploads X, the row index and
/// `a`'s tiles, launches and returns the output ([sorted rows, `epilogue.cols(n)`] bits of the
/// activation dtype; rows in no tile are zero).
#[allow(clippy::too_many_arguments)]
pub fn grouped_host(
    gpu: &Gpu,
    kernel: &GroupedKernel,
    epilogue: Epilogue,
    x: &[u16],
    k: usize,
    rows: XRows,
    experts: &[QuantizedWeight],
    a: &Alignment,
) -> Result<Vec<u16>> {
    let v = kernel.variant();
    let d = repack_experts(v, experts)?;
    let n = experts[0].n;
    let cols = epilogue.cols(n);
    let s = &gpu.stream;
    let y_rows = a.sorted.len();
    let bound = tile_bound(experts.len(), y_rows, v.bm as usize).max(1);
    let mut tiles = a.tile_words();
    if a.tiles.len() > bound {
        return Err(Error::Unsupported {
            variant: v.name(),
            reason: format!("{} tiles, bound {bound}", a.tiles.len()),
        });
    }
    tiles.resize(3 * bound, 0);
    let (xd, packed, scales) = (s.clone_htod(x)?, s.clone_htod(&d.packed)?, s.clone_htod(&d.scales)?);
    let (tiles, count) = (s.clone_htod(&tiles)?, s.clone_htod(&[a.tiles.len() as u32])?);
    let index = match rows {
        XRows::Gather { index, .. } => s.clone_htod(index)?,
        XRows::Identity => s.clone_htod(&[0u32])?,
    };
    let mut y = s.alloc_zeros::<u16>((y_rows * cols).max(1))?;
    let device_rows = match rows {
        XRows::Gather { div, .. } => DeviceRows::Gather { index: index.as_view(), div },
        XRows::Identity => DeviceRows::Identity,
    };
    let shape = GroupedShape { experts: experts.len(), n, k, x_rows: x.len() / k, y_rows };
    let b = GroupedBuffers {
        x: xd.as_view(),
        rows: device_rows,
        packed: &packed,
        scales: &scales,
        tiles: tiles.as_view(),
        tile_count: count.as_view(),
        y: y.as_view_mut(),
    };
    kernel.launch(gpu, epilogue, shape, b)?;
    let mut out = s.clone_dtoh(&y)?;
    out.truncate(y_rows * cols);
    Ok(out)
}
