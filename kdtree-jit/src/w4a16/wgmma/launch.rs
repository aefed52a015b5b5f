//! Launching a wgmma variant. [`WgmmaKernel`] binds a variant to its loaded function (checked by name
//! when it is made), so no safe call can launch a function with another kernel's arguments.

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use crate::launch::{allow_shared, check_name, short_buffer};
use crate::w4a16::GemmBuffers;
use crate::w4a16::wgmma::rules::{WARPGROUP_N, shared_bytes, static_bytes};
use crate::w4a16::wgmma::{W4a16Wgmma, lengths};
use crate::{Cache, Compiled, Error, Gpu, Result, Variant, compile_variant};

/// (token tiles, feature tiles of the block): token tiles vary fastest, so blocks that read the
/// same weights run together and the weights come from DRAM once while M spans several tiles.
fn grid(v: &W4a16Wgmma, m: usize, n: usize) -> (usize, usize) {
    (m.div_ceil(v.bm as usize), n.div_ceil(v.bn as usize))
}

/// f32 elements of the workspace (of [`GemmBuffers`]) `v` needs for M = `m`: one counter per block,
/// then split-K's [split][M][N] partials; none without split-K. Their number grows with M, and
/// the partials start after them: zero the counters again before a launch of another M.
pub fn workspace_len(v: &W4a16Wgmma, m: usize, n: usize) -> usize {
    if v.split_k == 1 {
        return 0;
    }
    let (gx, gy) = grid(v, m, n);
    v.split_k as usize * m * n + gx * gy
}

/// Why `v` cannot compute an [m, k] x [n, k]ᵀ product, if it cannot.
fn unsupported(v: &W4a16Wgmma, m: usize, n: usize, k: usize) -> Option<String> {
    let g = v.group_size as usize;
    let int = |x: usize| i32::try_from(x).is_ok();
    if m == 0 || n == 0 || k == 0 {
        Some(format!("empty product {m} x {n} x {k}"))
    } else if !k.is_multiple_of(g) {
        Some(format!("K = {k} is not a multiple of the group size {g}"))
    } else if !int(m) || !int(n) || !int(k.next_multiple_of(64)) || grid(v, m, n).1 > 65_535 {
        Some(format!("{m} x {n} x {k} exceeds the kernel's index range"))
    } else {
        None
    }
}

/// True when `v` computes an [m, k] x [n, k]ᵀ product: K a multiple of the group size; any M and N.
pub fn supports(v: &W4a16Wgmma, m: usize, n: usize, k: usize) -> bool {
    unsupported(v, m, n, k).is_none()
}

/// A wgmma variant and its function, loaded on one GPU.
#[derive(Clone, Debug)]
pub struct WgmmaKernel {
    variant: W4a16Wgmma,
    function: CudaFunction,
}

impl WgmmaKernel {
    /// Binds `function` to `variant`: [`Error::WrongKernel`] unless its name is the variant's.
    pub fn new(variant: W4a16Wgmma, function: CudaFunction) -> Result<WgmmaKernel> {
        check_name(variant.name(), &function)?;
        Ok(WgmmaKernel { variant, function })
    }

    /// Loads `compiled` (the sm_90a cubin of `variant`) on `gpu` and binds it.
    pub fn load(gpu: &Gpu, variant: W4a16Wgmma, compiled: &Compiled) -> Result<WgmmaKernel> {
        WgmmaKernel::new(variant, gpu.load(compiled)?)
    }

    /// Compiles (through `cache`) `variant` for the arch-specific target of `gpu` (sm_90a on an H100
    /// or H200) and loads it.
    pub fn compile(gpu: &Gpu, variant: W4a16Wgmma, cache: Option<&Cache>) -> Result<WgmmaKernel> {
        WgmmaKernel::load(gpu, variant, &compile_variant(&variant, gpu.arch.specific(), cache)?)
    }

    pub fn variant(&self) -> &W4a16Wgmma {
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
        allow_shared(f, smem, static_bytes(v))?;
        let (gx, gy) = grid(v, m, n);
        let cfg = LaunchConfig {
            grid_dim: (gx as u32, gy as u32, v.split_k),
            block_dim: (v.bn / WARPGROUP_N * 128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (m, n, k) = (m as i32, n as i32, k as i32);
        let mut args = gpu.stream.launch_builder(f);
        let (x, mut y) = (b.x, b.y);
        args.arg(&x).arg(b.packed).arg(b.scales).arg(&mut y).arg(&mut *b.workspace).arg(&m).arg(&n).arg(&k);
        // SAFETY: `f` is `v`'s kernel (checked when bound), and the argument list matches the
        // template's kernel signature (x, packed, scales, y, workspace, m, n, k); every buffer was
        // checked above to hold what the kernel indexes.
        unsafe { args.launch(cfg) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supports_names_the_limits_and_tiles_tokens_fastest() {
        let v = W4a16Wgmma::from_name("w4a16_wgmma_bf16_g64_m128n128k128_s4_sk2_f32acc").expect("in the space");
        assert!(supports(&v, 1, 7, 64) && supports(&v, 300, 18432, 7168));
        assert!(!supports(&v, 16, 100, 96), "K not a multiple of 64");
        assert!(!supports(&v, 0, 100, 128));
        assert_eq!(grid(&v, 300, 18432), (3, 144));
        // A counter per block, then two splits of 300 x 18432 partials.
        assert_eq!(workspace_len(&v, 300, 18432), 2 * 300 * 18432 + 3 * 144);
        assert_eq!(workspace_len(&W4a16Wgmma { split_k: 1, ..v }, 300, 18432), 0);
    }
}
