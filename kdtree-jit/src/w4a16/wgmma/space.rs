//! The wgmma W4A16 variant space (sm_90a only): Hopper's warpgroup MMA with the weight as the
//! register A operand, for M = 16..256 where `mma.sync` tiles are issue-bound.
//!
//! - `bm`: tokens per block, the instruction's N (m64n{bm}k16): 16..256. A block dequantizes each
//!   weight once for all of its `bm` tokens, so larger tiles do less ALU work per flop; each thread
//!   holds `bm / 2` f32 accumulators.
//! - `bn`: features per block, 64 per consumer warpgroup (the instruction's 64 rows): 1, 2 or 4
//!   warpgroups sharing one X tile (4: the X tile is read from L2 once per 256 features).
//! - `bk`: K per pipeline stage, whole 64-deep weight chunks (one 16-byte vector a thread each).
//! - `stages`: shared-memory stages. At 4 with `bk` 128, a stage's last wgmmas keep running into
//!   the next stage's dequantize, and loads run 2 ahead; otherwise loads run `stages - 1` ahead and
//!   the tensor cores wait at each stage's end (with one chunk a stage, the next stage's fragments
//!   would overwrite the registers those wgmmas read). 3 stages were measured and never won.
//! - `split_k`: blocks along K, summed in split order through a workspace: Kimi K2's 18432-feature
//!   weights give 144 blocks of 128 features, two waves on 132 SMs, the second nearly empty.
//! - `acc = f32`: the only value (wgmma's f32 accumulators), kept as an axis so that names read as
//!   the other families'.

use kdtree_quant::Dtype;

use crate::w4a16::Acc;

crate::variant_space! {
    /// One wgmma W4A16 kernel: `Y[M, N] = X[M, K] · dequant(W)[N, K]ᵀ`, int4 weights with one scale
    /// per (column of Y, group of K), X, Y and scales in `dtype`.
    pub space W4a16Wgmma {
        template = "w4a16_wgmma.cu.tera";
        name = "w4a16_wgmma_{dtype}_g{group_size}_m{bm}n{bn}k{bk}_s{stages}_sk{split_k}_{acc}acc";
        axes {
            /// activations, scales and output
            dtype: Dtype = [F16, Bf16],
            /// K elements per scale
            group_size: u32 = [32, 64, 128],
            /// type of the sums (wgmma's f32 accumulators)
            acc: Acc = [F32],
            /// tokens per block: the wgmma instruction's N
            bm: u32 = [16, 32, 64, 128, 256],
            /// features per block: 64 per consumer warpgroup
            bn: u32 = [64, 128, 256],
            /// K per pipeline stage
            bk: u32 = [64, 128],
            /// shared-memory stages (4 overlaps the wgmmas across stages at bk 128)
            stages: u32 = [2, 4],
            /// blocks along K
            split_k: u32 = [1, 2, 4],
        }
        check = crate::w4a16::wgmma::rules::check;
    }
}
