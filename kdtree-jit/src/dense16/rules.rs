//! Which [`Dense16`] points fit an arch: shared memory, the warps' cp.async rings (which the block's
//! reduction reuses once they are drained).

use crate::dense16::Dense16;
use crate::{Invalid, Target};

/// Bytes of one warp's ring: `stages` stages of `unroll` chunks, each chunk 8 weight pieces and one
/// X piece per n8 tile, 16 bytes a lane.
pub(crate) fn ring_bytes(v: &Dense16) -> usize {
    (v.stages * v.unroll * (8 + v.rows / 8) * 32 * 16) as usize
}

/// Dynamic shared memory: the warps' rings, or the reduction (`[warps][rows][64]` f32) if larger.
pub(crate) fn shared_bytes(v: &Dense16) -> usize {
    (v.warps as usize * ring_bytes(v)).max((v.warps * v.rows * 64 * 4) as usize)
}

/// `Ok` when `v` can run on `target`; otherwise the first reason it cannot.
pub(crate) fn check(v: &Dense16, target: &Target) -> Result<(), Invalid> {
    let (requested, max) = (shared_bytes(v), target.arch.smem_per_block_max());
    if requested > max {
        return Err(Invalid::SharedMemory { requested, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, Variant};
    use kdtree_quant::Dtype;

    #[test]
    fn shared_memory_decides_the_valid_points() {
        // 2 dtypes x 3 rows x 2 warps x 2 unroll x 3 stages x 5 split_k.
        assert_eq!(Dense16::all().len(), 360);
        let sm90 = Dense16::valid(&Target { arch: Arch(90) });
        assert_eq!(sm90.len(), VALID_SM90);
        // 8 warps of 4 stages of 2 chunks of 32 rows: 8 x 4 x 2 x 12 x 512 bytes.
        let big = Dense16 { dtype: Dtype::Bf16, rows: 32, warps: 8, unroll: 2, stages: 4, split_k: 1 };
        assert_eq!(
            big.check(&Target { arch: Arch(90) }),
            Err(Invalid::SharedMemory { requested: 393_216, max: 227 * 1024 })
        );
        // sm_120's 99 KiB leaves fewer.
        let sm120 = Dense16::valid(&Target { arch: Arch(120) });
        assert!(sm120.len() < sm90.len() && !sm120.is_empty());
        assert!(sm120.iter().all(|v| shared_bytes(v) <= 99 * 1024));
    }

    // 310 of 360: what is left out is 8 warps of the deepest rings.
    const VALID_SM90: usize = 310;

    #[test]
    fn names_round_trip_and_the_default_fits() {
        for dtype in [Dtype::Bf16, Dtype::F16] {
            let v = Dense16::default_for(dtype);
            for arch in [80, 90, 120] {
                assert!(v.check(&Target { arch: Arch(arch) }).is_ok());
            }
            assert_eq!(Dense16::from_name(&v.name()), Some(v));
        }
        assert_eq!(Dense16::default_for(Dtype::Bf16).name(), "dense16_bf16_r8_w4_u1_s3_sk4");
    }
}
