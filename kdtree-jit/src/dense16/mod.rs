//! 16-bit weights streamed on the tensor cores: `Y[M, N] = X[M, K] · W[N, K]ᵀ` for the few rows of a
//! decode step or a small tree, W and X in bf16 or f16 as the checkpoint stores W (no repacking, no
//! second copy), Y and the sums in f32 as the engine's cuBLAS path computes them.
//!
//! A decode step of Kimi K2 reads its attention projections, shared experts, dense layers and
//! lm_head in bf16; cuBLAS at M = 1 reads the small ones far from copy bandwidth. This family is
//! tuned per (shape, M bucket) beside cuBLAS and used where it wins.
//!
//! | concept | where |
//! |---|---|
//! | the variant space and which points fit an arch | [`Dense16`], `rules` |
//! | the CPU reference | [`reference`](mod@reference) |
//! | the launch, a host round trip | [`Dense16Kernel`], [`dense16_host`] |
//!
//! The kernel (`templates/dense16_stream.cu.tera`): a block owns 64 rows of W, its warps and
//! `split_k` blocks split K into contiguous shares summed in a fixed order, so a row of Y depends on
//! its row of X, K and the variant alone: a tree row equals the same row computed alone.
//!
//! ```no_run
//! use kdtree_jit::dense16::{Dense16, Dense16Kernel, dense16_host};
//! use kdtree_jit::{Gpu, Target};
//! use kdtree_quant::Dtype;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = Gpu::open(0)?;
//! let kernel = Dense16Kernel::compile(&gpu, Dense16::default_for(Dtype::Bf16), None)?;
//! let (m, n, k) = (1, 576, 7168);
//! let x = vec![0x3f80u16; m * k]; // bf16 ones
//! let w = vec![0x3f80u16; n * k];
//! let y = dense16_host(&gpu, &kernel, &x, &w, (m, n, k))?; // [m, n] f32, each 7168
//! # Ok(()) }
//! ```

pub mod launch;
pub mod reference;
pub(crate) mod rules;

pub use launch::{Dense16Buffers, Dense16Kernel, dense16_host};

use kdtree_quant::Dtype;

use crate::{Arch, Target, Variant};

crate::variant_space! {
    /// One streamed 16-bit GEMM kernel for at most `rows` rows of X.
    ///
    /// - `rows`: 8, 16 or 32: the mma's n8 tiles of X; more rows run in blocks of `rows`, one
    ///   launch each (each re-reads W).
    /// - `warps`: 4 or 8 along K in a block of 64 weight rows.
    /// - `unroll`: 1 or 2 32-wide K chunks a pipeline stage holds.
    /// - `stages`: 2, 3 or 4 stages in each warp's cp.async ring: `stages - 1` in flight while one is
    ///   multiplied (bytes in flight a warp: `(stages - 1) x unroll x (8 + rows / 8) x 512`).
    /// - `split_k`: 1 to 16 blocks along K, for shapes with few 64-row tiles (576 x 7168 has 9).
    pub space Dense16 {
        template = "dense16_stream.cu.tera";
        name = "dense16_{dtype}_r{rows}_w{warps}_u{unroll}_s{stages}_sk{split_k}";
        axes {
            /// weights, activations (Y is f32)
            dtype: Dtype = [F16, Bf16],
            /// rows of X a launch takes
            rows: u32 = [8, 16, 32],
            /// warps per block, along K
            warps: u32 = [4, 8],
            /// 32-wide K chunks a stage holds
            unroll: u32 = [1, 2],
            /// stages of each warp's cp.async ring
            stages: u32 = [2, 3, 4],
            /// blocks along K, reduced deterministically through a workspace
            split_k: u32 = [1, 2, 4, 8, 16],
        }
        check = crate::dense16::rules::check;
    }
}

impl Dense16 {
    /// The variants of `dtype` valid on `arch`.
    pub fn valid_on(arch: Arch, dtype: Dtype) -> Vec<Dense16> {
        Dense16::valid(&Target { arch }).into_iter().filter(|v| v.dtype == dtype).collect()
    }

    /// A point valid on every arch of the toolkit, for examples and tests: 8 rows, 4 warps, 3
    /// stages of one chunk, split-K 4. The engine runs a variant only where the tuner chose it.
    pub fn default_for(dtype: Dtype) -> Dense16 {
        Dense16 { dtype, rows: 8, warps: 4, unroll: 1, stages: 3, split_k: 4 }
    }
}
