//! Launching a [`Dense16`] variant: grid, shared memory and the split-K workspace.

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use crate::dense16::Dense16;
use crate::dense16::rules::shared_bytes;
use crate::launch::{allow_shared, check_name, short_buffer};
use crate::{Cache, Compiled, Error, Gpu, Result, Variant, compile_variant};

/// Rows of W a block owns.
const TILE_N: usize = 64;
/// An upper bound of the template's static shared memory (split-K's flag).
const STATIC_SMEM: usize = 1024;

/// The device buffers of one product of at most the variant's rows.
pub struct Dense16Buffers<'a> {
    /// X, `[m, k]` row-major 16-bit bits: a view, so a block of rows of a larger buffer can be one
    /// launch's X. 16-byte aligned.
    pub x: CudaView<'a, u16>,
    /// W, `[n, k]` row-major, as the checkpoint stores it. 16-byte aligned.
    pub w: CudaView<'a, u16>,
    /// Y, `[m, n]` row-major f32.
    pub y: CudaViewMut<'a, f32>,
    /// [`Dense16::workspace_len`] elements, zeroed once when allocated: the split-K tile counters
    /// live there and are left at zero.
    pub workspace: CudaViewMut<'a, f32>,
}

impl Dense16 {
    /// f32 elements of workspace a launch of `m` rows needs: one counter per 64-row tile of W
    /// (first, so one workspace zeroed once serves every M), then the split-K partials.
    pub fn workspace_len(&self, m: usize, n: usize) -> usize {
        if self.split_k == 1 { 0 } else { n.div_ceil(TILE_N) + self.split_k as usize * m * n }
    }

    /// Why this variant cannot compute an `[m, k] x [n, k]ᵀ` product in one launch, if it cannot.
    pub fn unsupported(&self, m: usize, n: usize, k: usize) -> Option<String> {
        let fits = |x: usize| i32::try_from(x).is_ok();
        if m == 0 || n == 0 || k == 0 {
            Some(format!("empty product {m} x {n} x {k}"))
        } else if !k.is_multiple_of(32) {
            Some(format!("K = {k} is not a multiple of 32"))
        } else if m > self.rows as usize {
            Some(format!("{} computes at most {} rows a launch, not {m}", self.name(), self.rows))
        } else if !fits(m) || !fits(n.saturating_mul(k)) || !fits(self.workspace_len(m, n)) {
            Some(format!("{m} x {n} x {k} exceeds the kernel's index range"))
        } else {
            None
        }
    }
}

/// A [`Dense16`] variant bound to its loaded function: the only way to launch one.
#[derive(Clone, Debug)]
pub struct Dense16Kernel {
    variant: Dense16,
    function: CudaFunction,
}

impl Dense16Kernel {
    /// Binds `function` to `variant`: [`Error::WrongKernel`] unless the function is the variant's.
    pub fn new(variant: Dense16, function: CudaFunction) -> Result<Dense16Kernel> {
        check_name(variant.name(), &function)?;
        Ok(Dense16Kernel { variant, function })
    }

    /// Loads `compiled` (the cubin of `variant`) on `gpu` and binds it.
    pub fn load(gpu: &Gpu, variant: Dense16, compiled: &Compiled) -> Result<Dense16Kernel> {
        Dense16Kernel::new(variant, gpu.load(compiled)?)
    }

    /// Compiles (through `cache`) and loads `variant` for `gpu`.
    pub fn compile(gpu: &Gpu, variant: Dense16, cache: Option<&Cache>) -> Result<Dense16Kernel> {
        let compiled = compile_variant(&variant, gpu.arch, cache)?;
        Dense16Kernel::load(gpu, variant, &compiled)
    }

    pub fn variant(&self) -> &Dense16 {
        &self.variant
    }

    /// Enqueues `Y = X · Wᵀ` of `m` rows (at most the variant's) on `gpu`'s stream.
    pub fn launch(&self, gpu: &Gpu, (m, n, k): (usize, usize, usize), b: Dense16Buffers) -> Result<()> {
        let (v, f) = (&self.variant, &self.function);
        let fail = |reason: String| Error::Unsupported { variant: v.name(), reason };
        if let Some(reason) = v.unsupported(m, n, k) {
            return Err(fail(reason));
        }
        let needs = [
            ("x", b.x.len(), m * k),
            ("w", b.w.len(), n * k),
            ("y", b.y.len(), m * n),
            ("workspace", b.workspace.len(), v.workspace_len(m, n)),
        ];
        if let Some(reason) = short_buffer(&needs) {
            return Err(fail(reason));
        }
        let smem = shared_bytes(v);
        allow_shared(f, smem, STATIC_SMEM)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(TILE_N) as u32, v.split_k, 1),
            block_dim: (v.warps * 32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (m, n, k) = (m as i32, n as i32, k as i32);
        let (x, w, mut y, mut workspace) = (b.x, b.w, b.y, b.workspace);
        let mut args = gpu.stream.launch_builder(f);
        args.arg(&x).arg(&w).arg(&mut y).arg(&mut workspace).arg(&m).arg(&n).arg(&k);
        // SAFETY: `f` is `v`'s kernel (checked when bound); the arguments are the template's (x, w,
        // y, workspace, m, n, k), and every buffer was checked above to hold what it indexes.
        unsafe { args.launch(cfg) }?;
        Ok(())
    }
}

/// One product on the host's data: uploads `x` (`[m, k]`) and `w` (`[n, k]`), runs `kernel` in
/// blocks of its rows, and returns Y (`[m, n]` f32). For tests and the tuner's gate.
pub fn dense16_host(
    gpu: &Gpu,
    kernel: &Dense16Kernel,
    x: &[u16],
    w: &[u16],
    (m, n, k): (usize, usize, usize),
) -> Result<Vec<f32>> {
    let s = &gpu.stream;
    let xd = s.clone_htod(&x[..m * k])?;
    let wd = s.clone_htod(&w[..n * k])?;
    let mut y = s.alloc_zeros::<f32>(m * n)?;
    let rows = kernel.variant().rows as usize;
    let mut workspace: CudaSlice<f32> = s.alloc_zeros(kernel.variant().workspace_len(rows.min(m), n).max(1))?;
    for start in (0..m).step_by(rows) {
        let r = rows.min(m - start);
        let b = Dense16Buffers {
            x: xd.slice(start * k..(start + r) * k),
            w: wd.as_view(),
            y: y.slice_mut(start * n..(start + r) * n),
            workspace: workspace.as_view_mut(),
        };
        kernel.launch(gpu, (r, n, k), b)?;
    }
    Ok(s.clone_dtoh(&y)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kdtree_quant::Dtype;

    #[test]
    fn workspace_holds_one_counter_per_tile_then_the_partials() {
        let v = Dense16 { dtype: Dtype::Bf16, rows: 8, warps: 4, unroll: 2, stages: 3, split_k: 4 };
        // N = 576: 9 tiles.
        assert_eq!(v.workspace_len(3, 576), 9 + 4 * 3 * 576);
        assert_eq!(Dense16 { split_k: 1, ..v }.workspace_len(3, 576), 0);
    }

    #[test]
    fn the_limits_are_named() {
        let v = Dense16 { dtype: Dtype::Bf16, rows: 16, warps: 4, unroll: 2, stages: 3, split_k: 1 };
        assert_eq!(v.unsupported(16, 100, 64), None);
        assert!(v.unsupported(17, 100, 64).unwrap().contains("at most 16 rows"));
        assert!(v.unsupported(1, 100, 48).unwrap().contains("not a multiple of 32"));
        assert!(v.unsupported(0, 100, 64).unwrap().contains("empty"));
        assert!(v.unsupported(1, 1 << 20, 1 << 12).unwrap().contains("index range"));
    }
}
