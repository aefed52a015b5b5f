//! The CPU backend: the deterministic, batch-invariant reference ops of [`crate::ops::cpu`] on host
//! vectors. Every reduction runs in a fixed order and work is split over rows only, so a row's result
//! is the same bits whether it is computed alone or in a batch.

mod cache;

pub use cache::KvCache;

use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use kdtree_jit::mla::reference as mla;

use crate::ops::cpu::{self, route};
use crate::registry::{
    Backend, GqaShape, Heads, HostExperts, HostLinear, KvDtype, KvStore, LogitTransform, RopeLayout, RopeSpan, Routing,
    RowStore, Shaped, check_gqa, check_norm,
};

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

impl Shaped for CpuTensor {
    fn rows(&self) -> usize {
        CpuTensor::rows(self)
    }

    fn cols(&self) -> usize {
        self.cols
    }
}

impl RowStore for CpuTensor {
    fn len(&self) -> usize {
        self.rows()
    }

    fn truncate(&mut self, len: usize) {
        self.data.truncate(len * self.cols);
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

/// A layer's `kv_b_proj` in f32 (widened exactly, INT4 dequantized), `[heads * (nope + v), latent]`.
#[derive(Clone, Debug)]
pub struct CpuAbsorb(pub(crate) Vec<f32>);

impl CpuAbsorb {
    pub(crate) fn new(name: &str, kv_b: &HostLinear, h: Heads) -> Result<CpuAbsorb> {
        if kv_b.n() != h.mla.heads * (h.mla.nope + h.mla.v) || kv_b.k() != h.mla.latent {
            return Err(EngineError::shape(
                "absorb",
                format!(
                    "{name} is [{}, {}], MLA needs [{}, {}]",
                    kv_b.n(),
                    kv_b.k(),
                    h.mla.heads * (h.mla.nope + h.mla.v),
                    h.mla.latent
                ),
            ));
        }
        Ok(CpuAbsorb(kv_b.dequantized().to_f32()))
    }
}

/// The reference's absorbed attention as a backend runs it: queries moved into latent space and
/// rounded to the cache's dtype (as the GPU's tensor cores take them), attention over the cache's
/// entries, outputs moved back. `[n, heads, v]`.
pub(crate) fn absorbed_attention(
    q: &[f32],
    entries: &[f32],
    past: usize,
    mask: &TreeMask,
    h: Heads,
    kv_b: &[f32],
) -> Vec<f32> {
    let s = h.mla;
    let mut q_lat = mla::absorb_query(q, kv_b, &s);
    q_lat.iter_mut().for_each(|x| *x = h.kv.round(*x));
    mla::unabsorb_output(&mla::attention(&q_lat, entries, past, mask.new_mask(), &s, h.kv.weights()), kv_b, &s)
}

/// How many rows of `cols` values `len` values make; an error of `op` unless whole rows of a positive
/// width.
pub(crate) fn whole_rows(op: &'static str, len: usize, cols: usize) -> Result<usize> {
    match len.checked_div(cols) {
        Some(rows) if rows * cols == len => Ok(rows),
        _ => Err(EngineError::shape(op, format!("{len} values are not whole rows of {cols}"))),
    }
}

fn linear(x: &[f32], m: usize, w: &HostLinear) -> Result<Vec<f32>> {
    match w {
        HostLinear::Dense(d) => cpu::dense_linear(x, m, d),
        HostLinear::Int4(q) => cpu::w4a16_linear(x, m, q),
    }
}

/// `silu(a) * b` over rows `[a | b]`.
/// [`Backend::silu_mul`] on the CPU (f32, whatever reads it next): also the sharded backend's.
pub(crate) fn silu_mul_rows(x: &CpuTensor) -> Result<CpuTensor> {
    if !x.cols.is_multiple_of(2) {
        return Err(EngineError::shape("silu_mul", format!("rows of {} do not split in halves", x.cols)));
    }
    Ok(CpuTensor { data: silu_mul_halves(&x.data, x.cols), cols: x.cols / 2 })
}

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
    type Rows = CpuTensor;
    type Absorb = CpuAbsorb;

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

    fn absorb(&self, name: &str, kv_b: &HostLinear, heads: Heads) -> Result<CpuAbsorb> {
        CpuAbsorb::new(name, kv_b, heads)
    }

    fn kv_dtype(&self, f32_weights: bool) -> KvDtype {
        if f32_weights { KvDtype::F32 } else { KvDtype::Bf16 }
    }

    fn new_cache(&self, layers: usize, heads: Heads, _max_tokens: usize) -> KvCache {
        KvCache::new(layers, heads)
    }

    fn batch(&self, tokens: &[u32], positions: &[usize], mask: &TreeMask, _past: usize) -> Result<CpuBatch> {
        Ok(CpuBatch { tokens: tokens.to_vec(), positions: positions.to_vec(), mask: mask.clone() })
    }

    fn embedding(&self, table: &HostLinear, batch: &CpuBatch) -> Result<CpuTensor> {
        let HostLinear::Dense(t) = table else {
            return Err(EngineError::shape("embedding", "the table is INT4; embeddings must be dense".into()));
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
        check_norm("rmsnorm", x, weight)?;
        let mut out = vec![0f32; x.data.len()];
        cpu::rmsnorm(&x.data, weight, eps, &mut out);
        Ok(CpuTensor { data: out, cols: x.cols })
    }

    fn linear(&self, x: &CpuTensor, w: &HostLinear) -> Result<CpuTensor> {
        Ok(CpuTensor { data: linear(&x.data, x.rows(), w)?, cols: w.n() })
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        if x.data.len() != y.data.len() {
            return Err(EngineError::shape("add", format!("{} and {} values", x.data.len(), y.data.len())));
        }
        x.data.iter_mut().zip(&y.data).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn silu_mul(&self, x: &CpuTensor, _down: &HostLinear) -> Result<CpuTensor> {
        silu_mul_rows(x)
    }

    fn reshape(&self, x: CpuTensor, cols: usize) -> Result<CpuTensor> {
        whole_rows("reshape", x.data.len(), cols)?;
        Ok(CpuTensor { data: x.data, cols })
    }

    fn columns(&self, x: &CpuTensor, start: usize, len: usize) -> Result<CpuTensor> {
        if start + len > x.cols {
            return Err(EngineError::shape("columns", format!("{start}..{} of rows of {}", start + len, x.cols)));
        }
        let data = x.data.chunks_exact(x.cols).flat_map(|r| r[start..start + len].iter().copied()).collect();
        Ok(CpuTensor { data, cols: len })
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CpuTensor> {
        let len =
            rows.checked_mul(cols).ok_or_else(|| EngineError::shape("zeros", format!("{rows} rows of {cols}")))?;
        Ok(CpuTensor { data: vec![0.0; len], cols })
    }

    fn place_columns(&self, dst: &mut CpuTensor, start: usize, x: &CpuTensor) -> Result<()> {
        if x.cols == 0 || start + x.cols > dst.cols || x.rows() != dst.rows() {
            return Err(EngineError::shape(
                "place_columns",
                format!("[{}, {}] at column {start} of [{}, {}]", x.rows(), x.cols, dst.rows(), dst.cols),
            ));
        }
        for (row, from) in dst.data.chunks_exact_mut(dst.cols).zip(x.data.chunks_exact(x.cols)) {
            row[start..start + x.cols].copy_from_slice(from);
        }
        Ok(())
    }

    fn select_rows(&self, x: &CpuTensor, rows: &[usize]) -> Result<CpuTensor> {
        if let Some(&row) = rows.iter().find(|&&r| r >= x.rows()) {
            return Err(EngineError::shape("select_rows", format!("row {row} of {}", x.rows())));
        }
        let data = rows.iter().flat_map(|&r| x.data[r * x.cols..][..x.cols].iter().copied()).collect();
        Ok(CpuTensor { data, cols: x.cols })
    }

    fn rope(&self, x: &mut CpuTensor, span: RopeSpan, cos: &Vec<f32>, sin: &Vec<f32>, batch: &CpuBatch) -> Result<()> {
        let RopeSpan { stride, offset, dim, layout } = span;
        if stride == 0 || !x.cols.is_multiple_of(stride) || offset + dim > stride || x.rows() != batch.positions.len() {
            return Err(EngineError::shape("rope", format!("{span:?} over {} rows of {}", x.rows(), x.cols)));
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
        latent: &CpuTensor,
        k_rope: &CpuTensor,
        _: &CpuBatch,
    ) -> Result<()> {
        let h = cache.heads();
        if latent.cols != h.mla.latent || k_rope.cols != h.mla.rope || latent.rows() != k_rope.rows() {
            return Err(EngineError::shape(
                "kv_append",
                format!(
                    "latent rows of {}, k_rope rows of {} (want {} and {})",
                    latent.cols, k_rope.cols, h.mla.latent, h.mla.rope
                ),
            ));
        }
        let entries = latent.data.chunks_exact(h.mla.latent.max(1)).zip(k_rope.data.chunks_exact(h.mla.rope.max(1)));
        cache.append(layer, entries.flat_map(|(c, r)| c.iter().chain(&r[..h.mla.rope]).copied()).collect::<Vec<_>>());
        Ok(())
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
        let (past, n) = (cache.len(), batch.mask.len());
        let entries = cache.layer(layer);
        if q.data.len() != n * h.mla.heads * h.qk() || entries.len() != (past + n) * h.width() {
            return Err(EngineError::shape(
                "attention",
                format!(
                    "q of {} values, a layer of {} values, for {n} new entries after {past}",
                    q.data.len(),
                    entries.len()
                ),
            ));
        }
        let o = absorbed_attention(&q.data, entries, past, &batch.mask, h, &kv_b.0);
        Ok(CpuTensor { data: o, cols: h.mla.heads * h.mla.v })
    }

    fn new_rows(&self, cols: usize) -> Result<CpuTensor> {
        Ok(CpuTensor { data: Vec::new(), cols })
    }

    fn append_rows(&self, rows: &mut CpuTensor, x: &CpuTensor) -> Result<()> {
        if x.cols != rows.cols {
            return Err(EngineError::shape("append_rows", format!("rows of {} onto rows of {}", x.cols, rows.cols)));
        }
        rows.data.extend_from_slice(&x.data);
        Ok(())
    }

    fn gqa_attention(
        &self,
        q: &CpuTensor,
        context: [&CpuTensor; 2],
        block: [&CpuTensor; 2],
        shape: GqaShape,
    ) -> Result<CpuTensor> {
        let dims = |t: &CpuTensor| (t.rows(), t.cols);
        check_gqa(dims(q), context.map(dims), block.map(dims), shape)?;
        let keys = [&context[0].data[..], &block[0].data[..]];
        let values = [&context[1].data[..], &block[1].data[..]];
        Ok(CpuTensor { data: cpu::gqa_attention(&q.data, keys, values, shape), cols: shape.q_width() })
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

    fn top_k_log_softmax(&self, x: &CpuTensor, k: usize, transform: LogitTransform) -> Result<Vec<Vec<(u32, f32)>>> {
        Ok(cpu::top_k_log_softmax(&x.data, x.cols, k, transform))
    }

    fn argmax_checked(&self, x: &CpuTensor) -> Result<(Vec<u32>, usize)> {
        Ok((cpu::argmax(&x.data, x.cols), cpu::count_nonfinite(&x.data)))
    }

    fn to_host(&self, x: &CpuTensor) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }

    fn upload(&self, data: &[f32], cols: usize) -> Result<CpuTensor> {
        whole_rows("upload", data.len(), cols)?;
        Ok(CpuTensor { data: data.to_vec(), cols })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_are_placed_by_column_and_selected_by_row() {
        let b = CpuBackend;
        let mut taps = b.zeros(3, 5).unwrap();
        b.place_columns(&mut taps, 1, &b.upload(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2).unwrap()).unwrap();
        b.place_columns(&mut taps, 3, &b.upload(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], 2).unwrap()).unwrap();
        let want = [0.0, 1.0, 2.0, 7.0, 8.0, 0.0, 3.0, 4.0, 9.0, 10.0, 0.0, 5.0, 6.0, 11.0, 12.0];
        assert_eq!(taps.data, want);
        assert_eq!(b.select_rows(&taps, &[2, 0]).unwrap().data, [&want[10..], &want[..5]].concat());
        // Past the row, a different row count, a row that is not there: errors, nothing written.
        for (start, x) in [(4, b.upload(&[1.0; 6], 2).unwrap()), (0, b.upload(&[1.0; 4], 2).unwrap())] {
            assert!(b.place_columns(&mut taps, start, &x).unwrap_err().to_string().contains("place_columns"));
        }
        assert!(b.place_columns(&mut taps, 0, &b.zeros(0, 0).unwrap()).is_err());
        assert_eq!(taps.data, want);
        let e = b.select_rows(&taps, &[0, 3]).unwrap_err();
        assert!(matches!(&e, EngineError::Shape { op: "select_rows", reason } if reason == "row 3 of 3"), "{e}");
        assert!(b.zeros(usize::MAX, 2).is_err());
    }

    #[test]
    fn row_stores_and_gqa_refuse_mismatched_widths_and_change_nothing() {
        let b = CpuBackend;
        let mut rows = b.new_rows(4).unwrap();
        b.append_rows(&mut rows, &b.upload(&[1.0; 8], 4).unwrap()).unwrap();
        let e = b.append_rows(&mut rows, &b.upload(&[1.0; 6], 3).unwrap()).unwrap_err();
        assert!(e.to_string().contains("append_rows: rows of 3 onto rows of 4"), "{e}");
        assert_eq!((rows.len(), rows.data.len()), (2, 8));

        // 2 query heads over 1 key/value head of 4: q rows of 8, keys and values rows of 4.
        let shape = GqaShape { heads: 2, kv_heads: 1, head_dim: 4 };
        let (q, kv) = (b.upload(&[0.5; 8], 8).unwrap(), b.upload(&[0.25; 4], 4).unwrap());
        assert_eq!(b.gqa_attention(&q, [&rows, &rows], [&kv, &kv], shape).unwrap().data.len(), 8);
        let wide = b.upload(&[0.25; 8], 8).unwrap();
        let e = b.gqa_attention(&q, [&rows, &rows], [&wide, &kv], shape).unwrap_err();
        assert!(e.to_string().contains("gqa_attention: "), "{e}");
        let uneven = GqaShape { heads: 3, kv_heads: 2, head_dim: 4 };
        assert!(b.gqa_attention(&q, [&rows, &rows], [&kv, &kv], uneven).is_err());
    }
}
