//! The sorted assignments of an MoE layer and their tiles ([`crate::ops::moe_align`]).

use super::moe::MAX_EXPERTS;
use super::{ensure, to_u32, unsupported};
use crate::error::Result;

/// The most assignments (tokens x top_k) one alignment takes: 1024 tokens at K2's top-8. The kernel is
/// one block whose stable scatter is one warp's 32 assignments a round, ~256 rounds at the limit; a
/// forward of more tokens aligns (and runs its experts) in chunks of tokens, which are independent.
pub const MAX_ASSIGNMENTS: usize = 8192;

/// The kernel's size arguments for [`crate::ops::moe_align`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlignArgs {
    pub n: u32,
    pub experts: u32,
    pub bm: u32,
    pub max_tiles: u32,
}

/// ids `[n]`, `experts` experts, tiles of `bm` rows -> sorted and positions `[n]`, offsets `[experts + 1]`, tiles
/// `[3 * max_tiles]` (`max_tiles` = kdtree-jit's `tile_bound(experts, n, bm)`) and meta `[3]`.
pub fn moe_align(
    ids: usize,
    experts: usize,
    bm: usize,
    (sorted, positions, offsets, tiles, meta): (usize, usize, usize, usize, usize),
) -> Result<AlignArgs> {
    let op = "moe_align";
    ensure(op, experts > 0, || "no experts".into())?;
    unsupported(op, experts <= MAX_EXPERTS, || format!("{experts} experts, at most {MAX_EXPERTS}"))?;
    ensure(op, bm > 0, || "tiles of 0 rows".into())?;
    unsupported(op, ids <= MAX_ASSIGNMENTS, || {
        format!("{ids} assignments, at most {MAX_ASSIGNMENTS} in one alignment: align chunks of tokens")
    })?;
    let max_tiles = kdtree_jit::w4a16::grouped::tile_bound(experts, ids, bm);
    ensure(op, sorted >= ids, || format!("sorted holds {sorted} of {ids} assignments"))?;
    ensure(op, positions >= ids, || format!("positions hold {positions} of {ids} assignments"))?;
    ensure(op, offsets > experts, || format!("offsets hold {offsets} values, {} needed", experts + 1))?;
    ensure(op, tiles >= 3 * max_tiles, || format!("tiles hold {tiles} values, {} x 3 needed", max_tiles))?;
    ensure(op, meta >= 3, || format!("meta holds {meta} values, 3 needed"))?;
    Ok(AlignArgs {
        n: to_u32(op, "assignments", ids)?,
        experts: to_u32(op, "experts", experts)?,
        bm: to_u32(op, "bm", bm)?,
        max_tiles: to_u32(op, "max_tiles", max_tiles)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn moe_align_checks_limits_and_lengths() {
        // Kimi K2 at T = 64: 512 assignments over 384 experts, tiles of 8 -> 384 + 64 tiles.
        let want = AlignArgs { n: 512, experts: 384, bm: 8, max_tiles: 448 };
        assert_eq!(moe_align(512, 384, 8, (512, 512, 385, 3 * 448, 3)).unwrap(), want);
        assert!(matches!(moe_align(512, 384, 8, (511, 512, 385, 3 * 448, 3)), Err(Error::Shape { .. })));
        assert!(matches!(moe_align(512, 384, 8, (512, 511, 385, 3 * 448, 3)), Err(Error::Shape { .. })));
        assert!(matches!(moe_align(512, 384, 8, (512, 512, 384, 3 * 448, 3)), Err(Error::Shape { .. })));
        assert!(matches!(moe_align(512, 384, 8, (512, 512, 385, 3 * 448 - 1, 3)), Err(Error::Shape { .. })));
        assert!(matches!(moe_align(512, 384, 8, (512, 512, 385, 3 * 448, 2)), Err(Error::Shape { .. })));
        assert!(matches!(moe_align(512, 0, 8, (512, 512, 1, 0, 3)), Err(Error::Shape { .. })));
        assert!(matches!(moe_align(512, 384, 0, (512, 512, 385, 3 * 448, 3)), Err(Error::Shape { .. })));
        let big = MAX_ASSIGNMENTS + 1;
        assert!(matches!(moe_align(big, 384, 8, (big, big, 385, 3 * big, 3)), Err(Error::Unsupported { .. })));
        assert!(matches!(moe_align(8, 513, 8, (8, 8, 514, 3 * 16, 3)), Err(Error::Unsupported { .. })));
        // Nothing routed: no tiles, still a valid (empty) alignment.
        assert_eq!(moe_align(0, 384, 8, (0, 0, 385, 0, 3)).unwrap().max_tiles, 0);
    }
}
