//! The CPU backend: the deterministic, batch-invariant reference ops of [`crate::ops::cpu`] on host
//! vectors. Every reduction runs in a fixed order and work is split over rows only, so a row's result
//! is the same bits whether it is computed alone or in a batch.

use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use crate::model::{KvCache, Routing, route};
use crate::ops::cpu::{self, AttentionShape};
use crate::registry::{Backend, Heads, HostExperts, HostLinear, KvStore, RopeLayout, RopeSpan};

/// The reference backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuBackend;

/// f32 rows of `cols` values.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub cols: usize,
}

impl CpuTensor {
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.cols).unwrap_or(0)
    }
}

/// One forward's inputs, as given.
#[derive(Clone, Debug)]
pub struct CpuBatch {
    pub tokens: Vec<u32>,
    pub positions: Vec<usize>,
    pub mask: TreeMask,
}

/// One MoE layer on the CPU.
#[derive(Clone, Debug)]
pub struct CpuExperts {
    routing: Routing,
    router: Vec<f32>,
    bias: Vec<f32>,
    experts: Vec<(HostLinear, HostLinear)>,
}

/// Each row's experts with their weights, in ascending expert index ([`route`]).
pub(crate) type Routes = Vec<Vec<(usize, f32)>>;

impl CpuExperts {
    pub(crate) fn top_k(&self) -> usize {
        self.routing.top_k
    }

    /// Routes every row of `x` (the router in f32, then [`route`]).
    pub(crate) fn routes(&self, x: &CpuTensor) -> Result<Routes> {
        let logits = cpu::linear(&x.data, x.rows(), &self.router, self.routing.n_experts)?;
        Ok(logits.chunks_exact(self.routing.n_experts).map(|l| route(l, &self.bias, &self.routing)).collect())
    }

    /// The outputs of experts `which` for the rows routed to them, written to `outs` (`[rows, top_k,
    /// hidden]`) at `(row, slot)`, slot = rank of the expert among the row's choices; other entries
    /// are left as they are.
    pub(crate) fn expert_outputs(
        &self,
        x: &CpuTensor,
        routes: &Routes,
        which: std::ops::Range<usize>,
        outs: &mut [f32],
    ) -> Result<()> {
        let (h, k) = (x.cols, self.routing.top_k);
        for i in which {
            let (w13, down) = &self.experts[i];
            let users: Vec<(usize, usize)> = routes
                .iter()
                .enumerate()
                .filter_map(|(row, r)| r.iter().position(|&(x, _)| x == i).map(|slot| (row, slot)))
                .collect();
            if users.is_empty() {
                continue;
            }
            let xs: Vec<f32> = users.iter().flat_map(|&(row, _)| x.data[row * h..(row + 1) * h].to_vec()).collect();
            let act = silu_mul_halves(&linear(&xs, users.len(), w13)?, w13.n());
            let ys = linear(&act, users.len(), down)?;
            for (&(row, slot), y) in users.iter().zip(ys.chunks_exact(h)) {
                outs[(row * k + slot) * h..][..h].copy_from_slice(y);
            }
        }
        Ok(())
    }

    /// Each row's expert outputs `outs` (`[rows, top_k, hidden]`), weighted and added in slot order
    /// (= ascending expert index).
    pub(crate) fn combine(&self, routes: &Routes, outs: &[f32], h: usize) -> CpuTensor {
        let k = self.routing.top_k;
        let mut y = vec![0f32; routes.len() * h];
        for (row, r) in routes.iter().enumerate() {
            let acc = &mut y[row * h..(row + 1) * h];
            for (slot, &(_, w)) in r.iter().enumerate() {
                for (a, &o) in acc.iter_mut().zip(&outs[(row * k + slot) * h..][..h]) {
                    *a += o * w;
                }
            }
        }
        CpuTensor { data: y, cols: h }
    }
}

fn shape_error(op: &str, reason: String) -> EngineError {
    EngineError::InvalidArgument(format!("{op}: {reason}"))
}

fn linear(x: &[f32], m: usize, w: &HostLinear) -> Result<Vec<f32>> {
    match w {
        HostLinear::Dense(d) => cpu::dense_linear(x, m, d),
        HostLinear::Int4(q) => cpu::w4a16_linear(x, m, q),
    }
}

/// `silu(a) * b` over rows `[a | b]`.
fn silu_mul_halves(x: &[f32], cols: usize) -> Vec<f32> {
    let half = cols / 2;
    let (mut gate, mut up) = (Vec::with_capacity(x.len() / 2), Vec::with_capacity(x.len() / 2));
    for row in x.chunks_exact(cols) {
        gate.extend_from_slice(&row[..half]);
        up.extend_from_slice(&row[half..]);
    }
    let mut out = vec![0f32; gate.len()];
    cpu::silu_mul(&gate, &up, &mut out);
    out
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Vector = Vec<f32>;
    type Linear = HostLinear;
    type Experts = CpuExperts;
    type Batch = CpuBatch;
    type Cache = KvCache;

    fn describe(&self) -> String {
        "cpu".into()
    }

    fn vector(&self, v: &[f32]) -> Result<Vec<f32>> {
        Ok(v.to_vec())
    }

    fn linear_weight(&self, _name: &str, w: HostLinear) -> Result<HostLinear> {
        Ok(w)
    }

    fn experts(&self, _name: &str, e: HostExperts) -> Result<CpuExperts> {
        Ok(CpuExperts { routing: e.routing, router: e.router, bias: e.bias, experts: e.experts })
    }

    fn new_cache(&self, layers: usize, heads: Heads) -> KvCache {
        KvCache::new(layers, heads)
    }

    fn batch(&self, tokens: &[u32], positions: &[usize], mask: &TreeMask, _past: usize) -> Result<CpuBatch> {
        Ok(CpuBatch { tokens: tokens.to_vec(), positions: positions.to_vec(), mask: mask.clone() })
    }

    fn embedding(&self, table: &HostLinear, batch: &CpuBatch) -> Result<CpuTensor> {
        let HostLinear::Dense(t) = table else {
            return Err(shape_error("embedding", "the table is INT4; embeddings must be dense".into()));
        };
        let mut data = Vec::with_capacity(batch.tokens.len() * t.k);
        for &id in &batch.tokens {
            if id as usize >= t.n {
                return Err(EngineError::TokenOutOfRange { id, vocab: t.n });
            }
            data.extend(t.row(id as usize));
        }
        Ok(CpuTensor { data, cols: t.k })
    }

    fn rmsnorm(&self, x: &CpuTensor, weight: &Vec<f32>, eps: f32) -> Result<CpuTensor> {
        if x.cols != weight.len() {
            return Err(shape_error("rmsnorm", format!("rows of {} against a weight of {}", x.cols, weight.len())));
        }
        let mut out = vec![0f32; x.data.len()];
        cpu::rmsnorm(&x.data, weight, eps, &mut out);
        Ok(CpuTensor { data: out, cols: x.cols })
    }

    fn linear(&self, x: &CpuTensor, w: &HostLinear) -> Result<CpuTensor> {
        Ok(CpuTensor { data: linear(&x.data, x.rows(), w)?, cols: w.n() })
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        if x.data.len() != y.data.len() {
            return Err(shape_error("add", format!("{} and {} values", x.data.len(), y.data.len())));
        }
        x.data.iter_mut().zip(&y.data).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn silu_mul(&self, x: &CpuTensor) -> Result<CpuTensor> {
        if !x.cols.is_multiple_of(2) {
            return Err(shape_error("silu_mul", format!("rows of {} do not split in halves", x.cols)));
        }
        Ok(CpuTensor { data: silu_mul_halves(&x.data, x.cols), cols: x.cols / 2 })
    }

    fn columns(&self, x: &CpuTensor, start: usize, len: usize) -> Result<CpuTensor> {
        if start + len > x.cols {
            return Err(shape_error("columns", format!("{start}..{} of rows of {}", start + len, x.cols)));
        }
        let data = x.data.chunks_exact(x.cols).flat_map(|r| r[start..start + len].iter().copied()).collect();
        Ok(CpuTensor { data, cols: len })
    }

    fn rope(&self, x: &mut CpuTensor, span: RopeSpan, cos: &Vec<f32>, sin: &Vec<f32>, batch: &CpuBatch) -> Result<()> {
        let RopeSpan { stride, offset, dim, layout } = span;
        if stride == 0 || !x.cols.is_multiple_of(stride) || offset + dim > stride || x.rows() != batch.positions.len() {
            return Err(shape_error("rope", format!("{span:?} over {} rows of {}", x.rows(), x.cols)));
        }
        // The rotary part of every head, gathered, rotated and put back.
        let mut part: Vec<f32> = x.data.chunks_exact(stride).flat_map(|h| h[offset..offset + dim].to_vec()).collect();
        match layout {
            RopeLayout::Interleaved => cpu::rope_interleaved(&mut part, dim, &batch.positions, cos, sin),
            RopeLayout::HalfSplit => cpu::rope_half_split(&mut part, dim, &batch.positions, cos, sin),
        }
        for (head, r) in x.data.chunks_exact_mut(stride).zip(part.chunks_exact(dim)) {
            head[offset..offset + dim].copy_from_slice(r);
        }
        Ok(())
    }

    fn kv_append(
        &self,
        cache: &mut KvCache,
        layer: usize,
        kv: &CpuTensor,
        k_rope: &CpuTensor,
        _: &CpuBatch,
    ) -> Result<()> {
        let Heads { heads, nope, rope, v: vd, .. } = cache.heads();
        if kv.cols != heads * (nope + vd) || k_rope.cols != rope || kv.rows() != k_rope.rows() {
            return Err(shape_error("kv_append", format!("kv rows of {}, k_rope rows of {}", kv.cols, k_rope.cols)));
        }
        let n = kv.rows();
        let (mut k, mut v) = (Vec::with_capacity(n * heads * (nope + rope)), Vec::with_capacity(n * heads * vd));
        for (row, r) in kv.data.chunks_exact(kv.cols).zip(k_rope.data.chunks_exact(rope.max(1))) {
            for head in row.chunks_exact(nope + vd) {
                k.extend_from_slice(&head[..nope]);
                k.extend_from_slice(&r[..rope]);
                v.extend_from_slice(&head[nope..]);
            }
        }
        cache.append(layer, &k, &v);
        Ok(())
    }

    fn attention(&self, q: &CpuTensor, cache: &KvCache, layer: usize, batch: &CpuBatch) -> Result<CpuTensor> {
        let h = cache.heads();
        let shape = AttentionShape { heads: h.heads, qk_dim: h.qk(), v_dim: h.v, scale: h.scale };
        let kv = cache.layer(layer);
        let past = cache.len();
        let n = batch.mask.len();
        if q.data.len() != n * h.heads * h.qk() || kv.k.len() != (past + n) * h.heads * h.qk() {
            return Err(shape_error("attention", format!("q of {} values for {n} new entries", q.data.len())));
        }
        Ok(CpuTensor { data: cpu::attention(&q.data, &kv.k, &kv.v, past, &batch.mask, shape), cols: h.heads * h.v })
    }

    fn moe(&self, x: &CpuTensor, e: &CpuExperts) -> Result<CpuTensor> {
        let routes = e.routes(x)?;
        let mut outs = vec![0f32; x.rows() * e.top_k() * x.cols];
        e.expert_outputs(x, &routes, 0..e.experts.len(), &mut outs)?;
        Ok(e.combine(&routes, &outs, x.cols))
    }

    fn argmax(&self, x: &CpuTensor) -> Result<Vec<u32>> {
        Ok(cpu::argmax(&x.data, x.cols))
    }

    fn argmax_checked(&self, x: &CpuTensor) -> Result<(Vec<u32>, usize)> {
        Ok((cpu::argmax(&x.data, x.cols), cpu::count_nonfinite(&x.data)))
    }

    fn to_host(&self, x: &CpuTensor) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }
}
