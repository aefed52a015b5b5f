//! MLA's expanded KV cache and tree attention over it, batch-invariant.

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::{launch, shape};

/// The per-head widths of MLA's keys and values, as kv_b_proj produces them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub heads: usize,
    /// Key columns without rotary embedding (`qk_nope_head_dim`).
    pub nope: usize,
    /// Rotary key columns, shared by all heads (`qk_rope_head_dim`).
    pub rope: usize,
    pub v_dim: usize,
}

/// Appends n tokens to the caches at rows `start..start + n`: `kv` is kv_b_proj's output
/// [n, heads, nope + v_dim], `k_rope` the rotated [n, rope]. Cache row t holds, per head, `[nope | rope]`
/// in `k_cache` ([capacity, heads, nope + rope]) and the value in `v_cache` ([capacity, heads, v_dim]).
///
/// `start` is `start[0]`, on the device, so that a recorded CUDA graph of a forward appends where the
/// cache ends when it is replayed. The caller keeps `start + n <= capacity`; rows past it are skipped.
pub fn kv_append(
    k: &Kernels,
    kv: &CudaSlice<f32>,
    k_rope: &CudaSlice<f32>,
    layout: KvLayout,
    start: &CudaSlice<u32>,
    k_cache: &mut CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
) -> Result<()> {
    let KvLayout { heads, nope, rope, v_dim } = layout;
    let a = shape::kv_append(kv.len(), k_rope.len(), (heads, nope, rope, v_dim), k_cache.len(), v_cache.len())?;
    shape::scalar("kv_append", "start", start.len())?;
    if a.n > 0 {
        // SAFETY: kv is n x heads x (nope + vd), k_rope n x rope, start one value; the caches hold
        // `capacity` rows, and the kernel writes none at or past it.
        unsafe {
            launch::kv_append(k, kv, k_rope, k_cache, v_cache, a.n, a.heads, a.nope, a.rope, a.vd, start, a.capacity)
        }?;
    }
    Ok(())
}

/// The head layout of one attention call, as the engine's `AttentionShape`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub heads: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
    /// Multiplies `q · k` before the softmax.
    pub scale: f32,
}

/// The engine's CPU `attention` on the GPU, over the caches [`kv_append`] writes: `q` [n, heads, qk_dim],
/// `k_cache` and `v_cache` holding at least `past + n` entries, the n new ones last; `mask` [n, words]
/// with words = ceil(n / 32) (see [`mask_words`]); `out` [n, heads, v_dim]. `past` is `past[0]`, on the
/// device (as [`kv_append`]'s start); the caller keeps `past + n` within the caches, and the kernel
/// writes nothing when it is not.
///
/// Query i sees the `past` cached entries, then the new tokens its mask row shows, in cache order;
/// masked keys are skipped, not zero-weighted, and a row that sees nothing gives zeros. A row's output
/// bits depend only on its q and on that sequence of (k, v), never on n, on the split between past and
/// new, or on the other rows: a tree node's output is its path's sequential output.
///
/// No score buffer bounds the context (a running softmax instead); n is at most
/// [`shape::MAX_NEW_TOKENS`] and the head dimensions at most [`shape::MAX_HEAD_DIM`], larger ones are
/// [`crate::Error::Unsupported`].
#[allow(clippy::too_many_arguments, reason = "the CPU op's arguments, the kernels and the output")]
pub fn attention_tree(
    k: &Kernels,
    q: &CudaSlice<f32>,
    k_cache: &CudaSlice<f32>,
    v_cache: &CudaSlice<f32>,
    mask: &CudaSlice<u32>,
    past: &CudaSlice<u32>,
    shape: AttentionShape,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let AttentionShape { heads, qk_dim, v_dim, scale } = shape;
    let dims = (heads, qk_dim, v_dim);
    let a = shape::attention(q.len(), k_cache.len(), v_cache.len(), mask.len(), out.len(), dims)?;
    shape::scalar("attention_tree", "past", past.len())?;
    if a.n > 0 {
        // SAFETY: q is n x heads x qk, out n x heads x vd, mask n x ceil(n / 32), past one value; the
        // caches hold `capacity` entries of heads x qk and heads x vd, and the kernel reads none past
        // them; n <= MAX_NEW_TOKENS keeps the 4 * n bytes of dynamic shared memory within the default limit.
        unsafe {
            launch::attention_tree(k, q, k_cache, v_cache, mask, out, a.n, past, a.capacity, a.heads, a.qk, a.vd, scale)
        }?;
    }
    Ok(())
}

/// The attention mask of n new tokens as [`attention_tree`] reads it: row i is ceil(n / 32) words, bit
/// b of word w set when token i sees token 32w + b.
pub fn mask_words(n: usize, visible: impl Fn(usize, usize) -> bool) -> Vec<u32> {
    let words = n.div_ceil(32);
    let mut mask = vec![0u32; n * words];
    for i in 0..n {
        for j in (0..n).filter(|&j| visible(i, j)) {
            mask[i * words + j / 32] |= 1 << (j % 32);
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_words_pack_each_row_from_bit_zero() {
        // Causal over 33 tokens: row 32 sees all 33, the 33rd in its second word.
        let mask = mask_words(33, |i, j| j <= i);
        assert_eq!(mask.len(), 66);
        assert_eq!(mask[..2], [1, 0]);
        assert_eq!(mask[2 * 31..2 * 31 + 2], [u32::MAX, 0]);
        assert_eq!(mask[2 * 32..], [u32::MAX, 1]);
        assert!(mask_words(0, |_, _| true).is_empty());
    }
}
