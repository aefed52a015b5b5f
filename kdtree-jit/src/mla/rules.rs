//! Which MLA variants fit an arch: shared memory, counted at the widest entry the kernels take
//! (latent 512 + rope 64, K2's), since the launch's width is not part of the variant.

use crate::mla::space::{MlaKv, MlaMma};
use crate::mla::{MlaAux, MlaDecode, fp8};
use crate::{Invalid, Target};

/// The widest entry a launch may have: DeepSeek-V3 / Kimi K2's `kv_lora_rank + qk_rope_head_dim`.
pub(crate) const MAX_LATENT: usize = 512;
pub(crate) const MAX_ROPE: usize = 64;
/// New rows one launch may have: the decode kernel lists a row's visible new tokens in shared memory.
pub(crate) const MAX_NEW: usize = 1024;

/// The visible list (u16 each) and its count, rounded up.
const VISIBLE_SMEM: usize = MAX_NEW * 2 + 16;

/// Static shared memory of the decode kernel: the mma form's visible list; the wgmma form has none
/// (its dynamic base must stay 1024-aligned for the swizzle atoms).
pub fn static_smem(v: &MlaDecode) -> usize {
    match v.mma {
        MlaMma::Mma => VISIBLE_SMEM,
        MlaMma::Wgmma => 0,
    }
}

/// Static shared memory of the combine: one (max, sum) pair of f32 a split.
pub fn combine_static_smem(v: &MlaDecode) -> usize {
    v.max_splits as usize * 8
}

/// Dynamic shared memory of a decode launch of entries of `latent + rope` values, in bytes.
/// - mma: the query rows and `stages` tiles, rows padded by 8 elements (conflict-free ldmatrix); P
///   (`hb` x `bn + 8` bf16); the halves' row maxima and sums (4 x `hb` f32). An FP8 cache's
///   `stages` tiles hold its entries as they are, and one more tile the bf16 values they widen to.
/// - wgmma: the query rows and `stages` tiles as 64-column blocks (128 bytes a row) of the widest
///   entry (the kernel's offsets do not depend on `width`); P (one 64-row block); the heads'
///   rescales (64 f32); the visible list. An FP8 cache's `stages` tiles hold the widest entries as
///   they are, beside two widened tiles.
pub(crate) fn dynamic_smem(v: &MlaDecode, latent: usize, rope: usize) -> usize {
    let (hb, bn, stages) = (v.hb as usize, v.bn as usize, v.stages as usize);
    match v.mma {
        MlaMma::Mma => {
            let row = (latent + rope + 8) * 2;
            let tiles = match v.kv {
                MlaKv::Bf16 => stages * bn * row,
                MlaKv::Fp8 => stages * bn * fp8::entry_bytes(latent, rope) + bn * row,
            };
            hb * row + tiles + hb * (bn + 8) * 2 + 4 * hb * 4
        }
        MlaMma::Wgmma => {
            let row = (MAX_LATENT + MAX_ROPE).div_ceil(64) * 128;
            let tiles = match v.kv {
                MlaKv::Bf16 => stages * bn * row,
                // P after the raw ring starts a swizzle atom: the ring is rounded up to 1 KiB.
                MlaKv::Fp8 => {
                    2 * bn * row + (stages * bn * fp8::entry_bytes(MAX_LATENT, MAX_ROPE)).next_multiple_of(1024)
                }
            };
            hb * row + tiles + hb * 128 + hb * 4 + VISIBLE_SMEM
        }
    }
}

fn incompatible(reason: String) -> Result<(), Invalid> {
    Err(Invalid::Incompatible { reason })
}

/// `Ok` when `v` can run on `target`; otherwise the first reason it cannot.
pub(crate) fn check(v: &MlaDecode, target: &Target) -> Result<(), Invalid> {
    if v.kv == MlaKv::Fp8 {
        fp8_arch(target)?;
        if v.mma == MlaMma::Wgmma && v.stages < 2 {
            return incompatible(
                "the wgmma form widens an FP8 tile while the next one is copied: 2 stages at least".into(),
            );
        }
    }
    if v.mma == MlaMma::Wgmma {
        if target.arch.capability() != 90 {
            return incompatible(format!(
                "wgmma is Hopper's arch-specific feature: it runs on sm_90 (compiled for sm_90a), not {}",
                target.arch
            ));
        }
        if v.hb != 64 || v.bn < 32 {
            return incompatible(format!(
                "the wgmma form takes 64 heads (the instruction's M) and 32- or 64-entry tiles, not hb = {}, bn = {}",
                v.hb, v.bn
            ));
        }
    }
    let requested = dynamic_smem(v, MAX_LATENT, MAX_ROPE) + static_smem(v);
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

/// The e4m3 conversions (`cvt` to and from `e4m3x2`) came with sm_89.
fn fp8_arch(target: &Target) -> Result<(), Invalid> {
    if target.arch.capability() < 89 {
        return incompatible(format!(
            "an FP8 cache needs the e4m3 conversions of sm_89 and later, not {}",
            target.arch
        ));
    }
    Ok(())
}

/// The aux kernels use static shared memory only, within the 48 KiB every arch allows; an FP8
/// cache's append and gather need sm_89.
pub(crate) fn check_aux(v: &MlaAux, target: &Target) -> Result<(), Invalid> {
    if v.kv == MlaKv::Fp8 {
        fp8_arch(target)?;
    }
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

    const MMA: MlaDecode = MlaDecode { mma: MlaMma::Mma, kv: MlaKv::Bf16, hb: 64, bn: 32, stages: 2, max_splits: 64 };

    fn valid(arch: u32) -> Vec<MlaDecode> {
        MlaDecode::valid(&Target { arch: Arch(arch) })
    }

    #[test]
    fn shared_memory_decides_the_valid_points() {
        // 2 mma x 2 kv x 3 hb x 3 bn x 4 stages x 3 max_splits.
        assert_eq!(MlaDecode::all().len(), 432);
        // sm_90 (227 KiB): 64 heads keep two 64-entry stages out of the mma form (236,560 bytes), and
        // four 32-entry ones; the wgmma form fits up to 4 stages of 32 entries, 2 of 64.
        let (fp8, sm90): (Vec<MlaDecode>, Vec<MlaDecode>) = valid(90).into_iter().partition(|v| v.kv == MlaKv::Fp8);
        let (wgmma, mma): (Vec<&MlaDecode>, Vec<&MlaDecode>) = sm90.iter().partition(|v| v.mma == MlaMma::Wgmma);
        assert_eq!(mma.len(), 84);
        assert!(mma.iter().all(|v| !(v.hb == 64 && v.bn * v.stages > 96)));
        assert!(mma.iter().any(|v| v.hb == 64 && v.bn == 32 && v.stages == 3));
        let big = MlaDecode { bn: 64, max_splits: 32, ..MMA };
        assert_eq!(
            big.check(&Target { arch: Arch(90) }),
            Err(Invalid::SharedMemory { requested: 236_560, max: 227 * 1024 })
        );
        assert_eq!(wgmma.len(), 18);
        assert!(wgmma.iter().all(|v| v.hb == 64 && v.bn * v.stages <= 128));
        let deep = MlaDecode { mma: MlaMma::Wgmma, bn: 64, stages: 3, ..MMA };
        assert_eq!(
            deep.check(&Target { arch: Arch(90) }),
            Err(Invalid::SharedMemory { requested: 4 * 73_728 + 8192 + 256 + 2064, max: 227 * 1024 })
        );
        // FP8, mma form: an entry is 656 bytes a stage plus the widened tile, so 64 heads fit up to
        // four 32-entry stages (204,304 bytes) or one 64-entry one. wgmma form: two widened tiles
        // beside the stages, so 32-entry tiles in 2 or 3 stages (220,944 bytes).
        let (fp8_wgmma, fp8): (Vec<MlaDecode>, Vec<MlaDecode>) = fp8.into_iter().partition(|v| v.mma == MlaMma::Wgmma);
        assert_eq!((fp8.len(), fp8_wgmma.len()), (90, 6));
        assert!(fp8.iter().any(|v| v.hb == 64 && v.bn == 32 && v.stages == 4));
        assert!(fp8.iter().any(|v| v.hb == 64 && v.bn == 64 && v.stages == 1));
        assert!(!fp8.iter().any(|v| v.hb == 64 && v.bn == 64 && v.stages == 2));
        assert!(fp8_wgmma.iter().all(|v| v.bn == 32 && (2..=3).contains(&v.stages)));
        let deep = MlaDecode { mma: MlaMma::Wgmma, kv: MlaKv::Fp8, stages: 4, ..MMA };
        assert_eq!(
            deep.check(&Target { arch: Arch(90) }),
            Err(Invalid::SharedMemory {
                requested: 73_728 + 2 * 36_864 + 4 * 32 * 656 + 8192 + 256 + 2064,
                max: 227 * 1024
            })
        );
        // The arch-specific target takes the same points.
        assert_eq!(valid(90), MlaDecode::valid(&Target { arch: Arch::SM_90A }));
        // Before sm_89 there are no e4m3 conversions.
        assert!(valid(80).iter().all(|v| v.kv == MlaKv::Bf16) && !valid(80).is_empty());
        // sm_120 (99 KiB): 64 heads only with one 16-entry stage (99,600 bytes); no wgmma; FP8 with
        // at most 32 heads a block.
        let (fp8, sm120): (Vec<MlaDecode>, Vec<MlaDecode>) = valid(120).into_iter().partition(|v| v.kv == MlaKv::Fp8);
        assert_eq!(fp8.len(), 27);
        assert!(fp8.iter().all(|v| v.hb <= 32));
        assert!(sm120.iter().any(|v| v.hb == 64 && v.bn == 16 && v.stages == 1));
        assert!(sm120.iter().all(|v| v.mma == MlaMma::Mma && (v.hb < 64 || (v.bn == 16 && v.stages == 1))));
        assert!(sm120.len() < mma.len());
    }

    #[test]
    fn every_invalid_point_says_why() {
        for arch in [90, 120] {
            for v in MlaDecode::all() {
                if let Err(reason) = v.check(&Target { arch: Arch(arch) }) {
                    let reason = reason.to_string();
                    let why = if v.mma == MlaMma::Wgmma && (arch != 90 || v.hb != 64 || v.bn < 32) {
                        "wgmma"
                    } else if v.kv == MlaKv::Fp8 && v.mma == MlaMma::Wgmma && v.stages < 2 {
                        "2 stages"
                    } else {
                        "shared memory"
                    };
                    assert!(reason.contains(why), "{}: {reason}", v.name());
                }
            }
        }
    }

    #[test]
    fn names_round_trip_and_defaults_fit() {
        for arch in [90, 120] {
            let target = Target { arch: Arch(arch) };
            for kv in [MlaKv::Bf16, MlaKv::Fp8] {
                let v = MlaDecode::default_for_kv(&target, kv);
                assert!(v.check(&target).is_ok() && v.kv == kv, "{}", v.name());
                assert_eq!(MlaDecode::from_name(&v.name()), Some(v));
                assert!(MlaAux::beside(&v).check(&target).is_ok());
            }
        }
        let old = Target { arch: Arch(80) };
        assert!(
            MlaAux::beside(&MlaDecode { kv: MlaKv::Fp8, ..MMA }).check(&old).unwrap_err().to_string().contains("sm_89")
        );
        let fp8 = MlaDecode { kv: MlaKv::Fp8, ..MMA };
        assert_eq!(fp8.name(), "mla_decode_mma_fp8_h64n32_s2_x64");
        assert_eq!(MlaDecode::from_name(&fp8.name()), Some(fp8));
        assert_eq!(MMA.name(), "mla_decode_mma_h64n32_s2_x64");
        assert_eq!(MMA.combine_name(), "mla_decode_mma_h64n32_s2_x64_combine");
        let w = MlaDecode { mma: MlaMma::Wgmma, bn: 64, ..MMA };
        assert_eq!(w.name(), "mla_decode_wgmma_h64n64_s2_x64");
        assert_eq!(MlaDecode::from_name(&w.name()), Some(w));
        assert_eq!(w.compile_arch(Arch(90)), Arch::SM_90A);
        assert_eq!(MMA.compile_arch(Arch(90)), Arch(90));
        assert_eq!(MlaAux { kv: MlaKv::Bf16, rows: 16 }.name(), "mla_aux_r16");
        assert_eq!(MlaAux::beside(&fp8).name(), "mla_aux_fp8_r16");
    }

    #[test]
    fn the_split_plan_depends_on_the_length_alone() {
        let v = MlaDecode { bn: 64, stages: 1, max_splits: 32, ..MMA };
        assert_eq!(v.splits(0), 0);
        assert_eq!(v.splits(1), 1);
        assert_eq!(v.splits(64 * 32), 32);
        // 33 tiles: 2 tiles a split, 17 splits.
        assert_eq!(v.splits(64 * 32 + 1), 17);
        assert!((1..100_000).step_by(97).all(|l| v.splits(l) <= 32));
    }
}
