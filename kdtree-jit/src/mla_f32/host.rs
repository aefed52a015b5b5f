//! A host round trip of the [`MlaF32Kernel`] attention, for the GPU tests that check it against the
//! CPU reference ([`crate::mla::reference`]).

use super::MlaF32Kernel;
use crate::mla::launch::HostInputs;
use crate::mla::{MlaShape, NewMask};
use crate::{Gpu, Result};

/// One attention launch from host data: `q` `[n, heads, width]` and `kv` `[past + n, width]` (logical
/// order, the new rows' entries last), the cache laid out by [`crate::mla::upload_cache`] (shuffled pages of
/// `page` entries, layer 1 of 2). Returns `o_lat`, `[n, heads, latent]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_host(
    gpu: &Gpu,
    kernel: &MlaF32Kernel,
    s: &MlaShape,
    q: &[f32],
    kv: &[f32],
    past: usize,
    mask: &NewMask,
    page: usize,
) -> Result<Vec<f32>> {
    let (inputs, n) = HostInputs::upload(gpu, "attention_host", s, q, kv, s.width(), past, mask, page)?;
    let mut o_lat = gpu.stream.alloc_zeros::<f32>((n * s.heads * s.latent).max(1))?;
    let (q, past) = (inputs.q.as_view(), inputs.past.as_view());
    kernel.attention(gpu, s, n, &q, &inputs.cache(page), &past, &inputs.mask(mask), &mut o_lat.as_view_mut())?;
    let mut out = gpu.stream.clone_dtoh(&o_lat)?;
    out.truncate(n * s.heads * s.latent);
    Ok(out)
}
