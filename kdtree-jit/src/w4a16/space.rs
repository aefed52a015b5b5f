//! The default W4A16 variant space: the axes the templates read and the values worth tuning.
//!
//! Kept to what a tuning run compiles in seconds on a GPU machine (870 valid points on sm_90);
//! CI compiles every valid point for two archs.
//! The values are the ones that won somewhere in an exploration of ~60 configurations on the H200
//! (bf16, group 32, the four Kimi K2 shapes, M = 1..128; figures in NOTES.md):
//! - `bm`: gemv holds 1 or 4 rows of X in registers (8 would spill); stream 1, 4, 8 or 16 (one or
//!   two n8 tiles of the mma's B operand, and as many rows of X in each stage); mma 16, 32 or 64.
//! - `bn = 64`: one weight tile per warp; wider blocks never won by more than noise.
//! - `bk`: 128 or 256 K per stage; with `warps` 4 or 8 that is 2 or 4 k16 tiles per warp per stage
//!   (mma); stream's warps each have their own pipeline of `bk`-deep stages.
//! - `stages`: 1 means "no shared-memory pipeline" (gemv); 2 or 4 for mma and stream (stream's
//!   stages are per warp: 2 lets four blocks share an SM, and fits sm_120's 99 KiB).
//! - `split_k`: 2 or 4 fill 132 SMs when N / 64 alone gives too few blocks (N = 4096 at M = 1, 2;
//!   2 also evens out 288 column tiles over 132 SMs).

use crate::w4a16::{Acc, Algo};
use kdtree_quant::Dtype;

crate::variant_space! {
    /// One W4A16 GEMM kernel: `Y[M, N] = X[M, K] · dequant(W)[N, K]ᵀ`, int4 weights with one
    /// scale per (column of Y, group of K), X, Y and scales in `dtype`.
    pub space W4a16 {
        template = "w4a16_{algo}.cu.tera";
        name = "w4a16_{algo}_{dtype}_g{group_size}_m{bm}n{bn}k{bk}_w{warps}_s{stages}_sk{split_k}_{acc}acc";
        axes {
            /// tensor-core tiles, tensor-core streaming or CUDA-core streaming
            algo: Algo = [Mma, Stream, Gemv],
            /// activations, scales and output
            dtype: Dtype = [F16, Bf16],
            /// K elements per scale
            group_size: u32 = [32, 64, 128],
            /// type of the running sums
            acc: Acc = [F32, F16],
            /// rows of Y per block
            bm: u32 = [1, 4, 8, 16, 32, 64],
            /// columns of Y per block
            bn: u32 = [64],
            /// K per pipeline stage (mma: of the block, stream: of one warp) or per load step (gemv)
            bk: u32 = [128, 256],
            /// warps per block
            warps: u32 = [4, 8],
            /// cp.async pipeline depth (mma, stream); 1 = loads straight to registers (gemv)
            stages: u32 = [1, 2, 4],
            /// blocks along K, reduced deterministically through a workspace
            split_k: u32 = [1, 2, 4],
        }
        check = crate::w4a16::rules::check;
    }
}
