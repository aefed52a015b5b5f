//! The validity rule of the grouped space: stream's, for the stream variant of the same axes (tile
//! rows, stages, whole groups per stage, shared memory), plus the grouped kernel's static shared
//! memory, which counts against the same per-block limit.

use crate::w4a16::grouped::W4a16Grouped;
use crate::w4a16::rules::shared_bytes;
use crate::{Invalid, Target};

/// Static shared memory of the grouped kernel, an upper bound: the tile rows' X row indices (4 bytes
/// each) and split-K's flag, which the shared epilogue declares though the kernel never uses it.
pub const STATIC_SMEM: usize = 16 * 4 + 16;

/// Dynamic shared memory of a launch, in bytes: stream's (the warps' pipelines, or the reduction).
pub(crate) fn dynamic_smem(v: &W4a16Grouped) -> usize {
    shared_bytes(&v.stream())
}

/// `Ok` when `v` can run on `target`; otherwise the first reason it cannot.
pub(crate) fn check(v: &W4a16Grouped, target: &Target) -> Result<(), Invalid> {
    crate::w4a16::rules::check(&v.stream(), target)?;
    let requested = dynamic_smem(v) + STATIC_SMEM;
    let max = target.arch.smem_per_block_max();
    if requested > max {
        return Err(Invalid::SharedMemory { requested, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, Variant};

    fn valid(arch: u32) -> Vec<W4a16Grouped> {
        W4a16Grouped::valid(&Target { arch: Arch(arch) })
    }

    #[test]
    fn the_space_is_streams_without_split_k() {
        // 2 dtypes x 3 groups x 4 bm x 2 bk x 2 warps x 2 stages = 192 points; stream's rule keeps
        // 25 of each (dtype, group)'s 32 on sm_90, as in its own count (rules.rs of w4a16).
        assert_eq!(W4a16Grouped::all().len(), 192);
        let sm90 = valid(90);
        assert_eq!(sm90.len(), 2 * 3 * 25);
        // Every valid grouped point is a valid stream point, and the other way round (split-K 1).
        let target = Target { arch: Arch(90) };
        for v in &sm90 {
            assert!(v.stream().check(&target).is_ok(), "{}", v.name());
        }
        let stream_sk1 = crate::w4a16::W4a16::valid(&target)
            .into_iter()
            .filter(|s| s.algo == crate::w4a16::Algo::Stream && s.split_k == 1)
            .count();
        assert_eq!(stream_sk1, sm90.len());
        assert!(valid(120).len() < sm90.len());
    }

    #[test]
    fn names_read_as_the_issue_writes_them() {
        let sm90 = Target { arch: Arch(90) };
        let v = W4a16Grouped::default_for(kdtree_quant::Dtype::Bf16, 32, &sm90);
        assert_eq!(v.name(), "w4a16_grouped_bf16_g32_m8n64k128_w4_s4_f32acc");
        let sm120 = W4a16Grouped::default_for(kdtree_quant::Dtype::Bf16, 32, &Target { arch: Arch(120) });
        assert_eq!(sm120.name(), "w4a16_grouped_bf16_g32_m8n64k128_w4_s2_f32acc");
        assert_eq!(W4a16Grouped::from_name(&v.name()), Some(v));
        assert_eq!(v.template(), "w4a16_grouped.cu.tera");
        assert_eq!(W4a16Grouped::SPACE, "w4a16_grouped");
        for arch in [90, 120] {
            for g in [32, 64, 128] {
                for dtype in [kdtree_quant::Dtype::Bf16, kdtree_quant::Dtype::F16] {
                    let target = Target { arch: Arch(arch) };
                    assert!(W4a16Grouped::default_for(dtype, g, &target).check(&target).is_ok());
                }
            }
        }
    }

    #[test]
    fn every_invalid_point_says_why() {
        for arch in [90, 120] {
            for v in W4a16Grouped::all() {
                if let Err(reason) = v.check(&Target { arch: Arch(arch) }) {
                    assert!(!reason.to_string().is_empty(), "{}", v.name());
                }
            }
        }
    }
}
