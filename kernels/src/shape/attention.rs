//! Grouped-query attention's sizes and how its keys split over blocks.

use super::{ensure, to_u32, unsupported};
use crate::error::Result;

/// Keys a block of the partial kernel scores per pass, through shared memory (the source's `TILE`).
pub const TILE: usize = 32;
/// The widest head the partial kernel takes (the source's `MAX_D`): its registers, and a tile of 32 keys and
/// values of 256 would need 64 KB of shared memory. DFlash's Qwen3-style drafters use 128.
pub const MAX_HEAD_DIM: usize = 128;
/// Shared memory a block may take without opting in.
const SHARED_LIMIT: usize = 48 * 1024;
/// Blocks to aim for: about two per SM of the largest GPUs, so that few rows still fill the device.
const TARGET_BLOCKS: usize = 264;

/// The sizes of one attention: `n` query rows of `heads` heads over `context` keys then the `n`
/// block's, `kv_heads` key/value heads, all `head_dim` wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GqaSizes {
    pub n: usize,
    pub context: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// The kernels' size arguments for [`gqa_attention`], and the split of the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GqaArgs {
    pub n: u32,
    pub context: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Key ranges, each `chunk` keys (the last fewer), one block each per (kv head, row).
    pub splits: u32,
    pub chunk: u32,
    /// The partial kernel's shared memory in bytes.
    pub shared: u32,
}

/// Checks the buffers' lengths (`q` and `out` `[n, heads * head_dim]`; the context's keys and values
/// hold at least `context` rows of `kv_heads * head_dim`, the block's exactly `n`) and plans the split.
pub fn gqa_attention(s: GqaSizes, q: usize, context: [usize; 2], block: [usize; 2], out: usize) -> Result<GqaArgs> {
    let op = "gqa_attention";
    let GqaSizes { n, context: ctx, heads, kv_heads, head_dim } = s;
    ensure(op, kv_heads > 0 && head_dim > 0 && heads.is_multiple_of(kv_heads) && heads > 0, || {
        format!("{heads} query heads do not share {kv_heads} key/value heads of {head_dim} evenly")
    })?;
    let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
    ensure(op, q == n * q_width && out == q, || format!("q of {q} and out of {out} values for {n} rows of {q_width}"))?;
    ensure(op, context.iter().all(|&c| c >= ctx * kv_width), || {
        format!("context keys/values of {context:?} values hold fewer than {ctx} rows of {kv_width}")
    })?;
    ensure(op, block.iter().all(|&b| b == n * kv_width), || {
        format!("block keys/values of {block:?} values for {n} rows of {kv_width}")
    })?;
    let group = heads / kv_heads;
    unsupported(op, head_dim <= MAX_HEAD_DIM && group <= 32, || {
        format!("heads of {head_dim} (at most {MAX_HEAD_DIM}) in groups of {group} (at most 32 query heads a key head)")
    })?;
    let shared = 4 * (group * head_dim + TILE * (2 * head_dim + 1));
    unsupported(op, shared <= SHARED_LIMIT, || {
        format!(
            "{group} query heads of {head_dim} a key head need {shared} bytes of shared memory, over {SHARED_LIMIT}"
        )
    })?;
    let keys = ctx + n;
    let blocks = kv_heads * n.max(1);
    let splits = TARGET_BLOCKS.div_ceil(blocks).clamp(1, keys.div_ceil(TILE).max(1));
    let chunk = keys.div_ceil(splits).next_multiple_of(TILE).max(TILE);
    to_u32(op, "context keys", keys * kv_width)?;
    Ok(GqaArgs {
        n: to_u32(op, "n", n)?,
        context: to_u32(op, "context", ctx)?,
        heads: to_u32(op, "heads", heads)?,
        kv_heads: to_u32(op, "kv_heads", kv_heads)?,
        head_dim: to_u32(op, "head_dim", head_dim)?,
        splits: to_u32(op, "splits", keys.div_ceil(chunk).max(1))?,
        chunk: to_u32(op, "chunk", chunk)?,
        shared: to_u32(op, "shared", shared)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    const K25: GqaSizes = GqaSizes { n: 8, context: 4096, heads: 64, kv_heads: 8, head_dim: 128 };

    fn args(s: GqaSizes) -> Result<GqaArgs> {
        let (q, kv) = (s.n * s.heads * s.head_dim, s.kv_heads * s.head_dim);
        gqa_attention(s, q, [s.context * kv; 2], [s.n * kv; 2], q)
    }

    #[test]
    fn every_key_falls_in_exactly_one_nonempty_split() {
        for (n, context) in [(1, 0), (8, 0), (8, 4096), (16, 100_000), (1, 31), (64, 5)] {
            let a = args(GqaSizes { n, context, ..K25 }).unwrap();
            let keys = (n + context) as u32;
            assert!((a.chunk as usize).is_multiple_of(TILE), "{a:?}");
            assert!((a.splits - 1) * a.chunk < keys && a.splits * a.chunk >= keys, "{a:?} for {keys} keys");
        }
    }

    #[test]
    fn few_rows_split_the_keys_to_fill_the_device() {
        let a = args(GqaSizes { n: 1, context: 32_768, ..K25 }).unwrap();
        assert!(a.kv_heads * a.splits >= TARGET_BLOCKS as u32, "{a:?}");
        assert_eq!(a.shared, 4 * (8 * 128 + 32 * 257));
    }

    #[test]
    fn wrong_lengths_and_unbuilt_sizes_are_refused() {
        let s = GqaSizes { n: 2, context: 3, heads: 4, kv_heads: 2, head_dim: 16 };
        let (q, kv) = (2 * 64, 32);
        assert!(gqa_attention(s, q, [3 * kv, 3 * kv], [2 * kv, 2 * kv], q).is_ok());
        // A context buffer with room beyond its rows is fine; one short of them is not.
        assert!(gqa_attention(s, q, [9 * kv, 3 * kv], [2 * kv, 2 * kv], q).is_ok());
        assert!(matches!(gqa_attention(s, q, [2 * kv, 3 * kv], [2 * kv, 2 * kv], q), Err(Error::Shape { .. })));
        assert!(matches!(gqa_attention(s, q, [3 * kv; 2], [kv, 2 * kv], q), Err(Error::Shape { .. })));
        assert!(matches!(gqa_attention(s, q + 1, [3 * kv; 2], [2 * kv; 2], q + 1), Err(Error::Shape { .. })));
        assert!(matches!(args(GqaSizes { heads: 6, kv_heads: 4, ..s }), Err(Error::Shape { .. })));
        assert!(matches!(args(GqaSizes { head_dim: 256, ..s }), Err(Error::Unsupported { .. })));
        assert!(matches!(
            args(GqaSizes { heads: 16, kv_heads: 1, head_dim: 256, ..s }),
            Err(Error::Unsupported { .. })
        ));
    }
}
