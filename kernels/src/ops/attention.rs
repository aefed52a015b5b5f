//! Grouped-query attention with no mask: a DFlash drafter's block over its context and itself.

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::shape::{self, GqaSizes};
use crate::{Error, launch};

/// `out` (`[n, heads * head_dim]`) = softmax(q · kᵀ / sqrt(head_dim)) · v per query head, over the
/// first `s.context` rows of `context` (`[keys, values]`, rows of `kv_heads * head_dim`, buffers that
/// may hold more rows) followed by `block`'s `n` rows; query head `h` reads key/value head
/// `h / (heads / kv_heads)`. The CPU op it matches is the engine's `gqa_attention`; the sums run in
/// another order (an online softmax over key tiles and splits), so results agree to rounding.
pub fn gqa_attention(
    k: &Kernels,
    q: &CudaSlice<f32>,
    context: [&CudaSlice<f32>; 2],
    block: [&CudaSlice<f32>; 2],
    s: GqaSizes,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let a = shape::gqa_attention(s, q.len(), context.map(|c| c.len()), block.map(|b| b.len()), out.len())?;
    if a.n == 0 {
        return Ok(());
    }
    let rows_heads = a.n as usize * a.heads as usize;
    let partials = rows_heads * a.splits as usize;
    let stream = k.stream();
    // SAFETY: every partial is written by the partial kernel before the combine reads it.
    let (mut part_o, mut part_ml) =
        unsafe { (stream.alloc::<f32>(partials * a.head_dim as usize)?, stream.alloc::<f32>(2 * partials)?) };
    let scale = 1.0 / (a.head_dim as f32).sqrt();
    let rows_heads = u32::try_from(rows_heads)
        .map_err(|_| Error::Unsupported { op: "gqa_attention", reason: format!("{rows_heads} (row, head) pairs") })?;
    // SAFETY: the lengths were checked above: q and out n rows of heads * head_dim, the context
    // buffers at least `context` rows and the block's n rows of kv_heads * head_dim; the partials
    // hold n * heads * splits slots; the splits of `chunk` keys cover the context and block keys.
    unsafe {
        launch::gqa_attention_partial(
            k,
            q,
            context[0],
            context[1],
            block[0],
            block[1],
            &mut part_o,
            &mut part_ml,
            a.n,
            a.context,
            a.heads,
            a.kv_heads,
            a.head_dim,
            a.splits,
            a.chunk,
            scale,
        )?;
        launch::gqa_attention_combine(k, &part_o, &part_ml, out, rows_heads, a.splits, a.head_dim)?;
    }
    Ok(())
}
