//! The validity rule of the wgmma space: the arch, the instruction's N, whole weight chunks per
//! stage, and shared memory. Mirrors the template's constants.

use crate::w4a16::wgmma::W4a16Wgmma;
use crate::w4a16::wgmma::layout::CHUNK_K;
use crate::{Arch, Invalid, Target};

/// Features of one consumer warpgroup: the 64 rows of m64nNk16.
pub(crate) const WARPGROUP_N: u32 = 64;

/// The template aligns its stages to the 1024-byte atoms of the 128-byte swizzle, and the dynamic
/// shared memory's start is only 16-byte aligned: it asks for this much more.
const ALIGN: usize = 1024;

/// Dynamic shared memory of a launch, in bytes: `stages` stages of X (bm x bk halves) and, per
/// warpgroup, its weight chunks (2 KiB per 64 x 64) and scale rows (128 bytes per group), each stage
/// rounded up to the swizzle atom.
pub(crate) fn shared_bytes(v: &W4a16Wgmma) -> usize {
    let (bm, bk, warpgroups) = (v.bm as usize, v.bk as usize, (v.bn / WARPGROUP_N) as usize);
    let scale_rows = (bk / v.group_size as usize).max(1);
    let stage = bm * bk * 2 + warpgroups * (bk / CHUNK_K * 2048 + scale_rows * 128);
    ALIGN + v.stages as usize * stage.div_ceil(ALIGN) * ALIGN
}

/// Static shared memory of a split-K variant: splitk.cuh's flag of the reducing block, rounded up
/// to what the allocator grants.
pub(crate) const SPLIT_K_STATIC: usize = 16;

/// Static shared memory of `v`'s kernel, in bytes: none but split-K's flag.
pub fn static_bytes(v: &W4a16Wgmma) -> usize {
    if v.split_k > 1 { SPLIT_K_STATIC } else { 0 }
}

/// The most 16-byte pieces of X a thread may copy per stage: 32 (bm 256, bk 128, one warpgroup)
/// spilled 176 bytes at 255 registers with NVRTC 13.5.
const MAX_X_COPIES: u32 = 16;

fn incompatible(reason: impl Into<String>) -> Result<(), Invalid> {
    Err(Invalid::Incompatible { reason: reason.into() })
}

/// `Ok` when `v` can run on `target`; otherwise the first reason it cannot.
pub(crate) fn check(v: &W4a16Wgmma, target: &Target) -> Result<(), Invalid> {
    if target.arch != Arch::SM_90A {
        return incompatible(format!(
            "wgmma is Hopper's arch-specific feature: compile for sm_90a (on an sm_90 device), not {}",
            target.arch
        ));
    }
    if !v.bm.is_multiple_of(16) || !(16..=256).contains(&v.bm) {
        return incompatible(format!(
            "bm = {} is the instruction's N: a multiple of 16 (8-row swizzle atoms of X, two per \
             16-token step) up to 256 (128 f32 accumulators a thread)",
            v.bm
        ));
    }
    let warpgroups = v.bn / WARPGROUP_N;
    if !v.bn.is_multiple_of(WARPGROUP_N) || ![1, 2, 4].contains(&warpgroups) {
        return incompatible(format!("bn = {} must be 64, 128 or 256: 1, 2 or 4 warpgroups of 64 features", v.bn));
    }
    if !(v.bk as usize).is_multiple_of(CHUNK_K) || v.bk == 0 {
        return incompatible(format!("bk = {} must hold whole 64-deep weight chunks", v.bk));
    }
    if !v.bk.is_multiple_of(v.group_size) && !v.group_size.is_multiple_of(v.bk) {
        return incompatible(format!(
            "bk = {} and group size {} do not nest: a stage must cover whole groups or lie in one",
            v.bk, v.group_size
        ));
    }
    // A 512-thread block has 128 registers a thread: bm / 2 sums and the in-flight fragments fit up
    // to bm 128 with one chunk a stage (bm 128 with two spilled 72 bytes with NVRTC 13.5).
    if warpgroups == 4 && (v.bm > 128 || (v.bm == 128 && v.bk as usize > CHUNK_K)) {
        return incompatible(format!(
            "4 warpgroups leave 128 registers a thread: bm = {} with bk = {} spills (at most bm 64, or 128 \
             with bk 64)",
            v.bm, v.bk
        ));
    }
    let copies = v.bm * v.bk / 8 / (warpgroups * 128);
    if copies > MAX_X_COPIES {
        return incompatible(format!(
            "each thread would copy {copies} 16-byte pieces of X a stage: their addresses and {} sums \
             spill (at most {MAX_X_COPIES}; take two warpgroups or a shallower stage)",
            v.bm / 2
        ));
    }
    if v.stages < 2 {
        return incompatible("the pipeline needs at least 2 stages");
    }
    if v.split_k == 0 {
        return incompatible("split_k = 0: a product needs at least one block along K");
    }
    let requested = shared_bytes(v) + static_bytes(v);
    let max = target.arch.smem_per_block_max();
    if requested > max {
        return Err(Invalid::SharedMemory { requested, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Variant;

    #[test]
    fn only_sm_90a_and_the_largest_pipelines_are_refused() {
        assert_eq!(W4a16Wgmma::all().len(), 2 * 3 * 5 * 3 * 2 * 2 * 3);
        assert!(W4a16Wgmma::valid(&Target { arch: Arch(90) }).is_empty());
        assert!(W4a16Wgmma::valid(&Target { arch: Arch(120) }).is_empty());
        let valid = W4a16Wgmma::valid(&Target { arch: Arch::SM_90A });
        // Per (dtype, group) and split: 60 points less the 4-stage bm 256 pipelines with bk 128 (276
        // and 296 KiB), the one whose single warpgroup copies 32 pieces of X a thread per stage
        // (spills), and the 4-warpgroup tiles beyond 128 registers a thread.
        let refused: Vec<String> = W4a16Wgmma::all()
            .into_iter()
            .filter(|v| v.dtype == kdtree_quant::Dtype::Bf16 && v.group_size == 32 && v.split_k == 2)
            .filter(|v| v.check(&Target { arch: Arch::SM_90A }).is_err())
            .map(|v| v.name())
            .collect();
        assert_eq!(
            refused,
            [
                "w4a16_wgmma_bf16_g32_m128n256k128_s2_sk2_f32acc",
                "w4a16_wgmma_bf16_g32_m128n256k128_s4_sk2_f32acc",
                "w4a16_wgmma_bf16_g32_m256n64k128_s2_sk2_f32acc",
                "w4a16_wgmma_bf16_g32_m256n64k128_s4_sk2_f32acc",
                "w4a16_wgmma_bf16_g32_m256n128k128_s4_sk2_f32acc",
                "w4a16_wgmma_bf16_g32_m256n256k64_s2_sk2_f32acc",
                "w4a16_wgmma_bf16_g32_m256n256k64_s4_sk2_f32acc",
                "w4a16_wgmma_bf16_g32_m256n256k128_s2_sk2_f32acc",
                "w4a16_wgmma_bf16_g32_m256n256k128_s4_sk2_f32acc",
            ]
        );
        assert_eq!(valid.len(), 6 * 3 * (60 - refused.len()));
    }

    #[test]
    fn shared_memory_is_aligned_stages_of_x_weights_and_scales() {
        let v = W4a16Wgmma::from_name("w4a16_wgmma_bf16_g32_m128n128k128_s4_sk1_f32acc").expect("in the space");
        // 4 stages x (128 x 128 halves + 2 warpgroups x (2 chunks of 2 KiB + 4 scale rows of 128)).
        assert_eq!(shared_bytes(&v), 1024 + 4 * (32768usize + 2 * (4096 + 512)).div_ceil(1024) * 1024);
        let g128 = W4a16Wgmma { group_size: 128, bk: 64, ..v };
        assert_eq!(shared_bytes(&g128), 1024 + 4 * (16384usize + 2 * (2048 + 128)).div_ceil(1024) * 1024);
        assert!(v.check(&Target { arch: Arch::SM_90A }).is_ok());
        let err = v.check(&Target { arch: Arch(90) }).unwrap_err().to_string();
        assert!(err.contains("sm_90a"), "{err}");
        // Split-K's flag is static shared memory, counted against the same limit.
        let split = W4a16Wgmma { split_k: 4, ..v };
        assert_eq!((static_bytes(&v), static_bytes(&split)), (0, SPLIT_K_STATIC));
        assert!(W4a16Wgmma { split_k: 0, ..v }.check(&Target { arch: Arch::SM_90A }).is_err());
    }

    #[test]
    fn every_invalid_point_says_why() {
        for arch in [Arch(90), Arch::SM_90A] {
            for v in W4a16Wgmma::all() {
                if let Err(reason) = v.check(&Target { arch }) {
                    assert!(!reason.to_string().is_empty(), "{}", v.name());
                }
            }
        }
    }
}
