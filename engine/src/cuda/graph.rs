//! CUDA graphs of whole forwards: the work of a forward of n tokens is recorded once and replayed for
//! later forwards of n tokens from the same cache, so that a decode step is one launch, not one per op.
//!
//! A replay changes only the data in the buffers of its batch: token ids, positions, the mask and the
//! cache's length, which the KV append and attention read from the device for this reason. Every
//! address recorded must stay put: the weights (fixed once loaded), the cache's page table (which
//! growth writes new pages into without moving, [`super::CudaKv::reserve`]), the graph's own batch
//! and output buffers (the argmax, and the taps of a forward that hands out hidden states to a
//! drafter), and the activations, which the graph allocates and frees itself (the stream-ordered
//! allocations of a captured forward become the graph's memory nodes). So graphs live in the cache
//! they were recorded from, and a model's forward enqueues the same work for every batch of one size
//! and taps (see [`crate::registry::Backend::forward_argmax`]).
//!
//! A size (with its taps) is recorded the second time it runs: the first runs eagerly, which also
//! loads every module (lazily loaded modules are never first touched inside a capture), and a size
//! seen once, such as a prompt, is never recorded.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use super::CudaBackend;
use super::kv::{CudaKv, GraphKey, Recorded};
use super::ops;
use super::tensor::{CudaBatch, CudaTensor, HostBatch, MAX_GRAPH_TOKENS};
use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use crate::registry::{Argmax, Backend, KvStore, Taps, eager_forward_argmax};

/// The most sizes one cache records; further sizes run eagerly. Each graph keeps the memory of its
/// activations.
const MAX_GRAPHS: usize = 32;

/// [`crate::registry::Backend::forward_argmax`] through a graph of `cache`'s for this size and taps:
/// replayed when recorded, recorded when seen before, else run eagerly.
pub(super) fn forward_argmax<F>(
    b: &CudaBackend,
    cache: &mut CudaKv,
    tokens: &[u32],
    positions: &[usize],
    mask: &TreeMask,
    taps: Option<Taps<'_>>,
    forward: F,
) -> Result<Argmax<CudaTensor>>
where
    F: FnOnce(&mut CudaKv, &CudaBatch, Option<&mut CudaTensor>) -> Result<CudaTensor>,
{
    let n = tokens.len();
    // Room first: pages are added outside the capture.
    cache.reserve(cache.len() + n)?;
    let key: GraphKey = (n, taps.map(|t| t.layers.to_vec()).unwrap_or_default());
    let first = cache.graphs.seen.insert(key.clone());
    let recorded = cache.graphs.recorded.contains_key(&key);
    if !recorded && (first || n > MAX_GRAPH_TOKENS || cache.graphs.recorded.len() >= MAX_GRAPHS) {
        return eager_forward_argmax(b, cache, tokens, positions, mask, taps, forward);
    }
    let inputs = HostBatch::new(tokens, positions, mask, cache.len())?;
    let s = b.stream();
    if let Some(r) = cache.graphs.recorded.get_mut(&key) {
        inputs.write(s, &mut r.batch)?;
        return replay(b, r);
    }
    let taps = taps.map(|t| b.zeros(n, t.cols)).transpose()?;
    let r = record(b, cache, inputs.upload(s)?, taps, forward)?;
    let out = replay(b, &r);
    cache.graphs.recorded.insert(key, r);
    out
}

/// Launches `r`; its taps are copied out, since the next replay overwrites them.
fn replay(b: &CudaBackend, r: &Recorded) -> Result<Argmax<CudaTensor>> {
    r.graph.launch()?;
    let taps = r.taps.as_ref().map(|t| b.columns(t, 0, t.cols)).transpose()?;
    let (ids, nonfinite) = ops::read_argmax_checked(b.kernels(), &r.ids, &r.count)?;
    Ok(Argmax { ids, nonfinite, taps })
}

/// Captures `forward` of `batch`, writing its taps into `taps`, and the argmax of its logits into a
/// graph; nothing runs until it is launched.
fn record<F>(
    b: &CudaBackend,
    cache: &mut CudaKv,
    batch: CudaBatch,
    mut taps: Option<CudaTensor>,
    forward: F,
) -> Result<Recorded>
where
    F: FnOnce(&mut CudaKv, &CudaBatch, Option<&mut CudaTensor>) -> Result<CudaTensor>,
{
    let s = b.stream();
    let (mut ids, mut count) = (b.output::<u32>(batch.n)?, b.output::<u32>(1)?);
    // Thread-local: only this thread's calls are checked for what a capture cannot hold.
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let enqueued = forward(cache, &batch, taps.as_mut())
        .and_then(|logits| ops::argmax_checked(b.kernels(), &logits.data, logits.cols, &mut ids, &mut count));
    // The capture ends whatever happened, so the stream is never left capturing.
    let graph = s.end_capture(CUgraphInstantiate_flags(0));
    enqueued?;
    let graph = graph?.ok_or(EngineError::EmptyGraph)?;
    Ok(Recorded { graph, batch, ids, count, taps })
}
