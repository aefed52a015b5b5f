//! Launching a W4A16 variant: grid, block, shared memory and the split-K workspace.

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use crate::launch::{allow_shared, check_name, short_buffer};
use crate::w4a16::layout::lengths;
use crate::w4a16::rules::{TILE_N, shared_bytes};
use crate::w4a16::{Algo, W4a16};
use crate::{AxisValue, Compiled, Error, Gpu, Result, Variant};

/// The device buffers of one GEMM. `workspace` must hold [`workspace_len`] elements and be zeroed
/// once when allocated: split-K variants keep their tile counters there and leave them at zero.
pub struct GemmBuffers<'a> {
    /// X, [M, K] row-major, activation dtype bits: a view, so that a block of rows of a larger
    /// buffer can be one launch's X.
    pub x: CudaView<'a, u16>,
    /// [`crate::w4a16::DeviceWeights::packed`].
    pub packed: &'a CudaSlice<u32>,
    /// [`crate::w4a16::DeviceWeights::scales`].
    pub scales: &'a CudaSlice<u16>,
    /// Y, [M, N] row-major, activation dtype bits.
    pub y: CudaViewMut<'a, u16>,
    pub workspace: &'a mut CudaSlice<f32>,
}

/// An upper bound of the templates' static shared memory (split-K's 16-byte flag): it counts
/// against the 48 KiB a launch may use without opting in, so a launch of exactly 48 KiB dynamic
/// needs the opt-in.
const STATIC_SMEM: usize = 1024;

fn grid(v: &W4a16, m: usize, n: usize) -> (usize, usize, usize) {
    let ntiles = n.div_ceil(TILE_N as usize);
    match v.algo {
        Algo::Gemv | Algo::Stream => (ntiles, v.split_k as usize, 1),
        Algo::Mma => (m.div_ceil(v.bm as usize), ntiles.div_ceil((v.bn / TILE_N) as usize), v.split_k as usize),
    }
}

/// f32 elements of workspace a launch needs: one counter per output tile, then the split-K partials.
/// The counters come first: gemv and stream keep one per 64-column tile, whatever M, so one
/// workspace zeroed once serves them at every M up to its size; mma's grow with M (zero again
/// before a launch of another M).
pub fn workspace_len(v: &W4a16, m: usize, n: usize) -> usize {
    if v.split_k == 1 {
        return 0;
    }
    let (gx, gy, _) = grid(v, m, n);
    let tiles = match v.algo {
        Algo::Gemv | Algo::Stream => gx,
        Algo::Mma => gx * gy,
    };
    v.split_k as usize * m * n + tiles
}

/// Why `v` cannot compute an [m, k] x [n, k]ᵀ product, if it cannot.
fn unsupported(v: &W4a16, m: usize, n: usize, k: usize) -> Option<String> {
    let g = v.group_size as usize;
    let int = |x: usize| i32::try_from(x).is_ok();
    if m == 0 || n == 0 || k == 0 {
        Some(format!("empty product {m} x {n} x {k}"))
    } else if !k.is_multiple_of(g) {
        Some(format!("K = {k} is not a multiple of the group size {g}"))
    } else if v.algo.has_row_limit() && m > v.bm as usize {
        Some(format!("{} with bm = {} computes at most {} rows, not {m}", v.algo.as_str(), v.bm, v.bm))
    } else if !int(m) || !int(n) || !int(k) || grid(v, m, n).1 > 65_535 {
        Some(format!("{m} x {n} x {k} exceeds the kernel's index range"))
    } else {
        None
    }
}

/// True when `v` computes an [m, k] x [n, k]ᵀ product: K a multiple of the group size, M within
/// gemv's or stream's rows. Any N (padded to 64 by the layout) and any M for mma.
pub fn supports(v: &W4a16, m: usize, n: usize, k: usize) -> bool {
    unsupported(v, m, n, k).is_none()
}

/// A W4A16 variant bound to its loaded function: the only way to launch one, so that no function
/// runs with an argument list that is not its own.
#[derive(Clone, Debug)]
pub struct W4a16Kernel {
    variant: W4a16,
    function: CudaFunction,
}

impl W4a16Kernel {
    /// Binds `function` to `variant`: [`Error::WrongKernel`] unless the function's name (which the
    /// templates make the variant's) is the variant's.
    pub fn new(variant: W4a16, function: CudaFunction) -> Result<W4a16Kernel> {
        check_name(variant.name(), &function)?;
        Ok(W4a16Kernel { variant, function })
    }

    /// Loads `compiled` (the cubin of `variant`) on `gpu` and binds it.
    pub fn load(gpu: &Gpu, variant: W4a16, compiled: &Compiled) -> Result<W4a16Kernel> {
        W4a16Kernel::new(variant, gpu.load(compiled)?)
    }

    pub fn variant(&self) -> &W4a16 {
        &self.variant
    }

    /// Enqueues `Y = X · dequant(W)ᵀ` on `gpu`'s stream.
    pub fn launch(&self, gpu: &Gpu, m: usize, n: usize, k: usize, b: GemmBuffers) -> Result<()> {
        let (v, f) = (&self.variant, &self.function);
        let fail = |reason: String| Error::Unsupported { variant: v.name(), reason };
        if let Some(reason) = unsupported(v, m, n, k) {
            return Err(fail(reason));
        }
        let (packed_len, scales_len) = lengths(n, k, v.group_size as usize);
        let needs = [
            ("x", b.x.len(), m * k),
            ("packed", b.packed.len(), packed_len),
            ("scales", b.scales.len(), scales_len),
            ("y", b.y.len(), m * n),
            ("workspace", b.workspace.len(), workspace_len(v, m, n)),
        ];
        if let Some(reason) = short_buffer(&needs) {
            return Err(fail(reason));
        }
        let smem = shared_bytes(v);
        allow_shared(f, smem, STATIC_SMEM)?;
        let (gx, gy, gz) = grid(v, m, n);
        let cfg = LaunchConfig {
            grid_dim: (gx as u32, gy as u32, gz as u32),
            block_dim: (v.warps * 32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (m, n, k) = (m as i32, n as i32, k as i32);
        let mut args = gpu.stream.launch_builder(f);
        let (x, mut y) = (b.x, b.y);
        args.arg(&x).arg(b.packed).arg(b.scales).arg(&mut y).arg(b.workspace).arg(&m).arg(&n).arg(&k);
        // SAFETY: `f` is `v`'s kernel (checked when bound), and the argument list matches the
        // templates' kernel signature (x, packed, scales, y, workspace, m, n, k); every buffer was
        // checked above to hold what the kernel indexes.
        unsafe { args.launch(cfg) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_holds_partials_and_one_counter_per_tile() {
        let v = W4a16::from_name("w4a16_mma_bf16_g32_m16n64k128_w4_s4_sk4_f32acc").expect("in the space");
        // M = 20 -> 2 row blocks; N = 300 -> 5 column tiles.
        assert_eq!(workspace_len(&v, 20, 300), 4 * 20 * 300 + 2 * 5);
        let g = W4a16::from_name("w4a16_gemv_bf16_g32_m1n64k128_w4_s1_sk1_f32acc").expect("in the space");
        assert_eq!(workspace_len(&g, 1, 300), 0);
        // Stream blocks own a column tile, whatever M: 5 tiles.
        let s = W4a16::from_name("w4a16_stream_bf16_g32_m16n64k128_w4_s4_sk4_f32acc").expect("in the space");
        assert_eq!(workspace_len(&s, 13, 300), 4 * 13 * 300 + 5);
    }

    #[test]
    fn supports_names_the_limits() {
        let g = W4a16::from_name("w4a16_gemv_f16_g64_m4n64k128_w4_s1_sk4_f32acc").expect("in the space");
        assert!(supports(&g, 4, 100, 192));
        assert!(!supports(&g, 5, 100, 192), "gemv rows");
        assert!(!supports(&g, 4, 100, 160), "K not a multiple of 64");
        assert!(!supports(&g, 0, 100, 192));
        let m = W4a16::from_name("w4a16_mma_f16_g64_m16n64k128_w4_s4_sk1_f32acc").expect("in the space");
        assert!(supports(&m, 1000, 7, 64));
        let s = W4a16::from_name("w4a16_stream_f16_g32_m8n64k128_w4_s4_sk1_f32acc").expect("in the space");
        assert!(supports(&s, 8, 100, 96));
        assert!(!supports(&s, 9, 100, 96), "stream rows");
    }
}
