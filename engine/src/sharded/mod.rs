//! Tensor-, expert- and vocabulary-parallel execution simulated on the CPU: [`ShardedCpu`] runs the
//! model over `ranks` ranks, each a thread computing its part with the CPU backend's own ops, and
//! gathers the parts in rank order. It exists so that CI can check what a TP/EP-N forward must
//! satisfy in exact mode: its logits equal the single-rank forward's, bit for bit.
//!
//! | op | split across ranks | collective |
//! |---|---|---|
//! | [`Backend::linear`] (q/kv projections, o_proj, MLP gate/up and down, LM head) | the weight's N output rows in contiguous blocks | all-gather of `[T, N]` |
//! | [`Backend::embedding`] | the table's vocabulary rows | all-gather of `[T, hidden]` |
//! | [`Backend::attention`] | heads in contiguous blocks | all-gather of `[T, heads * v]` |
//! | [`Backend::moe`] | routed experts in contiguous blocks (expert parallel) | gather of the `(token, slot)` outputs |
//! | [`Backend::argmax`] | the vocabulary in contiguous blocks | gather of each rank's `(max, index)` |
//!
//! Norms, rope, the KV append, `silu_mul`, the residual adds and a drafter's grouped-query attention
//! run once on the gathered tensors (every rank would compute the same bits), as does the MoE router
//! (replicated on every rank). The KV cache holds every head; each rank's attention reads its heads' columns of it. Blocks are
//! as even as can be when the rank count does not divide a dimension (`blocks`); a rank whose
//! block is empty idles.
//!
//! # Why the result is the same bits
//!
//! Every output column of a linear is computed by exactly one rank, from its own weight row, over
//! the same K in the same order as unsharded (the CPU GEMMs compute each output as one fixed-order
//! dot), so column-parallel layers are bitwise equal per column and gathering the blocks in rank
//! order rebuilds the unsharded tensor. Row-parallel layers (o_proj, the MLP's down, an expert's
//! down) would split K and need a sum across ranks, which changes the rounding; in exact mode they
//! run as an all-gather of their input followed by a column split of their output instead, so they
//! move `[T, K]` gathered rather than `[T, N]` all-reduced ([`CollectiveLog`] counts what moves).
//! Attention heads are independent, so a block of heads gives those heads' outputs exactly. In the
//! MoE each `(token, slot)` output is computed by the rank holding that expert over the same rows
//! as unsharded, then placed in its slot and combined in the unsharded order (slot order, that is
//! ascending expert index). The argmax takes each rank's first maximum of its block, then the first
//! maximum of those in rank order, NaN handled as [`crate::ops::cpu::argmax`] does: the first
//! maximum of the whole row.
//!
//! ```
//! use std::sync::Arc;
//! use kdtree_engine::Model;
//! use kdtree_engine::sharded::ShardedCpu;
//! use kdtree_engine::tiny::{TinySpec, write_tiny_model};
//!
//! let dir = tempfile::tempdir()?;
//! write_tiny_model(dir.path(), &TinySpec::default())?;
//! let one = Model::load(dir.path())?;
//! let four = Model::load_on(dir.path(), Arc::new(ShardedCpu::new(4)?))?;
//! let (mut a, mut b) = (one.new_cache(), four.new_cache());
//! assert_eq!(one.forward(&mut a, &[1, 2, 3], &[0, 1, 2], None)?, four.forward(&mut b, &[1, 2, 3], &[0, 1, 2], None)?);
//! println!("{:?}", four.backend().take_log());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod collective;

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

pub(crate) use collective::blocks;
pub use collective::{CollectiveLog, Traffic};

use collective::Op;
use kdtree_jit::mla::MlaShape;

use crate::cpu::{CpuAbsorb, CpuBackend, CpuBatch, CpuExperts, CpuTensor, KvCache, absorbed_attention};
use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use crate::ops::cpu;
use crate::registry::{Backend, GqaShape, Heads, HostExperts, HostLinear, KvDtype, KvStore, LogitTransform, RopeSpan};

/// The CPU backend over `ranks` simulated ranks.
#[derive(Debug)]
pub struct ShardedCpu {
    ranks: usize,
    log: Mutex<CollectiveLog>,
}

/// A linear weight split by output rows: each nonempty block with the rank that holds it.
#[derive(Clone, Debug)]
pub struct ShardedLinear {
    n: usize,
    shards: Vec<(Range<usize>, HostLinear)>,
}

/// One MoE layer: the router (replicated) and the experts, rank `r` computing block `r`.
#[derive(Clone, Debug)]
pub struct ShardedExperts {
    experts: CpuExperts,
    blocks: Vec<Range<usize>>,
}

impl ShardedCpu {
    /// `ranks` must be at least 1.
    pub fn new(ranks: usize) -> Result<Self> {
        if ranks == 0 {
            return Err(EngineError::ArgumentOutOfRange {
                what: "a sharded backend's rank count".into(),
                value: 0,
                limit: "it needs at least one rank".into(),
            });
        }
        Ok(Self { ranks, log: Mutex::default() })
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The collectives since the last take, and a fresh log.
    pub fn take_log(&self) -> CollectiveLog {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, CollectiveLog> {
        // The log is plain counters: one a panicking rank left behind is still readable.
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, op: Op, bytes: usize) {
        if self.ranks > 1 {
            self.lock().record(op, bytes);
        }
    }

    /// `f(i)` for `i` in `0..parts`, each on a thread of its own (one per rank), results in order.
    fn on_ranks<T: Send>(
        &self,
        op: &'static str,
        parts: usize,
        f: impl Fn(usize) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        let ranks = self.ranks;
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = (0..parts).map(|i| s.spawn(move || f(i))).collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(rank, h)| h.join().map_err(|_| EngineError::RankFailed { rank, ranks, op })?)
                .collect()
        })
    }
}

/// The rows of `parts` side by side, in order: the all-gather of column blocks.
fn concat_columns(parts: &[CpuTensor], rows: usize) -> CpuTensor {
    let cols = parts.iter().map(|p| p.cols).sum();
    let mut data = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for p in parts {
            data.extend_from_slice(&p.data[r * p.cols..(r + 1) * p.cols]);
        }
    }
    CpuTensor { data, cols }
}

/// Columns `block` of every `width`-wide group of each row of `x` (`[rows, groups * width]`): one
/// rank's heads.
fn head_columns(x: &[f32], groups: usize, width: usize, block: &Range<usize>) -> Vec<f32> {
    x.chunks_exact(groups * width).flat_map(|row| row[block.start * width..block.end * width].to_vec()).collect()
}

impl Backend for ShardedCpu {
    type Tensor = CpuTensor;
    type Vector = Vec<f32>;
    type Linear = ShardedLinear;
    type Experts = ShardedExperts;
    type Batch = CpuBatch;
    type Cache = KvCache;
    type Rows = CpuTensor;
    type Absorb = CpuAbsorb;

    fn describe(&self) -> String {
        format!("cpu, {} simulated ranks", self.ranks)
    }

    fn vector(&self, v: &[f32]) -> Result<Vec<f32>> {
        CpuBackend.vector(v)
    }

    fn linear_weight(&self, name: &str, w: HostLinear) -> Result<ShardedLinear> {
        let shards = blocks(w.n(), self.ranks)
            .into_iter()
            .filter(|b| !b.is_empty())
            .map(|b| Ok((b.clone(), CpuBackend.linear_weight(name, w.rows(b)?)?)))
            .collect::<Result<_>>()?;
        Ok(ShardedLinear { n: w.n(), shards })
    }

    fn experts(&self, name: &str, e: HostExperts) -> Result<ShardedExperts> {
        let n = e.experts.len();
        Ok(ShardedExperts { experts: CpuBackend.experts(name, e)?, blocks: blocks(n, self.ranks) })
    }

    fn absorb(&self, name: &str, kv_b: &HostLinear, heads: Heads) -> Result<CpuAbsorb> {
        CpuBackend.absorb(name, kv_b, heads)
    }

    fn kv_dtype(&self, f32_weights: bool) -> KvDtype {
        CpuBackend.kv_dtype(f32_weights)
    }

    fn new_cache(&self, layers: usize, heads: Heads, max_tokens: usize) -> KvCache {
        CpuBackend.new_cache(layers, heads, max_tokens)
    }

    fn batch(&self, tokens: &[u32], positions: &[usize], mask: &TreeMask, past: usize) -> Result<CpuBatch> {
        CpuBackend.batch(tokens, positions, mask, past)
    }

    fn embedding(&self, table: &ShardedLinear, batch: &CpuBatch) -> Result<CpuTensor> {
        if let Some(&id) = batch.tokens.iter().find(|&&t| t as usize >= table.n) {
            return Err(EngineError::TokenOutOfRange { id, vocab: table.n });
        }
        // Each rank looks up the tokens of its vocabulary block, at local ids.
        let parts = self.on_ranks("embedding", table.shards.len(), |i| {
            let (block, w) = &table.shards[i];
            let (at, local): (Vec<usize>, Vec<u32>) = (batch.tokens.iter().enumerate())
                .filter(|&(_, &t)| block.contains(&(t as usize)))
                .map(|(j, &t)| (j, t - block.start as u32))
                .unzip();
            let positions = vec![0; local.len()];
            let rows =
                CpuBackend.embedding(w, &CpuBackend.batch(&local, &positions, &TreeMask::causal(local.len()), 0)?)?;
            Ok((at, rows))
        })?;
        let cols = table.shards.first().map_or(0, |(_, w)| w.k());
        let mut data = vec![0f32; batch.tokens.len() * cols];
        for (at, rows) in &parts {
            for (&j, row) in at.iter().zip(rows.data.chunks_exact(cols)) {
                data[j * cols..(j + 1) * cols].copy_from_slice(row);
            }
        }
        self.record(Op::Embedding, 4 * data.len());
        Ok(CpuTensor { data, cols })
    }

    fn rmsnorm(&self, x: &CpuTensor, weight: &Vec<f32>, eps: f32) -> Result<CpuTensor> {
        CpuBackend.rmsnorm(x, weight, eps)
    }

    fn linear(&self, x: &CpuTensor, w: &ShardedLinear) -> Result<CpuTensor> {
        let parts = self.on_ranks("linear", w.shards.len(), |i| CpuBackend.linear(x, &w.shards[i].1))?;
        let y = concat_columns(&parts, x.rows());
        self.record(Op::Linear, 4 * y.data.len());
        Ok(y)
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        CpuBackend.add_assign(x, y)
    }

    fn silu_mul(&self, x: &CpuTensor, _down: &ShardedLinear) -> Result<CpuTensor> {
        crate::cpu::silu_mul_rows(x)
    }

    fn reshape(&self, x: CpuTensor, cols: usize) -> Result<CpuTensor> {
        CpuBackend.reshape(x, cols)
    }

    fn columns(&self, x: &CpuTensor, start: usize, len: usize) -> Result<CpuTensor> {
        CpuBackend.columns(x, start, len)
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CpuTensor> {
        CpuBackend.zeros(rows, cols)
    }

    fn place_columns(&self, dst: &mut CpuTensor, start: usize, x: &CpuTensor) -> Result<()> {
        CpuBackend.place_columns(dst, start, x)
    }

    fn select_rows(&self, x: &CpuTensor, rows: &[usize]) -> Result<CpuTensor> {
        CpuBackend.select_rows(x, rows)
    }

    fn rope(&self, x: &mut CpuTensor, span: RopeSpan, cos: &Vec<f32>, sin: &Vec<f32>, batch: &CpuBatch) -> Result<()> {
        CpuBackend.rope(x, span, cos, sin, batch)
    }

    fn kv_append(
        &self,
        cache: &mut KvCache,
        layer: usize,
        latent: &CpuTensor,
        k_rope: &CpuTensor,
        batch: &CpuBatch,
    ) -> Result<()> {
        CpuBackend.kv_append(cache, layer, latent, k_rope, batch)
    }

    fn attention(
        &self,
        q: &CpuTensor,
        cache: &KvCache,
        layer: usize,
        batch: &CpuBatch,
        kv_b: &CpuAbsorb,
    ) -> Result<CpuTensor> {
        let h = cache.heads();
        let (entries, past, n) = (cache.layer(layer), cache.len(), batch.mask.len());
        if q.data.len() != n * h.mla.heads * h.qk() || entries.len() != (past + n) * h.width() {
            // The CPU backend's own checks name the mismatch.
            return CpuBackend.attention(q, cache, layer, batch, kv_b);
        }
        // Each rank holds its heads' queries and kv_b rows, and the whole (shared) latent cache.
        let heads: Vec<Range<usize>> = blocks(h.mla.heads, self.ranks).into_iter().filter(|b| !b.is_empty()).collect();
        let parts = self.on_ranks("attention", heads.len(), |i| {
            let b = &heads[i];
            let rows = h.mla.nope + h.mla.v;
            let local = Heads { mla: MlaShape { heads: b.len(), ..h.mla }, ..h };
            let qr = head_columns(&q.data, h.mla.heads, h.qk(), b);
            let w = &kv_b.0[b.start * rows * h.mla.latent..b.end * rows * h.mla.latent];
            Ok(CpuTensor {
                data: absorbed_attention(&qr, entries, past, &batch.mask, local, w),
                cols: b.len() * h.mla.v,
            })
        })?;
        let y = concat_columns(&parts, n);
        self.record(Op::Attention, 4 * y.data.len());
        Ok(y)
    }

    fn new_rows(&self, cols: usize) -> Result<CpuTensor> {
        CpuBackend.new_rows(cols)
    }

    fn append_rows(&self, rows: &mut CpuTensor, x: &CpuTensor) -> Result<()> {
        CpuBackend.append_rows(rows, x)
    }

    fn gqa_attention(
        &self,
        q: &CpuTensor,
        context: [&CpuTensor; 2],
        block: [&CpuTensor; 2],
        shape: GqaShape,
    ) -> Result<CpuTensor> {
        CpuBackend.gqa_attention(q, context, block, shape)
    }

    fn moe(&self, x: &CpuTensor, e: &ShardedExperts) -> Result<CpuTensor> {
        let (h, k) = (x.cols, e.experts.top_k());
        let routes = e.experts.routes(x)?;
        let parts = self.on_ranks("moe", e.blocks.len(), |r| {
            let mut outs = vec![0f32; x.rows() * k * h];
            e.experts.expert_outputs(x, &routes, e.blocks[r].clone(), &mut outs)?;
            Ok(outs)
        })?;
        // Each (token, slot) output from the rank holding the slot's expert.
        let mut outs = vec![0f32; x.rows() * k * h];
        let mut pairs = 0;
        for (row, r) in routes.iter().enumerate() {
            for (slot, &(expert, _)) in r.iter().enumerate() {
                let rank = e.blocks.iter().position(|b| b.contains(&expert)).expect("the blocks cover every expert");
                let at = (row * k + slot) * h..(row * k + slot + 1) * h;
                outs[at.clone()].copy_from_slice(&parts[rank][at]);
                pairs += 1;
            }
        }
        self.record(Op::Moe, 4 * pairs * h);
        Ok(e.experts.combine(&routes, &outs, h))
    }

    fn argmax(&self, x: &CpuTensor) -> Result<Vec<u32>> {
        let vocab: Vec<Range<usize>> = blocks(x.cols, self.ranks).into_iter().filter(|b| !b.is_empty()).collect();
        if vocab.is_empty() {
            return CpuBackend.argmax(x);
        }
        let parts = self.on_ranks("argmax", vocab.len(), |i| {
            let b = &vocab[i];
            let local = CpuBackend.columns(x, b.start, b.len())?;
            let ids = cpu::argmax(&local.data, local.cols);
            Ok(ids
                .iter()
                .enumerate()
                .map(|(r, &j)| (local.data[r * local.cols + j as usize], b.start + j as usize))
                .collect::<Vec<_>>())
        })?;
        self.record(Op::Argmax, 8 * x.rows() * vocab.len());
        // The first maximum over the ranks' maxima, in rank order, as `cpu::argmax` scans a row.
        Ok((0..x.rows())
            .map(|row| {
                let mut best = parts[0][row];
                for p in &parts[1..] {
                    let (v, j) = p[row];
                    if v > best.0 || (best.0.is_nan() && !v.is_nan()) {
                        best = (v, j);
                    }
                }
                best.1 as u32
            })
            .collect())
    }

    fn top_k_log_softmax(&self, x: &CpuTensor, k: usize, transform: LogitTransform) -> Result<Vec<Vec<(u32, f32)>>> {
        CpuBackend.top_k_log_softmax(x, k, transform)
    }

    fn argmax_checked(&self, x: &CpuTensor) -> Result<(Vec<u32>, usize)> {
        Ok((self.argmax(x)?, cpu::count_nonfinite(&x.data)))
    }

    fn to_host(&self, x: &CpuTensor) -> Result<Vec<f32>> {
        CpuBackend.to_host(x)
    }

    fn upload(&self, data: &[f32], cols: usize) -> Result<CpuTensor> {
        CpuBackend.upload(data, cols)
    }
}
