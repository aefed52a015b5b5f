//! The default W4A16 variant space: the axes the templates read and the values worth tuning.
//!
//! Kept small on purpose (about 160 valid points on sm_90): CI compiles every valid point for two
//! archs. The values follow from the kernels' structure:
//! - `bm`: gemv holds 1, 2 or 4 rows of X in registers (8 rows would spill at 8 loads in flight);
//!   mma covers 16, 32 or 64 rows per block (a warp's accumulators for 64 x 64 are 128 registers).
//! - `bn`: one 64-column weight tile per warp; 128 puts two warps side by side on N.
//! - `bk = 128`: eight k16 tiles a step, i.e. eight 16-byte loads in flight per gemv lane, and two
//!   or more k16 tiles per mma warp per stage with 4 warps.
//! - `stages`: 1 means "no shared-memory pipeline" (gemv), 4 hides HBM latency for mma.
//! - `split_k`: 4 fills 132 SMs when N / bn alone gives too few blocks (N = 4096, 7168).

use crate::w4a16::{Acc, Algo};
use kdtree_quant::Dtype;

crate::variant_space! {
    /// One W4A16 GEMM kernel: `Y[M, N] = X[M, K] · dequant(W)[N, K]ᵀ`, int4 weights with one
    /// scale per (column of Y, group of K), X, Y and scales in `dtype`.
    pub space W4a16 {
        template = "w4a16_{algo}.cu.tera";
        name = "w4a16_{algo}_{dtype}_g{group_size}_m{bm}n{bn}k{bk}_w{warps}_s{stages}_sk{split_k}_{acc}acc";
        axes {
            /// tensor-core tiles or CUDA-core streaming
            algo: Algo = [Mma, Gemv],
            /// activations, scales and output
            dtype: Dtype = [F16, Bf16],
            /// K elements per scale
            group_size: u32 = [32, 64, 128],
            /// type of the running sums
            acc: Acc = [F32, F16],
            /// rows of Y per block
            bm: u32 = [1, 2, 4, 16, 32, 64],
            /// columns of Y per block
            bn: u32 = [64, 128],
            /// K per pipeline stage (mma) or per load step (gemv)
            bk: u32 = [128],
            /// warps per block
            warps: u32 = [4],
            /// cp.async pipeline depth (mma); 1 = loads straight to registers (gemv)
            stages: u32 = [1, 4],
            /// blocks along K, reduced deterministically through a workspace
            split_k: u32 = [1, 4],
        }
        check = crate::w4a16::rules::check;
    }
}
