//! The grouped W4A16 variant space: stream's axes less split-K (a block owns one tile of one expert
//! and its warps split K, as stream with `split_k = 1`).
//!
//! - `bm`: rows of a tile, 1, 4, 8 or 16 (stream's). Each expert's assignments are cut into tiles of
//!   `bm` rows; at K2's T = 1..64 most experts see one or two tokens, so small tiles waste less X
//!   traffic and fewer mma columns, and bigger ones stream each expert's weights fewer times when
//!   one expert takes many tokens.
//! - `bk`, `warps`, `stages`: stream's (K per stage of a warp's pipeline, warps splitting K, depth).
//! - `bn = 64` and `acc = f32`: the only values stream allows, kept as axes so that names read as
//!   stream's.

use kdtree_quant::Dtype;

use crate::w4a16::{Acc, Algo, W4a16};
use crate::{Target, Variant};

crate::variant_space! {
    /// One grouped W4A16 kernel: `Y[r] = X[row(r)] · dequant(W[expert(r)])ᵀ` over a table of
    /// (expert, start, rows) tiles, int4 weights with one scale per (column, group of K), X, Y and
    /// scales in `dtype`.
    pub space W4a16Grouped {
        template = "w4a16_grouped.cu.tera";
        name = "w4a16_grouped_{dtype}_g{group_size}_m{bm}n{bn}k{bk}_w{warps}_s{stages}_{acc}acc";
        axes {
            /// activations, scales and output
            dtype: Dtype = [F16, Bf16],
            /// K elements per scale
            group_size: u32 = [32, 64, 128],
            /// type of the running sums (stream's f32 only)
            acc: Acc = [F32],
            /// rows of a tile: the most assignments of one expert a block computes
            bm: u32 = [1, 4, 8, 16],
            /// columns of Y per block
            bn: u32 = [64],
            /// K per pipeline stage of one warp
            bk: u32 = [128, 256],
            /// warps per block, splitting K
            warps: u32 = [4, 8],
            /// cp.async pipeline depth per warp
            stages: u32 = [2, 4],
        }
        check = crate::w4a16::grouped::rules::check;
    }
}

impl W4a16Grouped {
    /// The stream variant of the same axes (no split-K): the per-tile algorithm this variant runs,
    /// whose validity rule, shared memory and weight layout it shares, and whose bits it reproduces
    /// row for row.
    pub fn stream(&self) -> W4a16 {
        W4a16 {
            algo: Algo::Stream,
            dtype: self.dtype,
            group_size: self.group_size,
            acc: self.acc,
            bm: self.bm,
            bn: self.bn,
            bk: self.bk,
            warps: self.warps,
            stages: self.stages,
            split_k: 1,
        }
    }

    /// The name of the template's second entry, which stores SwiGLU's product
    /// ([`Epilogue::Silu`](crate::w4a16::grouped::Epilogue::Silu)) in the same module.
    pub fn silu_name(&self) -> String {
        format!("{}_silu", self.name())
    }

    /// The engine's default until tuning picks per shape: 8-row tiles (a K2 expert sees 1..8 tokens at
    /// T <= 64), 4 warps, 128 K per stage, 4 stages, f32 sums: the stream point that won K2's down
    /// projection (7168 x 2048) at M = 8 on the H200 (`BENCHMARKS.md`; the gate-up shape's winner
    /// there had 8 warps and 2 stages, within 10%). Where 4 stages of pipelines do not fit the arch's
    /// shared memory (sm_120's 99 KiB), 2 stages. Valid on sm_90 and sm_120 for every group size
    /// and dtype.
    pub fn default_for(dtype: Dtype, group_size: u32, target: &Target) -> W4a16Grouped {
        let four = W4a16Grouped { dtype, group_size, acc: Acc::F32, bm: 8, bn: 64, bk: 128, warps: 4, stages: 4 };
        if four.check(target).is_ok() { four } else { W4a16Grouped { stages: 2, ..four } }
    }
}
