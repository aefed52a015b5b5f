//! The W4A16 GEMM `Y[M, N] = X[M, K] · dequant(W)[N, K]ᵀ`: its variant space, validity rule,
//! weight layout and launch.
//!
//! | concept | where |
//! |---|---|
//! | the declared space (axes, names, templates) | [`W4a16`] in [`space`] |
//! | which points are valid, and why not | `rules::check` |
//! | the weight layout all three algorithms read, and its CPU repack | [`layout`] |
//! | how a variant launches: grid, block, shared memory, split-K workspace | `launch` |
//! | random problems and the tolerance against the CPU reference | [`accuracy`] |
//! | the Hopper `wgmma` family (sm_90a), its own space, layout and launch | [`wgmma`] |
//! | every dense family as one variant type (what the tuner and the engine pick from) and one launch | [`dense`] |
//!
//! Three algorithms render from `templates/w4a16_{algo}.cu.tera`:
//! - [`Algo::Mma`]: tensor-core tiles (`mma.sync` m16n8k16, `ldmatrix`, a `cp.async` pipeline), for
//!   any M; rows are padded to the tile.
//! - [`Algo::Stream`]: tensor-core weight streaming for M <= its `bm` (at most 8, or 16): weights are the
//!   mma's A operand and X its 8-row B operand, each warp streams its own K range through its own
//!   pipeline, and scales apply in f32 to each group's sums.
//! - [`Algo::Gemv`]: CUDA-core streaming for M <= its `bm` (at most 4), where padding a 16-row
//!   tensor-core tile would be mostly waste.
//!
//! ```no_run
//! use kdtree_jit::w4a16::dense::{DenseFamily, DenseKernel};
//! use kdtree_jit::w4a16::{Acc, Algo, GemmBuffers, W4a16};
//! use kdtree_jit::{Gpu, compile_variant};
//! use kdtree_quant::{Dtype, QuantizedWeight};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let v = W4a16 { algo: Algo::Mma, dtype: Dtype::Bf16, group_size: 32, acc: Acc::F32,
//!                 bm: 16, bn: 64, bk: 128, warps: 4, stages: 4, split_k: 1 };
//! let gpu = Gpu::open(0)?;
//! let kernel = DenseKernel::load(&gpu, v, &compile_variant(&v, gpu.arch, None)?)?;
//! let (m, n, k) = (1, 256, 512);
//! let w: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 - 6.0).collect();
//! let qw = QuantizedWeight::quantize(&w, n, k, 32, Dtype::Bf16)?;
//! let dev = v.repack(&qw)?;
//! let x = gpu.stream.clone_htod(&vec![0x3f80u16; m * k])?; // bf16 ones
//! let packed = gpu.stream.clone_htod(&dev.packed)?;
//! let scales = gpu.stream.clone_htod(&dev.scales)?;
//! let mut y = gpu.stream.alloc_zeros::<u16>(m * n)?;
//! let mut workspace = gpu.stream.alloc_zeros::<f32>(v.workspace_len(m, n).max(1))?;
//! let b = GemmBuffers { x: x.as_view(), packed: &packed, scales: &scales, y: y.as_view_mut(), workspace: &mut workspace };
//! kernel.launch(&gpu, m, n, k, b)?;
//! # Ok(()) }
//! ```

pub mod accuracy;
pub mod dense;
pub mod grouped;
pub(crate) mod launch;
pub mod layout;
pub(crate) mod rules;
pub mod space;
pub mod wgmma;

use serde::{Deserialize, Serialize};

use crate::AxisValue;

pub use accuracy::{RandomGemm, tolerance};
pub use dense::GemmBuffers;
pub(crate) use layout::DeviceWeights;
pub use layout::{repack, unpack};
pub use space::W4a16;

/// How a variant computes: tensor-core tiles, tensor-core weight streaming, or CUDA-core streaming.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    Mma,
    Stream,
    Gemv,
}

impl Algo {
    /// True for the algorithms that compute at most their `bm` rows (their rows live in registers).
    pub fn has_row_limit(self) -> bool {
        matches!(self, Algo::Stream | Algo::Gemv)
    }
}

impl AxisValue for Algo {
    fn as_str(&self) -> &'static str {
        match self {
            Algo::Mma => "mma",
            Algo::Stream => "stream",
            Algo::Gemv => "gemv",
        }
    }
}

/// The type products are summed in. F16 only pairs with f16 activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Acc {
    F32,
    F16,
}

impl AxisValue for Acc {
    fn as_str(&self) -> &'static str {
        match self {
            Acc::F32 => "f32",
            Acc::F16 => "f16",
        }
    }
}
