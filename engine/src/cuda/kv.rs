//! The KV cache on the GPU: per layer, keys `[capacity, heads, nope + rope]` and values
//! `[capacity, heads, v]` in f32, the layout [`crate::KvCache`] keeps on the host. It grows by
//! doubling when a forward needs more room.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use kdtree_jit::kernel::Kernels;

use super::graph::Graphs;
use crate::error::Result;
use crate::model::check_compact;
use crate::registry::{Heads, KvStore};

pub struct CudaKv {
    pub(super) heads: Heads,
    layer_count: usize,
    /// Empty until the first forward reserves room.
    pub(super) layers: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub(super) capacity: usize,
    len: usize,
    kernels: Arc<Kernels>,
    /// Forwards recorded from this cache, which read its layers' buffers.
    pub(super) graphs: Graphs,
}

impl CudaKv {
    pub(super) fn new(kernels: Arc<Kernels>, layers: usize, heads: Heads) -> Self {
        Self { heads, layer_count: layers, layers: Vec::new(), capacity: 0, len: 0, kernels, graphs: Graphs::default() }
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.kernels.stream()
    }

    pub(super) fn widths(&self) -> (usize, usize) {
        (self.heads.heads * self.heads.qk(), self.heads.heads * self.heads.v)
    }

    /// How many forward sizes are recorded as CUDA graphs from this cache.
    pub fn recorded_graphs(&self) -> usize {
        self.graphs.recorded()
    }

    /// Room for `entries` entries in every layer, the committed ones kept. Growing moves the layers,
    /// so the graphs recorded from them are dropped.
    pub(super) fn reserve(&mut self, entries: usize) -> Result<()> {
        if entries <= self.capacity {
            return Ok(());
        }
        self.graphs.clear();
        let capacity = entries.next_power_of_two().max(256);
        let (kw, vw) = self.widths();
        let len = self.len;
        let stream = self.stream().clone();
        let mut grown = Vec::with_capacity(self.layer_count);
        for i in 0..self.layer_count {
            let (mut k, mut v) = (stream.alloc_zeros::<f32>(capacity * kw)?, stream.alloc_zeros::<f32>(capacity * vw)?);
            if let Some((old_k, old_v)) = self.layers.get(i).filter(|_| len > 0) {
                stream.memcpy_dtod(&old_k.slice(0..len * kw), &mut k.slice_mut(0..len * kw))?;
                stream.memcpy_dtod(&old_v.slice(0..len * vw), &mut v.slice_mut(0..len * vw))?;
            }
            grown.push((k, v));
        }
        self.layers = grown;
        self.capacity = capacity;
        Ok(())
    }
}

impl KvStore for CudaKv {
    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn compact(&mut self, start: usize, keep: &[usize]) -> Result<()> {
        check_compact(self.len, start, keep)?;
        if keep.iter().enumerate().all(|(i, &j)| i == j) {
            self.len = start + keep.len();
            return Ok(());
        }
        let (kw, vw) = self.widths();
        let rows: Vec<u32> = keep.iter().map(|&j| (start + j) as u32).collect();
        let stream = self.stream().clone();
        let idx = stream.clone_htod(&rows)?;
        for (k, v) in &mut self.layers {
            for (buf, w) in [(k, kw), (v, vw)] {
                // Gathered first, then copied back: kept rows move down onto rows still to be read.
                let mut kept = stream.alloc_zeros::<f32>(rows.len() * w)?;
                kdtree_kernels::gather_rows_f32(&self.kernels, buf, w, &idx, 0, rows.len(), &mut kept)?;
                stream.memcpy_dtod(&kept, &mut buf.slice_mut(start * w..(start + rows.len()) * w))?;
            }
        }
        self.len = start + keep.len();
        Ok(())
    }

    fn commit(&mut self, n: usize) {
        self.len += n;
    }

    fn rollback(&mut self) {}
}
