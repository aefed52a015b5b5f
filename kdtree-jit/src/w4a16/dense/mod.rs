//! Every dense W4A16 family as one variant type, so that the tuner picks between families per
//! (shape, M) and the engine runs whichever won: the tiles of [`W4a16`] (mma, stream, gemv; sm_80 to
//! sm_120) and Hopper's [`W4a16Wgmma`] (compiled for sm_90a on an sm_90 device).
//!
//! A family is a [`DenseFamily`]: its kernels share one signature and one launch ([`DenseKernel`]),
//! and differ in what the trait asks (the weight layout, the target, the grid). A new family
//! implements it and adds its arm to [`DenseVariant`].
//!
//! Batch invariance, per family (what the engine's exact mode needs: a row's result must not depend
//! on M): every variant of both families sums each output over K in an order fixed by its own axes
//! and K (warps along K, split-K in split order, wgmma's k16 steps in order), and rows never mix: a
//! variant computes a row's bits whatever M is. The two families' orders differ, so exact mode
//! runs one variant for every M. Row-limited tiles (stream, gemv) run more rows in blocks of `bm`.

mod kernel;

use std::fmt::Debug;

use kdtree_quant::{Dtype, QuantizedWeight};

use crate::w4a16::wgmma::W4a16Wgmma;
use crate::w4a16::{DeviceWeights, W4a16};
use crate::{Arch, Invalid, Result, Target, Variant};

pub use kernel::{DenseKernel, GemmBuffers};

/// What a dense W4A16 family's variants tell the tuner, the engine and [`DenseKernel::launch`].
/// Every family's kernel computes `Y = X · dequant(W)ᵀ` with the signature (x, packed, scales, y,
/// workspace, m, n, k), so one launch serves them all.
pub trait DenseFamily: crate::DynVariant + Debug + Send + Sync {
    /// The target it compiles for on a device of `device` (its plain arch, sm_90 for an H200).
    fn compile_arch(&self, device: Arch) -> Arch;

    /// The weight layout it reads.
    fn layout(&self) -> Layout;

    /// The dtype of X, Y and the scales.
    fn dtype(&self) -> Dtype;

    /// K elements per scale.
    fn group_size(&self) -> usize;

    /// Rows of X per block.
    fn block_rows(&self) -> usize;

    /// The most rows one launch computes, if it is limited (their rows live in registers).
    fn row_limit(&self) -> Option<usize>;

    /// f32 elements of the workspace one launch of `m` rows needs: split-K's tile counters, then
    /// its partials; none without split-K.
    fn workspace_len(&self, m: usize, n: usize) -> usize;

    /// The largest error against the CPU reference it may show and still be correct.
    fn tolerance(&self) -> f64;

    /// `w` in the layout it reads: the weight's group size and scale dtype must be the variant's.
    fn repack(&self, w: &QuantizedWeight) -> Result<DeviceWeights>;

    /// The weight back from its layout: the inverse of [`Self::repack`].
    fn unpack(&self, d: &DeviceWeights, n: usize, k: usize) -> Result<QuantizedWeight>;

    /// Lengths of the repacked (packed, scales) of an [n, k] weight: what a launch checks its
    /// buffers against.
    fn lengths(&self, n: usize, k: usize) -> (usize, usize);

    /// Blocks of a launch of `m` rows, along (x, y, z).
    fn grid(&self, m: usize, n: usize) -> (usize, usize, usize);

    /// Threads per block.
    fn threads(&self) -> u32;

    /// Dynamic shared memory per block, in bytes.
    fn shared_bytes(&self) -> usize;

    /// Static shared memory of its kernel, in bytes (an upper bound): with the dynamic, whether a
    /// launch must opt in to more than 48 KiB.
    fn static_bytes(&self) -> usize;

    /// Why it cannot compute an [m, k] x [n, k]ᵀ product, if it cannot.
    fn unsupported(&self, m: usize, n: usize, k: usize) -> Option<String> {
        let g = self.group_size();
        // The kernels index M, N and K (padded to wgmma's 64-deep chunks, the most a layout pads) in
        // i32, and the grid's y is at most 65535.
        let int = |x: usize| i32::try_from(x).is_ok();
        if m == 0 || n == 0 || k == 0 {
            Some(format!("empty product {m} x {n} x {k}"))
        } else if !k.is_multiple_of(g) {
            Some(format!("K = {k} is not a multiple of the group size {g}"))
        } else if let Some(rows) = self.row_limit()
            && m > rows
        {
            Some(format!("it computes at most {rows} rows, not {m}"))
        } else if !int(m) || !int(n) || !int(k.next_multiple_of(64)) || self.grid(m, n).1 > 65_535 {
            Some(format!("{m} x {n} x {k} exceeds the kernel's index range"))
        } else {
            None
        }
    }

    /// True when it computes an [m, k] x [n, k]ᵀ product.
    fn supports(&self, m: usize, n: usize, k: usize) -> bool {
        self.unsupported(m, n, k).is_none()
    }

    /// [`crate::DynVariant::check`] against the target it compiles for on `device`.
    fn check_on(&self, device: Arch) -> std::result::Result<(), Invalid> {
        self.check(&Target { arch: self.compile_arch(device) })
    }
}

/// Which weight layout a variant reads: the tiles' shared one, or wgmma's regrouping of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    Tiles,
    Wgmma,
}

/// A dense W4A16 GEMM variant of any family. Its name is its family's (`w4a16_mma_...`,
/// `w4a16_wgmma_...`), so tuning DB entries name it as they always did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenseVariant {
    Tiles(W4a16),
    Wgmma(W4a16Wgmma),
}

impl From<W4a16> for DenseVariant {
    fn from(v: W4a16) -> DenseVariant {
        DenseVariant::Tiles(v)
    }
}

impl From<W4a16Wgmma> for DenseVariant {
    fn from(v: W4a16Wgmma) -> DenseVariant {
        DenseVariant::Wgmma(v)
    }
}

impl DenseVariant {
    /// The variant as its family: the one place that tells the families apart.
    fn family(&self) -> &dyn DenseFamily {
        match self {
            DenseVariant::Tiles(v) => v,
            DenseVariant::Wgmma(v) => v,
        }
    }

    /// The variants that can run on a device of `device` (its plain arch, sm_90 for an H200), each
    /// checked for the target it compiles for: the tiles valid there, and on sm_90 the wgmma variants
    /// valid for sm_90a.
    pub fn valid_on(device: Arch) -> Vec<DenseVariant> {
        DenseVariant::all().into_iter().filter(|v| v.check_on(device).is_ok()).collect()
    }
}

impl DenseFamily for DenseVariant {
    fn compile_arch(&self, device: Arch) -> Arch {
        self.family().compile_arch(device)
    }

    fn layout(&self) -> Layout {
        self.family().layout()
    }

    fn dtype(&self) -> Dtype {
        self.family().dtype()
    }

    fn group_size(&self) -> usize {
        self.family().group_size()
    }

    fn block_rows(&self) -> usize {
        self.family().block_rows()
    }

    fn row_limit(&self) -> Option<usize> {
        self.family().row_limit()
    }

    fn workspace_len(&self, m: usize, n: usize) -> usize {
        self.family().workspace_len(m, n)
    }

    fn tolerance(&self) -> f64 {
        self.family().tolerance()
    }

    fn repack(&self, w: &QuantizedWeight) -> Result<DeviceWeights> {
        self.family().repack(w)
    }

    fn unpack(&self, d: &DeviceWeights, n: usize, k: usize) -> Result<QuantizedWeight> {
        self.family().unpack(d, n, k)
    }

    fn lengths(&self, n: usize, k: usize) -> (usize, usize) {
        self.family().lengths(n, k)
    }

    fn grid(&self, m: usize, n: usize) -> (usize, usize, usize) {
        self.family().grid(m, n)
    }

    fn threads(&self) -> u32 {
        self.family().threads()
    }

    fn shared_bytes(&self) -> usize {
        self.family().shared_bytes()
    }

    fn static_bytes(&self) -> usize {
        self.family().static_bytes()
    }
}

impl Variant for DenseVariant {
    /// The tiles' space name, which the tuning DB's entries and messages have always used.
    const SPACE: &'static str = W4a16::SPACE;

    fn template(&self) -> String {
        self.family().template()
    }

    fn name(&self) -> String {
        self.family().name()
    }

    fn context(&self) -> tera::Context {
        self.family().context()
    }

    fn all() -> Vec<Self> {
        let tiles = W4a16::all().into_iter().map(DenseVariant::from);
        tiles.chain(W4a16Wgmma::all().into_iter().map(DenseVariant::from)).collect()
    }

    /// Against `target` as given: a wgmma variant is valid for sm_90a only (see
    /// [`DenseFamily::check_on`]).
    fn check(&self, target: &Target) -> std::result::Result<(), Invalid> {
        self.family().check(target)
    }

    /// The family's variant of that name; [`Variant::all`]'s names are unique across families.
    fn from_name(name: &str) -> Option<Self> {
        W4a16::from_name(name).map(DenseVariant::from).or_else(|| W4a16Wgmma::from_name(name).map(DenseVariant::from))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

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

    #[test]
    fn no_two_variants_of_the_families_share_a_name() {
        // `from_name` asks the families in turn: a name two families made would parse as the first's.
        let all = DenseVariant::all();
        let names: HashSet<String> = all.iter().map(Variant::name).collect();
        assert_eq!(names.len(), all.len());
    }
}
