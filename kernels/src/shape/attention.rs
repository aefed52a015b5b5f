//! MLA's KV cache append and tree attention over it.

use super::{ensure, to_u32, unsupported};
use crate::error::Result;

/// The most new tokens one attention call takes: a row's list of visible new tokens lives in dynamic
/// shared memory, 4 bytes each, within the 48 KiB a launch may use without opting in (the kernel's
/// static shared memory, its warps' states, takes about 4 KiB of them).
pub const MAX_NEW_TOKENS: usize = 8192;
/// The largest qk and v head dimension: each of a warp's 32 lanes holds 8 values of q and of the output.
pub const MAX_HEAD_DIM: usize = 256;

/// The kernel's size arguments for [`kv_append`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvAppendArgs {
    pub n: u32,
    pub heads: u32,
    pub nope: u32,
    pub rope: u32,
    pub vd: u32,
    /// Cache rows.
    pub capacity: u32,
}

/// kv [n, heads, nope + vd] and k_rope [n, rope] into cache rows start..start + n of k_cache
/// [capacity, heads, nope + rope] and v_cache [capacity, heads, vd].
pub fn kv_append(
    kv: usize,
    k_rope: usize,
    (heads, nope, rope, vd): (usize, usize, usize, usize),
    k_cache: usize,
    v_cache: usize,
) -> Result<KvAppendArgs> {
    let op = "kv_append";
    ensure(op, heads > 0 && rope > 0 && vd > 0, || format!("heads {heads}, rope {rope}, v_dim {vd}: none may be 0"))?;
    ensure(op, k_rope.is_multiple_of(rope), || format!("k_rope holds {k_rope} values, not rows of {rope}"))?;
    let n = k_rope / rope;
    ensure(op, kv == n * heads * (nope + vd), || {
        format!("kv holds {kv} values, not {n} rows of {heads} heads of {nope} + {vd}")
    })?;
    let k_row = heads * (nope + rope);
    ensure(op, k_cache.is_multiple_of(k_row), || format!("k_cache holds {k_cache} values, not rows of {k_row}"))?;
    let capacity = k_cache / k_row;
    ensure(op, v_cache == capacity * heads * vd, || {
        format!("v_cache holds {v_cache} values, not the k_cache's {capacity} rows of {heads} x {vd}")
    })?;
    ensure(op, n <= capacity, || format!("{n} new rows do not fit the cache's {capacity}"))?;
    Ok(KvAppendArgs {
        n: to_u32(op, "n", n)?,
        heads: to_u32(op, "heads", heads)?,
        nope: to_u32(op, "nope", nope)?,
        rope: to_u32(op, "rope", rope)?,
        vd: to_u32(op, "v_dim", vd)?,
        capacity: to_u32(op, "capacity", capacity)?,
    })
}

/// The kernel's size arguments for [`attention`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionArgs {
    pub n: u32,
    /// Entries both caches hold.
    pub capacity: u32,
    pub heads: u32,
    pub qk: u32,
    pub vd: u32,
}

/// q [n, heads, qk] over caches of at least n entries, mask [n, ceil(n / 32)], out [n, heads, vd]. The
/// cached entries before the new ones are counted on the device, where the kernel checks that they
/// and the n new ones fit the capacity returned here.
pub fn attention(
    q: usize,
    k_cache: usize,
    v_cache: usize,
    mask: usize,
    out: usize,
    (heads, qk, vd): (usize, usize, usize),
) -> Result<AttentionArgs> {
    let op = "attention_tree";
    ensure(op, heads > 0 && qk > 0 && vd > 0, || format!("heads {heads}, qk_dim {qk}, v_dim {vd}: none may be 0"))?;
    unsupported(op, qk <= MAX_HEAD_DIM && vd <= MAX_HEAD_DIM, || {
        format!("qk_dim {qk} and v_dim {vd}: at most {MAX_HEAD_DIM} each")
    })?;
    // The grid's y dimension.
    unsupported(op, heads <= 65535, || format!("{heads} heads, at most 65535"))?;
    ensure(op, q.is_multiple_of(heads * qk), || format!("q holds {q} values, not rows of {heads} heads of {qk}"))?;
    let n = q / (heads * qk);
    unsupported(op, n <= MAX_NEW_TOKENS, || {
        format!("{n} new tokens, at most {MAX_NEW_TOKENS} per call (the visible-token list lives in shared memory)")
    })?;
    let words = n.div_ceil(32);
    ensure(op, mask == n * words, || format!("mask holds {mask} words, not {n} rows of {words}"))?;
    ensure(op, out == n * heads * vd, || format!("out holds {out} values, not {n} rows of {heads} heads of {vd}"))?;
    ensure(op, k_cache / (heads * qk) >= n, || {
        format!("k_cache holds {k_cache} values, fewer than {n} entries of {heads} x {qk}")
    })?;
    ensure(op, v_cache / (heads * vd) >= n, || {
        format!("v_cache holds {v_cache} values, fewer than {n} entries of {heads} x {vd}")
    })?;
    // No score buffer bounds the context: only the kernel's 32-bit entry indices do.
    let capacity = (k_cache / (heads * qk)).min(v_cache / (heads * vd));
    unsupported(op, u32::try_from(capacity).is_ok(), || {
        format!("caches of {capacity} entries do not fit the kernel's 32-bit indices")
    })?;
    Ok(AttentionArgs {
        n: to_u32(op, "n", n)?,
        capacity: to_u32(op, "capacity", capacity)?,
        heads: to_u32(op, "heads", heads)?,
        qk: to_u32(op, "qk_dim", qk)?,
        vd: to_u32(op, "v_dim", vd)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn kv_append_checks_the_layout_and_the_capacity() {
        // 2 tokens, 3 heads, nope 4, rope 2, v 5, into a cache of 6 rows.
        let (kv, k_rope, dims) = (2 * 3 * 9, 2 * 2, (3, 4, 2, 5));
        let args = kv_append(kv, k_rope, dims, 6 * 3 * 6, 6 * 3 * 5).unwrap();
        assert_eq!(args, KvAppendArgs { n: 2, heads: 3, nope: 4, rope: 2, vd: 5, capacity: 6 });
        assert!(matches!(kv_append(kv, k_rope, dims, 3 * 6, 3 * 5), Err(Error::Shape { .. })));
        assert!(matches!(kv_append(kv - 1, k_rope, dims, 6 * 3 * 6, 6 * 3 * 5), Err(Error::Shape { .. })));
        assert!(matches!(kv_append(kv, k_rope, dims, 6 * 3 * 6, 5 * 3 * 5), Err(Error::Shape { .. })));
        assert!(matches!(kv_append(kv, k_rope, dims, 6 * 3 * 6 + 1, 6 * 3 * 5), Err(Error::Shape { .. })));
        assert!(matches!(kv_append(kv, k_rope, (3, 4, 0, 5), 6 * 3 * 6, 6 * 3 * 5), Err(Error::Shape { .. })));
    }

    #[test]
    fn attention_checks_lengths_and_refuses_what_the_kernel_cannot_hold() {
        // 33 new tokens (2 mask words a row), 2 heads, qk 24, v 16, caches of 140 entries (v 139).
        let (n, dims) = (33, (2, 24, 16));
        let (q, mask, out, kc, vc) = (n * 2 * 24, n * 2, n * 2 * 16, 140 * 2 * 24, 139 * 2 * 16);
        let args = attention(q, kc, vc, mask, out, dims).unwrap();
        assert_eq!(args, AttentionArgs { n: 33, capacity: 139, heads: 2, qk: 24, vd: 16 });
        assert!(attention(q, 33 * 2 * 24, 33 * 2 * 16, mask, out, dims).is_ok());
        assert!(matches!(attention(q, 32 * 2 * 24, vc, mask, out, dims), Err(Error::Shape { .. })));
        assert!(matches!(attention(q, kc, 32 * 2 * 16, mask, out, dims), Err(Error::Shape { .. })));
        assert!(matches!(attention(q, kc, vc, mask - 1, out, dims), Err(Error::Shape { .. })));
        assert!(matches!(attention(q, kc, vc, mask, out + 1, dims), Err(Error::Shape { .. })));
        assert!(matches!(attention(q + 1, kc, vc, mask, out, dims), Err(Error::Shape { .. })));
        let huge = (1usize << 33) * 24;
        assert!(matches!(attention(24, huge, huge, 1, 16, (1, 24, 16)), Err(Error::Unsupported { .. })));
        let big = MAX_NEW_TOKENS + 1;
        let too_many = attention(big * 24, 1 << 30, 1 << 30, big * big.div_ceil(32), big * 16, (1, 24, 16));
        assert!(matches!(too_many, Err(Error::Unsupported { .. })));
        let wide = attention(n * 2 * 288, 1 << 30, 1 << 30, mask, out, (2, 288, 16));
        assert!(matches!(wide, Err(Error::Unsupported { .. })));
    }
}
