//! The validity rule of the W4A16 space: which points can render, compile and run, and why not.
//! Checked before rendering, so an invalid point never reaches NVRTC.

use kdtree_quant::Dtype;

use crate::w4a16::{Acc, Algo, W4a16};
use crate::{Invalid, Target};

/// Columns of one weight tile of the layout: what one warp owns.
pub(crate) const TILE_N: u32 = 64;
/// K of one weight tile: one mma k-step, one 16-byte vector per lane.
pub(crate) const TILE_K: u32 = 16;

/// Dynamic shared memory of a launch, in bytes: the mma or stream pipelines (or the cross-warp
/// reduction, whichever is larger), or the gemv cross-warp reduction. Mirrors the templates' constants.
pub(crate) fn shared_bytes(v: &W4a16) -> usize {
    let (bm, bn, bk, warps) = (v.bm as usize, v.bn as usize, v.bk as usize, v.warps as usize);
    let column_reduction = warps * bm * TILE_N as usize * 4;
    match v.algo {
        Algo::Gemv => column_reduction,
        Algo::Stream => {
            // Per warp and stage: bk / 16 weight tiles of 512 bytes, 64 scales per group, and bm
            // rows of X padded by 16 bytes.
            let stage =
                bk / TILE_K as usize * 512 + bk / v.group_size as usize * TILE_N as usize * 2 + bm * (2 * bk + 16);
            (warps * v.stages as usize * stage).max(column_reduction)
        }
        Algo::Mma => {
            let scale_rows = (bk / v.group_size as usize).max(1);
            let stage = bm * bk * 2 + bn * bk / 2 + scale_rows * bn * 2;
            let warps_n = bn / TILE_N as usize;
            let warps_k = warps / warps_n;
            let reduction = (warps_k - 1) * warps_n * (bm / 16) * 8 * 4 * 32 * 4;
            (v.stages as usize * stage).max(reduction)
        }
    }
}

fn incompatible(reason: impl Into<String>) -> Result<(), Invalid> {
    Err(Invalid::Incompatible { reason: reason.into() })
}

/// `Ok` when `v` can run on `target`; otherwise the first reason it cannot.
pub(crate) fn check(v: &W4a16, target: &Target) -> Result<(), Invalid> {
    if v.acc == Acc::F16 && v.dtype == Dtype::Bf16 {
        return incompatible("f16 accumulation needs f16 activations: bf16 products do not fit f16's range");
    }
    if v.acc == Acc::F16 && v.split_k > 1 {
        return incompatible(
            "f16 accumulation with split-K: partials are exchanged in f32, so it only adds a rounding",
        );
    }
    if !v.bn.is_multiple_of(TILE_N) || v.bn == 0 {
        return incompatible(format!("bn = {} is not a multiple of the {TILE_N}-column weight tile", v.bn));
    }
    if !v.bk.is_multiple_of(TILE_K) || v.bk == 0 {
        return incompatible(format!("bk = {} is not a multiple of {TILE_K}", v.bk));
    }
    if !v.bk.is_multiple_of(v.group_size) && !v.group_size.is_multiple_of(v.bk) {
        return incompatible(format!(
            "bk = {} and group size {} do not nest: a step must cover whole groups or lie in one",
            v.bk, v.group_size
        ));
    }
    match v.algo {
        Algo::Gemv => check_gemv(v)?,
        Algo::Stream => check_stream(v)?,
        Algo::Mma => check_mma(v)?,
    }
    let requested = shared_bytes(v);
    let max = target.arch.smem_per_block_max();
    if requested > max {
        return Err(Invalid::SharedMemory { requested, max });
    }
    Ok(())
}

fn check_gemv(v: &W4a16) -> Result<(), Invalid> {
    if v.bm > 4 {
        return incompatible(format!(
            "gemv keeps bm rows of X and their sums in registers: bm = {} would spill (at most 4)",
            v.bm
        ));
    }
    if v.bn != TILE_N {
        return incompatible("gemv blocks own one 64-column tile (their warps split K): bn must be 64");
    }
    if v.stages != 1 {
        return incompatible("gemv loads straight into registers: stages must be 1");
    }
    if !v.bk.is_multiple_of(v.group_size) {
        return incompatible(format!("gemv applies scales per step: bk = {} must hold whole groups", v.bk));
    }
    if v.bk > 128 {
        return incompatible("gemv keeps a step's weights in registers: bk above 128 would spill");
    }
    Ok(())
}

fn check_stream(v: &W4a16) -> Result<(), Invalid> {
    if v.acc != Acc::F32 {
        return incompatible(
            "stream starts each group's sums at -(magic + 8) x sum(X), far beyond f16 precision: f32 accumulation only",
        );
    }
    if v.bm > 8 && v.bm != 16 {
        return incompatible(format!(
            "stream's rows are the columns of one or two n8 B tiles (32 registers of sums each): \
             bm = {} must be at most 8, or 16",
            v.bm
        ));
    }
    if v.bn != TILE_N {
        return incompatible("stream blocks own one 64-column tile (their warps split K): bn must be 64");
    }
    if v.stages < 2 {
        return incompatible("the stream pipeline needs at least 2 stages");
    }
    if !v.bk.is_multiple_of(v.group_size) {
        return incompatible(format!(
            "stream scales whole groups within a stage: bk = {} must hold whole groups",
            v.bk
        ));
    }
    Ok(())
}

fn check_mma(v: &W4a16) -> Result<(), Invalid> {
    if !v.bm.is_multiple_of(16) || v.bm > 64 {
        return incompatible(format!(
            "mma tiles are m16: bm = {} must be 16, 32, 48 or 64 (a warp holds all bm rows)",
            v.bm
        ));
    }
    if v.stages < 2 {
        return incompatible("the mma pipeline needs at least 2 stages");
    }
    let warps_n = v.bn / TILE_N;
    if !v.warps.is_multiple_of(warps_n) {
        return incompatible(format!("{} warps cannot split into {warps_n} warps along N", v.warps));
    }
    let warps_k = v.warps / warps_n;
    if !(v.bk / TILE_K).is_multiple_of(warps_k) || v.bk / TILE_K / warps_k < 2 {
        return incompatible(format!(
            "bk = {} gives {} k16 tiles per stage, which the {warps_k} warps along K cannot share \
             evenly with at least 2 each",
            v.bk,
            v.bk / TILE_K
        ));
    }
    if v.bm == 64 && v.bk / TILE_K / warps_k > 2 {
        return incompatible(
            "a warp holding 64 x 64 accumulators has registers for 2 k16 tiles per stage, not more (spills)",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, Variant};

    fn count(arch: u32) -> usize {
        W4a16::valid(&Target { arch: Arch(arch) }).len()
    }

    #[test]
    fn default_space_is_modest_and_shrinks_with_shared_memory() {
        let (sm90, sm120) = (count(90), count(120));
        // Per group: (f16|bf16, f32 acc) x split-K 1|2|4 x (4 gemv + 16 mma + 25 stream) + (f16,
        // f16 acc, no split-K) x (4 gemv + 16 mma). Stream: bm 1|4|8|16 x bk 128|256 x 4|8 warps x
        // 2|4 stages, less the 7 whose pipelines outgrow 227 KiB (bm 16 and bk 256 ones, mostly).
        assert_eq!(sm90, 3 * (2 * 3 * (4 + 16 + 25) + (4 + 16)));
        // sm_120's 99 KiB drops 56 mma points (the largest tiles with bk = 256) and 264 stream points.
        assert_eq!(sm120, sm90 - 56 - 264);
    }

    #[test]
    fn every_invalid_point_says_why() {
        let target = Target { arch: Arch(120) };
        for v in W4a16::all() {
            if let Err(reason) = v.check(&target) {
                assert!(!reason.to_string().is_empty(), "{}", v.name());
            }
        }
    }

    #[test]
    fn stream_shared_memory_is_one_pipeline_per_warp() {
        let v = W4a16::from_name("w4a16_stream_bf16_g32_m8n64k128_w8_s4_sk1_f32acc").expect("in the space");
        // 8 warps x 4 stages x (8 tiles of 512 bytes + 4 groups x 64 scales + 8 rows of 128 + 8 X halves)
        assert_eq!(shared_bytes(&v), 8 * 4 * (4096 + 512 + 8 * 272));
        assert!(v.check(&Target { arch: Arch(90) }).is_ok());
        let f16_sums = W4a16 { acc: Acc::F16, dtype: Dtype::F16, ..v };
        assert!(f16_sums.check(&Target { arch: Arch(90) }).unwrap_err().to_string().contains("f32 accumulation"));
    }

    #[test]
    fn bf16_with_f16_accumulation_is_rejected() {
        let v = W4a16::from_name("w4a16_gemv_bf16_g32_m1n64k128_w4_s1_sk1_f16acc").expect("in the space");
        let err = v.check(&Target { arch: Arch(90) }).unwrap_err();
        assert!(err.to_string().contains("f16 accumulation"), "{err}");
    }

    #[test]
    fn shared_memory_matches_the_mma_pipeline() {
        let v = W4a16::from_name("w4a16_mma_bf16_g32_m32n64k256_w4_s4_sk1_f32acc").expect("in the space");
        // 4 stages x (32x256 X halves + 64x256 nibbles + 8 groups x 64 scales)
        assert_eq!(shared_bytes(&v), 4 * (16384 + 8192 + 1024));
        assert_eq!(
            v.check(&Target { arch: Arch(120) }),
            Err(Invalid::SharedMemory { requested: 102_400, max: 101_376 })
        );
        assert!(v.check(&Target { arch: Arch(90) }).is_ok());
    }
}
