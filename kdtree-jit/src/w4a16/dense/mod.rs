//! Every dense W4A16 family as one variant type, so that the tuner picks between families per
//! (shape, M) and the engine runs whichever won: the tiles of [`W4a16`] (mma, stream, gemv; sm_80 to
//! sm_120) and Hopper's [`W4a16Wgmma`] (compiled for sm_90a on an sm_90 device).
//!
//! Batch invariance, per family (what the engine's exact mode needs: a row's result must not depend
//! on M): every variant of both families sums each output over K in an order fixed by its own axes
//! and K (warps along K, split-K in split order, wgmma's k16 steps in order), and rows never mix: a
//! variant computes a row's bits whatever M is. The two families' orders differ, so exact mode
//! runs one variant for every M. Row-limited tiles (stream, gemv) run more rows in blocks of `bm`.

use kdtree_quant::{Dtype, QuantizedWeight};

use crate::w4a16::wgmma::{self, W4a16Wgmma, WgmmaKernel};
use crate::w4a16::{self, DeviceWeights, GemmBuffers, W4a16, W4a16Kernel, accuracy};
use crate::{Arch, Compiled, Gpu, Invalid, Result, Target, Variant};

/// A dense W4A16 GEMM variant of any family. Its name is its family's (`w4a16_mma_...`,
/// `w4a16_wgmma_...`), so tuning DB entries name it as they always did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenseVariant {
    Tiles(W4a16),
    Wgmma(W4a16Wgmma),
}

/// Which weight layout a variant reads: the tiles' shared one, or wgmma's regrouping of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    Tiles,
    Wgmma,
}

impl DenseVariant {
    /// The variants that can run on a device of `device` (its plain arch, sm_90 for an H200): the
    /// tiles valid there, and on sm_90 the wgmma variants valid for sm_90a.
    pub fn valid_on(device: Arch) -> Vec<DenseVariant> {
        let tiles = W4a16::valid(&Target { arch: device }).into_iter().map(DenseVariant::Tiles);
        let wgmma = match device.capability() == 90 {
            true => W4a16Wgmma::valid(&Target { arch: device.specific() }),
            false => Vec::new(),
        };
        tiles.chain(wgmma.into_iter().map(DenseVariant::Wgmma)).collect()
    }

    /// The target it compiles for on a device of `device`: wgmma needs the arch-specific one.
    pub fn compile_arch(&self, device: Arch) -> Arch {
        match self {
            DenseVariant::Tiles(_) => device,
            DenseVariant::Wgmma(_) => device.specific(),
        }
    }

    /// [`Variant::check`] against the target it compiles for on `device`.
    pub fn check_on(&self, device: Arch) -> std::result::Result<(), Invalid> {
        self.check(&Target { arch: self.compile_arch(device) })
    }

    pub fn layout(&self) -> Layout {
        match self {
            DenseVariant::Tiles(_) => Layout::Tiles,
            DenseVariant::Wgmma(_) => Layout::Wgmma,
        }
    }

    pub fn dtype(&self) -> Dtype {
        match self {
            DenseVariant::Tiles(v) => v.dtype,
            DenseVariant::Wgmma(v) => v.dtype,
        }
    }

    /// K elements per scale.
    pub fn group_size(&self) -> usize {
        match self {
            DenseVariant::Tiles(v) => v.group_size as usize,
            DenseVariant::Wgmma(v) => v.group_size as usize,
        }
    }

    /// Rows of X per block: a tile's `bm`, wgmma's token tile.
    pub fn block_rows(&self) -> usize {
        match self {
            DenseVariant::Tiles(v) => v.bm as usize,
            DenseVariant::Wgmma(v) => v.bm as usize,
        }
    }

    /// The most rows one launch computes, if it is limited (stream and gemv tiles: their `bm`).
    pub fn row_limit(&self) -> Option<usize> {
        match self {
            DenseVariant::Tiles(v) if v.algo.has_row_limit() => Some(v.bm as usize),
            _ => None,
        }
    }

    /// True when it computes an [m, k] x [n, k]ᵀ product.
    pub fn supports(&self, m: usize, n: usize, k: usize) -> bool {
        match self {
            DenseVariant::Tiles(v) => w4a16::supports(v, m, n, k),
            DenseVariant::Wgmma(v) => wgmma::supports(v, m, n, k),
        }
    }

    /// f32 elements of the workspace one launch of `m` rows needs.
    pub fn workspace_len(&self, m: usize, n: usize) -> usize {
        match self {
            DenseVariant::Tiles(v) => w4a16::workspace_len(v, m, n),
            DenseVariant::Wgmma(v) => wgmma::workspace_len(v, m, n),
        }
    }

    /// The largest error against the CPU reference it may show and still be correct.
    pub fn tolerance(&self) -> f64 {
        match self {
            DenseVariant::Tiles(v) => accuracy::tolerance(v),
            DenseVariant::Wgmma(v) => accuracy::tolerance_for(v.dtype, v.acc),
        }
    }

    /// `w` in the layout it reads.
    pub fn repack(&self, w: &QuantizedWeight) -> Result<DeviceWeights> {
        match self {
            DenseVariant::Tiles(v) => w4a16::repack(v, w),
            DenseVariant::Wgmma(v) => wgmma::repack(v, w),
        }
    }

    /// The weight back from its layout: the inverse of [`Self::repack`].
    pub fn unpack(&self, d: &DeviceWeights, n: usize, k: usize) -> Result<QuantizedWeight> {
        match self {
            DenseVariant::Tiles(v) => w4a16::unpack(v, d, n, k),
            DenseVariant::Wgmma(v) => wgmma::unpack(v, d, n, k),
        }
    }
}

impl Variant for DenseVariant {
    /// The tiles' space name, which the tuning DB's entries and messages have always used.
    const SPACE: &'static str = W4a16::SPACE;

    fn template(&self) -> String {
        match self {
            DenseVariant::Tiles(v) => v.template(),
            DenseVariant::Wgmma(v) => v.template(),
        }
    }

    fn name(&self) -> String {
        match self {
            DenseVariant::Tiles(v) => v.name(),
            DenseVariant::Wgmma(v) => v.name(),
        }
    }

    fn context(&self) -> tera::Context {
        match self {
            DenseVariant::Tiles(v) => v.context(),
            DenseVariant::Wgmma(v) => v.context(),
        }
    }

    fn all() -> Vec<Self> {
        let tiles = W4a16::all().into_iter().map(DenseVariant::Tiles);
        tiles.chain(W4a16Wgmma::all().into_iter().map(DenseVariant::Wgmma)).collect()
    }

    /// Against `target` as given: a wgmma variant is valid for sm_90a only (see [`Self::check_on`]).
    fn check(&self, target: &Target) -> std::result::Result<(), Invalid> {
        match self {
            DenseVariant::Tiles(v) => v.check(target),
            DenseVariant::Wgmma(v) => v.check(target),
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        W4a16::from_name(name).map(DenseVariant::Tiles).or_else(|| W4a16Wgmma::from_name(name).map(DenseVariant::Wgmma))
    }
}

/// A dense variant bound to its loaded function.
#[derive(Clone, Debug)]
pub enum DenseKernel {
    Tiles(W4a16Kernel),
    Wgmma(WgmmaKernel),
}

impl DenseKernel {
    /// Binds `function` to `variant`: an error unless its name is the variant's.
    pub fn new(variant: DenseVariant, function: cudarc::driver::CudaFunction) -> Result<DenseKernel> {
        Ok(match variant {
            DenseVariant::Tiles(v) => DenseKernel::Tiles(W4a16Kernel::new(v, function)?),
            DenseVariant::Wgmma(v) => DenseKernel::Wgmma(WgmmaKernel::new(v, function)?),
        })
    }

    /// Loads `compiled` (the cubin of `variant` for [`DenseVariant::compile_arch`]) and binds it.
    pub fn load(gpu: &Gpu, variant: DenseVariant, compiled: &Compiled) -> Result<DenseKernel> {
        DenseKernel::new(variant, gpu.load(compiled)?)
    }

    pub fn variant(&self) -> DenseVariant {
        match self {
            DenseKernel::Tiles(k) => DenseVariant::Tiles(*k.variant()),
            DenseKernel::Wgmma(k) => DenseVariant::Wgmma(*k.variant()),
        }
    }

    /// Enqueues `Y = X · dequant(W)ᵀ`; `b.packed` and `b.scales` must be in the variant's layout.
    pub fn launch(&self, gpu: &Gpu, m: usize, n: usize, k: usize, b: GemmBuffers) -> Result<()> {
        match self {
            DenseKernel::Tiles(kernel) => kernel.launch(gpu, m, n, k, b),
            DenseKernel::Wgmma(kernel) => kernel.launch(gpu, m, n, k, b),
        }
    }

    /// One GEMM from host data: repacks `w` into the variant's layout, uploads, launches and
    /// returns Y ([m, n] bits of the activation dtype). For tests and correctness gates, not speed.
    pub fn gemm_host(&self, gpu: &Gpu, x: &[u16], m: usize, w: &QuantizedWeight) -> Result<Vec<u16>> {
        let v = self.variant();
        let d = v.repack(w)?;
        let s = &gpu.stream;
        let (xd, packed, scales) = (s.clone_htod(x)?, s.clone_htod(&d.packed)?, s.clone_htod(&d.scales)?);
        let mut y = s.alloc_zeros::<u16>(m * w.n)?;
        let mut workspace = s.alloc_zeros::<f32>(v.workspace_len(m, w.n).max(1))?;
        let b = GemmBuffers {
            x: xd.as_view(),
            packed: &packed,
            scales: &scales,
            y: y.as_view_mut(),
            workspace: &mut workspace,
        };
        self.launch(gpu, m, w.n, w.k, b)?;
        Ok(s.clone_dtoh(&y)?)
    }
}

impl From<W4a16Kernel> for DenseKernel {
    fn from(kernel: W4a16Kernel) -> DenseKernel {
        DenseKernel::Tiles(kernel)
    }
}

impl From<WgmmaKernel> for DenseKernel {
    fn from(kernel: WgmmaKernel) -> DenseKernel {
        DenseKernel::Wgmma(kernel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_families_are_offered_on_sm_90_and_names_parse_back() {
        let sm90 = DenseVariant::valid_on(Arch(90));
        let wgmma = sm90.iter().filter(|v| v.layout() == Layout::Wgmma).count();
        assert_eq!(wgmma, W4a16Wgmma::valid(&Target { arch: Arch::SM_90A }).len());
        assert_eq!(sm90.len() - wgmma, W4a16::valid(&Target { arch: Arch(90) }).len());
        assert!(DenseVariant::valid_on(Arch(120)).iter().all(|v| v.layout() == Layout::Tiles));
        for v in sm90.iter().step_by(97) {
            assert_eq!(DenseVariant::from_name(&v.name()), Some(*v));
            assert!(v.check_on(Arch(90)).is_ok(), "{}", v.name());
        }
        let w = DenseVariant::from_name("w4a16_wgmma_bf16_g32_m64n128k128_s4_sk2_f32acc").expect("a wgmma name");
        assert_eq!((w.compile_arch(Arch(90)), w.row_limit()), (Arch::SM_90A, None));
        assert!(w.check(&Target { arch: Arch(90) }).is_err(), "plain sm_90 has no wgmma");
        let gemv = DenseVariant::from_name("w4a16_gemv_bf16_g32_m1n64k128_w4_s1_sk1_f16acc").expect("a gemv name");
        assert_eq!((gemv.compile_arch(Arch(90)), gemv.row_limit()), (Arch(90), Some(1)));
        assert_eq!(DenseVariant::from_name("w4a16_nothing"), None);
    }
}
