//! The MoE router and the weighted sum of the experts' outputs.

use super::{ensure, to_u32, unsupported};
use crate::error::Result;

/// The most experts the router takes: a token's scores live in the kernel's shared memory.
pub const MAX_EXPERTS: usize = 512;
/// The most groups and picks: one per lane of the token's warp.
pub const MAX_GROUPS: usize = 32;
pub const MAX_TOP_K: usize = 32;

/// The kernel's size arguments for [`route`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteArgs {
    pub tokens: u32,
    pub experts: u32,
    pub top_k: u32,
    pub n_group: u32,
    pub topk_group: u32,
}

/// logits [tokens, experts], bias `[experts]` -> ids and weights [tokens, top_k], experts in n_group
/// equal groups of which topk_group stay eligible.
pub fn route(
    logits: usize,
    bias: usize,
    (ids, weights): (usize, usize),
    experts: usize,
    top_k: usize,
    (n_group, topk_group): (usize, usize),
) -> Result<RouteArgs> {
    let op = "route_noaux_tc";
    ensure(op, experts > 0 && bias == experts, || format!("bias holds {bias} values for {experts} experts"))?;
    unsupported(op, experts <= MAX_EXPERTS, || format!("{experts} experts, at most {MAX_EXPERTS}"))?;
    ensure(op, n_group > 0 && experts.is_multiple_of(n_group), || {
        format!("{experts} experts do not split into {n_group} groups")
    })?;
    unsupported(op, n_group <= MAX_GROUPS, || format!("{n_group} groups, at most {MAX_GROUPS}"))?;
    ensure(op, (1..=n_group).contains(&topk_group), || format!("topk_group {topk_group} of {n_group} groups"))?;
    ensure(op, (1..=experts).contains(&top_k), || format!("top_k {top_k} of {experts} experts"))?;
    unsupported(op, top_k <= MAX_TOP_K, || format!("top_k {top_k}, at most {MAX_TOP_K}"))?;
    ensure(op, logits.is_multiple_of(experts), || format!("logits hold {logits} values, not rows of {experts}"))?;
    let tokens = logits / experts;
    ensure(op, ids == tokens * top_k && weights == tokens * top_k, || {
        format!("ids ({ids}) and weights ({weights}) are not {tokens} rows of {top_k}")
    })?;
    Ok(RouteArgs {
        tokens: to_u32(op, "tokens", tokens)?,
        experts: to_u32(op, "experts", experts)?,
        top_k: to_u32(op, "top_k", top_k)?,
        n_group: to_u32(op, "n_group", n_group)?,
        topk_group: to_u32(op, "topk_group", topk_group)?,
    })
}

/// slots [tokens * k, h], weights [tokens, k], out [tokens, h]; returns (tokens, k, h).
pub fn moe_combine(slots: usize, weights: usize, k: usize, out: usize) -> Result<(u32, u32, u32)> {
    let op = "moe_combine";
    ensure(op, k > 0 && weights.is_multiple_of(k), || format!("weights hold {weights} values, not rows of {k}"))?;
    let tokens = weights / k;
    let h = out.checked_div(tokens).unwrap_or(0);
    ensure(op, out == tokens * h && slots == tokens * k * h, || {
        format!("slots ({slots}) and out ({out}) are not {tokens} x {k} and {tokens} rows of one width")
    })?;
    Ok((to_u32(op, "tokens", tokens)?, to_u32(op, "k", k)?, to_u32(op, "h", h)?))
}

/// The kernel's size arguments for [`crate::ops::moe::moe_combine_sorted_bf16`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CombineSortedArgs {
    pub tokens: u32,
    pub top_k: u32,
    pub h: u32,
    pub n_rows: u32,
}

/// rows `[n_rows, h]`, positions and weights `[tokens, top_k]`, out `[tokens, h]`: h from out, n_rows
/// from rows.
pub fn moe_combine_sorted(
    rows: usize,
    positions: usize,
    weights: usize,
    top_k: usize,
    out: usize,
) -> Result<CombineSortedArgs> {
    let op = "moe_combine_sorted_bf16";
    ensure(op, top_k > 0 && weights.is_multiple_of(top_k), || {
        format!("weights hold {weights} values, not rows of {top_k}")
    })?;
    unsupported(op, top_k <= MAX_TOP_K, || format!("top_k {top_k}, at most {MAX_TOP_K}"))?;
    ensure(op, positions == weights, || format!("{positions} positions for {weights} weights"))?;
    let tokens = weights / top_k;
    let h = out.checked_div(tokens).unwrap_or(0);
    ensure(op, out == tokens * h, || format!("out ({out}) is not {tokens} rows of one width"))?;
    ensure(op, h == 0 || rows.is_multiple_of(h), || format!("rows ({rows}) are not rows of {h}"))?;
    let n_rows = rows.checked_div(h).unwrap_or(0);
    Ok(CombineSortedArgs {
        tokens: to_u32(op, "tokens", tokens)?,
        top_k: to_u32(op, "top_k", top_k)?,
        h: to_u32(op, "h", h)?,
        n_rows: to_u32(op, "rows", n_rows)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn route_checks_groups_picks_and_limits() {
        // Kimi K2: 384 experts, top 8, one group; 3 tokens.
        let args = route(3 * 384, 384, (24, 24), 384, 8, (1, 1)).unwrap();
        assert_eq!(args, RouteArgs { tokens: 3, experts: 384, top_k: 8, n_group: 1, topk_group: 1 });
        // DeepSeek-V3: 256 experts in 8 groups, 4 kept.
        assert!(route(3 * 256, 256, (24, 24), 256, 8, (8, 4)).is_ok());
        assert!(matches!(route(3 * 256, 256, (24, 24), 256, 8, (7, 4)), Err(Error::Shape { .. })));
        assert!(matches!(route(3 * 256, 256, (24, 24), 256, 8, (8, 9)), Err(Error::Shape { .. })));
        assert!(matches!(route(3 * 256, 256, (24, 24), 256, 8, (8, 0)), Err(Error::Shape { .. })));
        assert!(matches!(route(3 * 256, 255, (24, 24), 256, 8, (8, 4)), Err(Error::Shape { .. })));
        assert!(matches!(route(3 * 256, 256, (21, 24), 256, 8, (8, 4)), Err(Error::Shape { .. })));
        assert!(matches!(route(3 * 256 + 1, 256, (24, 24), 256, 8, (8, 4)), Err(Error::Shape { .. })));
        assert!(matches!(route(1024, 1024, (8, 8), 1024, 8, (1, 1)), Err(Error::Unsupported { .. })));
        assert!(matches!(route(128, 128, (64, 64), 128, 64, (1, 1)), Err(Error::Unsupported { .. })));
        assert!(matches!(route(128, 128, (8, 8), 128, 8, (64, 1)), Err(Error::Unsupported { .. })));
    }

    #[test]
    fn moe_combine_sorted_derives_the_width_from_out_and_the_rows_from_it() {
        let want = CombineSortedArgs { tokens: 2, top_k: 8, h: 5, n_rows: 16 };
        assert_eq!(moe_combine_sorted(16 * 5, 16, 16, 8, 2 * 5).unwrap(), want);
        assert_eq!(moe_combine_sorted(0, 0, 0, 8, 0).unwrap().tokens, 0);
        assert!(matches!(moe_combine_sorted(16 * 5, 15, 16, 8, 2 * 5), Err(Error::Shape { .. })));
        assert!(matches!(moe_combine_sorted(16 * 5 + 1, 16, 16, 8, 2 * 5), Err(Error::Shape { .. })));
        assert!(matches!(moe_combine_sorted(16 * 5, 16, 16, 8, 2 * 5 + 1), Err(Error::Shape { .. })));
        assert!(matches!(moe_combine_sorted(16 * 5, 16, 15, 8, 2 * 5), Err(Error::Shape { .. })));
        assert!(matches!(moe_combine_sorted(66 * 5, 66, 66, 33, 2 * 5), Err(Error::Unsupported { .. })));
    }

    #[test]
    fn moe_combine_derives_the_width_from_out() {
        assert_eq!(moe_combine(2 * 8 * 5, 2 * 8, 8, 2 * 5).unwrap(), (2, 8, 5));
        assert_eq!(moe_combine(0, 0, 8, 0).unwrap(), (0, 8, 0));
        assert!(matches!(moe_combine(2 * 8 * 5, 2 * 8, 8, 2 * 5 + 1), Err(Error::Shape { .. })));
        assert!(matches!(moe_combine(2 * 8 * 5 - 1, 2 * 8, 8, 2 * 5), Err(Error::Shape { .. })));
        assert!(matches!(moe_combine(0, 0, 8, 3), Err(Error::Shape { .. })));
        assert!(matches!(moe_combine(80, 15, 8, 10), Err(Error::Shape { .. })));
    }
}
