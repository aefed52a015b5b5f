//! The KV cache on the GPU: MLA's latent entries (`[c_kv | k_pe]`, bf16, or f32 for an f32 model) in pages of
//! [`PAGE_TOKENS`] tokens, found through a page table on the device. A page holds its tokens' entries
//! of every layer: entry `t` of layer `l` is at `table[t / PAGE_TOKENS] + (l * PAGE_TOKENS + t %
//! PAGE_TOKENS) * width` values.
//!
//! Room grows by allocating chunks of pages and writing their addresses into the table: nothing is
//! ever copied to grow, and neither the table nor a page moves, so every recorded CUDA graph stays
//! valid. The table is sized once for the model's context; the bytes the pages may take are bounded
//! by a budget ([`KvBudget`]), so a context that does not fit is an error naming the bound, before
//! the GPU runs out of memory.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, DevicePtr};
use kdtree_jit::kernel::Kernels;

use super::mla::{LatentKernels, PAGE_TOKENS};
use super::tensor::{CudaBatch, CudaTensor};
use crate::error::{EngineError, Result};
use crate::registry::{Heads, KvStore, check_compact};

/// Pages allocated together when the cache grows: 4096 tokens, few allocations for long contexts
/// and little unused room for short ones.
const CHUNK_PAGES: usize = 64;

/// How many bytes the KV pages of one cache may take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvBudget {
    /// This share of the device memory free when the cache is first used.
    FreeFraction(f64),
    Bytes(usize),
}

impl Default for KvBudget {
    /// 90% of the free memory: the rest is headroom for activations and graphs.
    fn default() -> Self {
        KvBudget::FreeFraction(0.9)
    }
}

pub struct CudaKv {
    pub(super) heads: Heads,
    pub(super) layers: usize,
    /// The most tokens the table can address (the model's context).
    max_tokens: usize,
    budget: KvBudget,
    /// Allocated on first use: the page table, `max_tokens / PAGE_TOKENS` addresses.
    pub(super) table: Option<CudaSlice<u64>>,
    /// Where the kernels widen an FP8 layer for many rows ([`LatentKernels::widens`]): the table of
    /// each page's bf16 room for one layer, after its entries of every layer.
    pub(super) wide_table: Option<CudaSlice<u64>>,
    /// The pages' memory, in chunks of [`CHUNK_PAGES`] pages.
    chunks: Vec<CudaSlice<u16>>,
    /// The bytes the pages may take, resolved from `budget` on first use.
    limit: Option<usize>,
    len: usize,
    kernels: Arc<Kernels>,
    /// The kernels of the cache's dtype; `None` for a cache made before a model of that KV dtype was
    /// loaded: it can hold nothing.
    mla: Option<LatentKernels>,
    /// Forwards recorded from this cache, which read its table.
    pub(super) graphs: Graphs,
}

impl CudaKv {
    pub(super) fn new(
        kernels: Arc<Kernels>,
        mla: Option<LatentKernels>,
        layers: usize,
        heads: Heads,
        max_tokens: usize,
        budget: KvBudget,
    ) -> Self {
        Self {
            heads,
            layers,
            max_tokens,
            budget,
            table: None,
            wide_table: None,
            chunks: Vec::new(),
            limit: None,
            len: 0,
            kernels,
            mla,
            graphs: Graphs::default(),
        }
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.kernels.stream()
    }

    /// How many forward sizes are recorded as CUDA graphs from this cache.
    pub fn recorded_graphs(&self) -> usize {
        self.graphs.recorded()
    }

    /// Bytes of one page: its tokens' entries of every layer, then, where the kernels widen, room
    /// for one layer of them in bf16.
    fn page_bytes(&self) -> usize {
        PAGE_TOKENS * (self.entries_bytes_per_token() + self.wide_bytes_per_token())
    }

    fn entries_bytes_per_token(&self) -> usize {
        self.heads.kv_bytes_per_token(self.layers)
    }

    /// The bf16 room for one widened layer, a token: 0 unless the kernels widen.
    fn wide_bytes_per_token(&self) -> usize {
        if self.mla.as_ref().is_some_and(LatentKernels::widens) { 2 * self.heads.width() } else { 0 }
    }

    /// Tokens with room now.
    pub(crate) fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK_PAGES * PAGE_TOKENS
    }

    /// The most tokens this cache can hold: the model's context, or fewer where the budget binds.
    pub fn max_tokens(&self) -> Result<usize> {
        let pages = self.limit_bytes()? / self.page_bytes().max(1);
        Ok(self.max_tokens.min(pages / CHUNK_PAGES * CHUNK_PAGES * PAGE_TOKENS))
    }

    fn limit_bytes(&self) -> Result<usize> {
        if let Some(l) = self.limit {
            return Ok(l);
        }
        Ok(match self.budget {
            KvBudget::Bytes(b) => b,
            KvBudget::FreeFraction(f) => {
                let (free, _) = cudarc::driver::result::mem_get_info()?;
                (free as f64 * f) as usize
            }
        })
    }

    /// Room for `entries` entries, the committed ones kept in place: more pages, their addresses
    /// written to the table. Nothing moves, so recorded graphs stay valid.
    pub(super) fn reserve(&mut self, entries: usize) -> Result<()> {
        if entries <= self.capacity() {
            return Ok(());
        }
        let limit = self.limit_bytes()?;
        self.limit = Some(limit);
        let max = self.max_tokens()?;
        if entries > max {
            return Err(EngineError::KvCacheFull {
                tokens: entries,
                max,
                bytes_per_token: self.page_bytes() / PAGE_TOKENS,
                budget: limit,
            });
        }
        let stream = self.stream().clone();
        let table_len = self.max_tokens.div_ceil(PAGE_TOKENS);
        if self.table.is_none() {
            self.table = Some(stream.alloc_zeros::<u64>(table_len.max(1))?);
        }
        let widens = self.wide_bytes_per_token() > 0;
        if widens && self.wide_table.is_none() {
            self.wide_table = Some(stream.alloc_zeros::<u64>(table_len.max(1))?);
        }
        let wide_offset = PAGE_TOKENS * self.entries_bytes_per_token();
        let values_per_page = self.page_bytes() / 2;
        while entries > self.capacity() {
            let chunk = stream.alloc_zeros::<u16>(CHUNK_PAGES * values_per_page)?;
            let first = self.chunks.len() * CHUNK_PAGES;
            let base = {
                let (base, _sync) = chunk.device_ptr(&stream);
                base
            };
            let pages = CHUNK_PAGES.min(table_len - first);
            let addresses: Vec<u64> = (0..pages).map(|p| base + (2 * p * values_per_page) as u64).collect();
            let table = self.table.as_mut().expect("allocated above");
            stream.memcpy_htod(&addresses, &mut table.slice_mut(first..first + pages))?;
            if let Some(wide) = self.wide_table.as_mut() {
                let addresses: Vec<u64> = addresses.iter().map(|a| a + wide_offset as u64).collect();
                stream.memcpy_htod(&addresses, &mut wide.slice_mut(first..first + pages))?;
            }
            self.chunks.push(chunk);
        }
        Ok(())
    }
}

/// The graphs recorded from one cache, by batch size and tapped layers ([`super::graph`] records and
/// replays them).
#[derive(Default)]
pub(crate) struct Graphs {
    pub(super) seen: HashSet<GraphKey>,
    pub(super) recorded: HashMap<GraphKey, Recorded>,
}

/// What a recorded forward is for: its batch size and the layers whose hidden states it hands out.
pub(super) type GraphKey = (usize, Vec<usize>);

impl Graphs {
    /// How many sizes are recorded.
    pub(crate) fn recorded(&self) -> usize {
        self.recorded.len()
    }
}

/// One recorded forward and the buffers it reads its inputs from and writes its outputs to.
pub(super) struct Recorded {
    pub(super) graph: CudaGraph,
    pub(super) batch: CudaBatch,
    pub(super) ids: CudaSlice<u32>,
    pub(super) count: CudaSlice<u32>,
    /// The tapped layers' hidden states, `[n, taps' cols]`, when the forward hands them out.
    pub(super) taps: Option<CudaTensor>,
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
        let rows: Vec<u32> = keep.iter().map(|&j| (start + j) as u32).collect();
        let stream = self.stream().clone();
        let idx = stream.clone_htod(&rows)?;
        let at = stream.clone_htod(&[start as u32])?;
        let table = self.table.as_ref().expect("a cache holding entries has a table");
        let Some(mla) = self.mla.as_ref() else {
            return Err(EngineError::NotLoaded {
                op: "compact",
                what: "the MLA kernels of this cache's model (the cache was made before the model was loaded)".into(),
            });
        };
        for layer in 0..self.layers {
            // Gathered first, then written back: kept entries move down onto entries still to be read.
            let kept = mla.gather(table, self.heads, layer, &idx)?;
            mla.append_entries(&self.kernels, table, self.heads, layer, &kept, rows.len(), &at)?;
        }
        self.len = start + keep.len();
        Ok(())
    }

    fn commit(&mut self, n: usize) {
        self.len += n;
    }

    fn rollback(&mut self) {}
}
