//! Which MLA variants fit an arch: shared memory, counted at the widest entry the kernels take
//! (latent 512 + rope 64, K2's), since the launch's width is not part of the variant.

use crate::mla::{MlaAux, MlaDecode};
use crate::{Invalid, Target};

/// The widest entry a launch may have: DeepSeek-V3 / Kimi K2's `kv_lora_rank + qk_rope_head_dim`.
pub const MAX_LATENT: usize = 512;
pub const MAX_ROPE: usize = 64;
/// New rows one launch may have: the decode kernel lists a row's visible new tokens in shared memory.
pub const MAX_NEW: usize = 1024;

/// Static shared memory of the decode kernel: the visible list (u16 each) and its count, rounded up.
pub const STATIC_SMEM: usize = MAX_NEW * 2 + 16;

/// Dynamic shared memory of a decode launch of entry width `width`, in bytes: the query rows and
/// `stages` tiles, rows padded by 8 elements (conflict-free ldmatrix); P (`hb` x `bn + 8` bf16); the
/// halves' row maxima and sums (4 x `hb` f32).
pub fn dynamic_smem(v: &MlaDecode, width: usize) -> usize {
    let (hb, bn, stages) = (v.hb as usize, v.bn as usize, v.stages as usize);
    let row = (width + 8) * 2;
    hb * row + stages * bn * row + hb * (bn + 8) * 2 + 4 * hb * 4
}

/// `Ok` when `v` can run on `target`; otherwise the first reason it cannot.
pub fn check(v: &MlaDecode, target: &Target) -> Result<(), Invalid> {
    let requested = dynamic_smem(v, MAX_LATENT + MAX_ROPE) + STATIC_SMEM;
    let max = target.arch.smem_per_block_max();
    if requested > max {
        return Err(Invalid::SharedMemory { requested, max });
    }
    Ok(())
}

/// Static shared memory of the aux kernels: unabsorb's `rows` latent rows of f32.
pub fn aux_static_smem(v: &MlaAux) -> usize {
    v.rows as usize * MAX_LATENT * 4
}

/// The aux kernels use static shared memory only, within the 48 KiB every arch allows.
pub fn check_aux(v: &MlaAux, _: &Target) -> Result<(), Invalid> {
    let (requested, max) = (aux_static_smem(v), 48 * 1024);
    if requested > max {
        return Err(Invalid::SharedMemory { requested, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, Variant};

    fn valid(arch: u32) -> Vec<MlaDecode> {
        MlaDecode::valid(&Target { arch: Arch(arch) })
    }

    #[test]
    fn shared_memory_decides_the_valid_points() {
        // 3 hb x 3 bn x 4 stages x 3 max_splits.
        assert_eq!(MlaDecode::all().len(), 108);
        // sm_90 (227 KiB): 64 heads keep two 64-entry stages out (236,560 bytes), and four 32-entry ones.
        let sm90 = valid(90);
        assert_eq!(sm90.len(), 84);
        assert!(sm90.iter().all(|v| !(v.hb == 64 && v.bn * v.stages > 96)));
        assert!(sm90.iter().any(|v| v.hb == 64 && v.bn == 32 && v.stages == 3));
        let big = MlaDecode { hb: 64, bn: 64, stages: 2, max_splits: 32 };
        assert_eq!(
            big.check(&Target { arch: Arch(90) }),
            Err(Invalid::SharedMemory { requested: 236_560, max: 227 * 1024 })
        );
        // sm_120 (99 KiB): 64 heads only with one 16-entry stage (99,600 bytes).
        let sm120 = valid(120);
        assert!(sm120.iter().any(|v| v.hb == 64 && v.bn == 16 && v.stages == 1));
        assert!(sm120.iter().all(|v| v.hb < 64 || (v.bn == 16 && v.stages == 1)));
        assert!(sm120.len() < sm90.len());
    }

    #[test]
    fn every_invalid_point_says_why() {
        for arch in [90, 120] {
            for v in MlaDecode::all() {
                if let Err(reason) = v.check(&Target { arch: Arch(arch) }) {
                    assert!(reason.to_string().contains("shared memory"), "{}", v.name());
                }
            }
        }
    }

    #[test]
    fn names_round_trip_and_defaults_fit() {
        for arch in [90, 120] {
            let target = Target { arch: Arch(arch) };
            let v = MlaDecode::default_for(&target);
            assert!(v.check(&target).is_ok());
            assert_eq!(MlaDecode::from_name(&v.name()), Some(v));
            assert!(MlaAux::default_for(&target).check(&target).is_ok());
        }
        let v = MlaDecode { hb: 64, bn: 32, stages: 2, max_splits: 64 };
        assert_eq!(v.name(), "mla_decode_h64n32_s2_x64");
        assert_eq!(v.combine_name(), "mla_decode_h64n32_s2_x64_combine");
        assert_eq!(MlaAux { rows: 16 }.name(), "mla_aux_r16");
    }

    #[test]
    fn the_split_plan_depends_on_the_length_alone() {
        let v = MlaDecode { hb: 64, bn: 64, stages: 1, max_splits: 32 };
        assert_eq!(v.splits(0), 0);
        assert_eq!(v.splits(1), 1);
        assert_eq!(v.splits(64 * 32), 32);
        // 33 tiles: 2 tiles a split, 17 splits.
        assert_eq!(v.splits(64 * 32 + 1), 17);
        assert!((1..100_000).step_by(97).all(|l| v.splits(l) <= 32));
    }
}
