//! A drafter's per-depth candidates from its logits on the device: only `k` of a row's `vocab`
//! values come back to the host.

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::{launch, shape};

/// Each row of `logits` (`[rows, vocab]`), multiplied by `multiplier` then softcapped (`cap · tanh(x /
/// cap)`) where `softcap` is given, log-softmaxed: its best `k` finite log-probs, each row's sorted
/// best first with ties to the lower token. A row has fewer where it has fewer finite log-probs, none
/// where its softmax is NaN (a NaN logit, an infinite maximum). The CPU op it matches is the engine's
/// `top_k_log_softmax`; the softmax's sum runs in another order, so log-probs agree to rounding.
pub fn top_k_log_softmax(
    kernels: &Kernels,
    logits: &CudaSlice<f32>,
    vocab: usize,
    k: usize,
    multiplier: f32,
    softcap: Option<f32>,
) -> Result<Vec<Vec<(u32, f32)>>> {
    let a = shape::top_k_log_softmax(logits.len(), vocab, k, multiplier, softcap)?;
    if a.rows == 0 {
        return Ok(Vec::new());
    }
    let (rows, row_chunks) = (a.rows as usize, a.rows as usize * a.chunks as usize);
    let chunk = shape::TOP_K_CHUNK as u32;
    let stream = kernels.stream();
    // SAFETY (the allocations): every value is written by its kernel before the next reads it; the
    // candidates past a chunk's count are never read.
    let (mut part, mut cand_token, mut cand_lp, mut cand_count) = unsafe {
        (
            stream.alloc::<f32>(2 * row_chunks)?,
            stream.alloc::<u32>(row_chunks * k)?,
            stream.alloc::<f32>(row_chunks * k)?,
            stream.alloc::<u32>(row_chunks)?,
        )
    };
    let (mut tokens, mut log_probs, mut counts) =
        (stream.alloc_zeros::<u32>(rows * k)?, stream.alloc_zeros::<f32>(rows * k)?, stream.alloc_zeros::<u32>(rows)?);
    let (m, cap) = (a.multiplier, a.softcap);
    // SAFETY: logits hold `rows` rows of `vocab`; part 2 values a (row, chunk); the row_chunks `k` a
    // (row, chunk) and a count each; the outputs `k` a row and a count each.
    unsafe {
        launch::top_k_max_sum(kernels, logits, &mut part, a.rows, a.vocab, chunk, m, cap)?;
        launch::top_k_chunk(
            kernels,
            logits,
            &part,
            &mut cand_token,
            &mut cand_lp,
            &mut cand_count,
            a.rows,
            a.vocab,
            chunk,
            a.k,
            m,
            cap,
        )?;
        launch::top_k_merge(
            kernels,
            &cand_token,
            &cand_lp,
            &cand_count,
            &mut tokens,
            &mut log_probs,
            &mut counts,
            a.rows,
            a.chunks,
            a.k,
        )?;
    }
    let (tokens, log_probs, counts) =
        (stream.clone_dtoh(&tokens)?, stream.clone_dtoh(&log_probs)?, stream.clone_dtoh(&counts)?);
    Ok(counts
        .iter()
        .enumerate()
        .map(|(r, &n)| {
            let row = r * k..r * k + n as usize;
            let mut best: Vec<(u32, f32)> =
                tokens[row.clone()].iter().copied().zip(log_probs[row].iter().copied()).collect();
            best.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            best
        })
        .collect())
}
