//! The top-k of log-softmaxed rows: its sizes, transform and chunks.

use super::{ensure, to_u32};
use crate::error::Result;

/// Tokens a block of the per-chunk kernels takes (the source's `CHUNK`): their keys fill 16 KB of
/// shared memory, and a 163840-token vocabulary makes 40 chunks a row.
pub const TOP_K_CHUNK: usize = 4096;

/// The kernel's size and transform arguments, from [`top_k_log_softmax`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopKArgs {
    pub rows: u32,
    pub vocab: u32,
    /// Chunks a row ([`TOP_K_CHUNK`] tokens each, the last fewer).
    pub chunks: u32,
    pub k: u32,
    pub multiplier: f32,
    /// 0 for no softcap.
    pub softcap: f32,
}

/// Checks `logits` against rows of `vocab`, `k` and the transform: a finite multiplier, a positive
/// finite softcap.
pub fn top_k_log_softmax(
    logits: usize,
    vocab: usize,
    k: usize,
    multiplier: f32,
    softcap: Option<f32>,
) -> Result<TopKArgs> {
    let op = "top_k_log_softmax";
    ensure(op, vocab > 0 && logits.is_multiple_of(vocab), || format!("{logits} logits are not rows of {vocab}"))?;
    ensure(op, k > 0, || "k = 0: at least one candidate a row".into())?;
    let rows = logits / vocab;
    ensure(op, multiplier.is_finite(), || format!("multiplier {multiplier} is not finite"))?;
    ensure(op, softcap.is_none_or(|c| c.is_finite() && c > 0.0), || {
        format!("softcap {softcap:?} is not a positive finite number")
    })?;
    let chunks = vocab.div_ceil(TOP_K_CHUNK);
    to_u32(op, "rows * chunks * k candidates", rows * chunks * k)?;
    Ok(TopKArgs {
        rows: to_u32(op, "rows", rows)?,
        vocab: to_u32(op, "vocab", vocab)?,
        chunks: to_u32(op, "chunks", chunks)?,
        k: to_u32(op, "k", k)?,
        multiplier,
        softcap: softcap.unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_pass_through_and_bad_ones_are_shape_errors() {
        let a = top_k_log_softmax(3 * 10, 10, 4, 0.5, Some(30.0)).unwrap();
        assert_eq!(a, TopKArgs { rows: 3, vocab: 10, chunks: 1, k: 4, multiplier: 0.5, softcap: 30.0 });
        assert_eq!(top_k_log_softmax(2 * 163_840, 163_840, 32, 1.0, None).unwrap().chunks, 40);
        assert_eq!(top_k_log_softmax(4097, 4097, 32, 1.0, None).unwrap().chunks, 2);
        assert_eq!(top_k_log_softmax(10, 10, 1, 1.0, None).unwrap().softcap, 0.0);
        for (logits, vocab, k, m, cap, says) in [
            (31, 10, 4, 1.0, None, "not rows of 10"),
            (30, 0, 4, 1.0, None, "not rows of 0"),
            (30, 10, 0, 1.0, None, "k = 0"),
            (30, 10, 4, f32::NAN, None, "multiplier NaN"),
            (30, 10, 4, 1.0, Some(0.0), "softcap Some(0.0)"),
        ] {
            let err = top_k_log_softmax(logits, vocab, k, m, cap).unwrap_err().to_string();
            assert!(err.contains(says), "{err} should say {says}");
        }
    }
}
