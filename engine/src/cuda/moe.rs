//! One MoE layer on the GPU: the router (an f32 GEMM and the `noaux_tc` top-k), then the routed
//! experts, then the weighted combine. Nothing crosses to the host.
//!
//! The experts run grouped (kdtree-jit's `w4a16::grouped`), four launches after the router: the
//! assignments are sorted by expert and tiled on the GPU (kdtree-kernels' `moe_align`), one launch
//! computes every assignment's gate and up projections (X rows gathered by token) and stores their
//! SiLU product (the gate-up weights are interleaved at upload so that a 64-column tile holds both
//! halves of 32 features), one every down projection (rows in sorted order), and one combines each
//! token's slots, read in sorted order through the alignment's positions. These give the bits of the
//! unfused chain (gate-up, `silu_mul_halves`, down, scatter, `moe_combine`). A row's result never
//! depends on the other rows: the grouped kernel computes each row on its own in a fixed K order, and
//! the combine adds a token's slots in ascending expert index, as the CPU does. So the outputs are
//! batch-invariant, as exact mode requires.
//!
//! Weights the grouped kernel cannot serve (dense experts, f16 activations, experts of different
//! shapes) run one launch chain per expert with the routing read back to the host, as before the
//! grouped kernel; the loader says so on stderr, and [`CudaExperts::describe`] names the path.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use kdtree_jit::cublas::Compute;
use kdtree_jit::tune::key::{MoeShape, RoutingDist, Shape, T_BUCKETS};
use kdtree_jit::tune::moe::best_grouped;
use kdtree_jit::w4a16::grouped::{
    DeviceRows, Epilogue, GroupedBuffers, GroupedKernel, GroupedShape, W4a16Grouped, interleave_gate_up,
};
use kdtree_jit::w4a16::{self, layout::lengths};
use kdtree_jit::{Target, Variant};
use kdtree_kernels::shape::{MAX_ASSIGNMENTS, MAX_EXPERTS};
use kdtree_quant::{Dtype, QuantizedWeight};

use super::CudaBackend;
use super::gemm::GemmInput;
use super::linear::{self, CudaLinear};
use super::ops;
use super::select::Mode;
use super::tensor::CudaTensor;
use crate::error::{EngineError, Result};
use crate::model::Int4Experts;
use crate::registry::Routing;
use crate::registry::{HostExperts, HostLinear};

pub struct CudaExperts {
    routing: Routing,
    /// `[n_experts, hidden]`, f32 as the reference router applies it.
    router: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    experts: Experts,
    hidden: usize,
}

enum Experts {
    Grouped(Box<Grouped>),
    /// One launch chain per expert, and why the grouped kernel could not serve these weights.
    PerExpert {
        experts: Vec<(CudaLinear, CudaLinear)>,
        why: String,
    },
}

/// Every expert's weight of one projection, stacked in the grouped kernel's layout.
struct Stacked {
    n: usize,
    k: usize,
    packed: CudaSlice<u32>,
    scales: CudaSlice<u16>,
}

struct Grouped {
    /// Gate and up stacked (`[2 * inter, hidden]` per expert, rows interleaved for the SiLU epilogue:
    /// `interleave_gate_up`), and down (`[hidden, inter]`).
    gate_up: Stacked,
    down: Stacked,
    /// Both projections run the same variant, so one alignment (tiles of its `bm`) serves both.
    kernel: GroupedKernel,
    dtype: Dtype,
}

impl CudaExperts {
    pub(super) fn upload(b: &CudaBackend, name: &str, e: HostExperts) -> Result<CudaExperts> {
        let hidden = e.router.len().checked_div(e.routing.n_experts).unwrap_or(0);
        if e.experts.len() != e.routing.n_experts || e.bias.len() != e.routing.n_experts {
            return Err(EngineError::shape(
                "experts",
                format!(
                    "{name}: {} experts and a bias of {} against a router of {}",
                    e.experts.len(),
                    e.bias.len(),
                    e.routing.n_experts
                ),
            ));
        }
        let experts = match grouped_variant(b, &e, hidden) {
            Ok(v) => Experts::Grouped(Box::new(Grouped::upload(b, v, e.experts)?)),
            Err(why) => {
                eprintln!("note: {name}: the routed experts run one launch chain per expert: {why}");
                b.monitor.host_synced.store(true, std::sync::atomic::Ordering::Relaxed);
                let experts = e
                    .experts
                    .into_iter()
                    .enumerate()
                    .map(|(i, (gate_up, down))| {
                        let prefix = format!("{name}.experts.{i}");
                        Ok((
                            b.upload_linear(&format!("{prefix}.gate_up_proj"), gate_up)?,
                            b.upload_linear(&format!("{prefix}.down_proj"), down)?,
                        ))
                    })
                    .collect::<Result<_>>()?;
                Experts::PerExpert { experts, why }
            }
        };
        let s = b.stream();
        Ok(CudaExperts {
            routing: e.routing,
            router: s.clone_htod(&e.router)?,
            bias: s.clone_htod(&e.bias)?,
            experts,
            hidden,
        })
    }

    /// How the routed experts run: the grouped variant, or why they run one chain per expert.
    pub fn describe(&self) -> String {
        match &self.experts {
            Experts::Grouped(g) => format!("grouped, {}", g.kernel.variant().name()),
            Experts::PerExpert { why, .. } => format!("one launch chain per expert ({why})"),
        }
    }
}

/// The tuning DB's problem for MoE layers of `experts` as the grouped variant is looked up: uniform
/// routing, at exact mode's tokens (fast mode: the largest bucket, as for the GEMMs' variant of
/// every M); `None` when a size does not fit a key (no entry then).
pub(super) fn moe_problem(experts: &Int4Experts, mode: Mode) -> Option<(MoeShape, (u32, Dtype), u32)> {
    let dim = |v: usize| u32::try_from(v).ok();
    let Int4Experts { gate_up, down, group_size, dtype, experts, top_k } = *experts;
    let layer = MoeShape {
        gate_up: Shape { n: dim(gate_up.0)?, k: dim(gate_up.1)? },
        down: Shape { n: dim(down.0)?, k: dim(down.1)? },
        experts: dim(experts)?,
        top_k: dim(top_k)?,
        routing: RoutingDist::Uniform,
    };
    let tokens = match mode {
        Mode::Exact { m } => dim(m).unwrap_or(u32::MAX),
        Mode::Fast => *T_BUCKETS.last().expect("buckets"),
    };
    Some((layer, (dim(group_size)?, dtype), tokens))
}

/// Why the grouped kernels cannot run `experts` experts a layer with `dtype` scales, if they cannot.
pub(super) fn grouped_limits(experts: usize, dtype: Dtype) -> std::result::Result<(), String> {
    if experts > MAX_EXPERTS {
        return Err(format!("{experts} experts, the alignment takes at most {MAX_EXPERTS}"));
    }
    if dtype != Dtype::Bf16 {
        return Err("f16 scales: the CUDA SiLU and scatter kernels take bf16".into());
    }
    Ok(())
}

/// The grouped variant for these experts, or why there is none: every expert INT4, gate-up and down
/// each of one shape, group size and scale dtype, bf16 activations (the SiLU and scatter kernels'),
/// gate-up `[2 * inter, hidden]` and down `[hidden, inter]`.
///
/// The variant is `--grouped-variant`'s if given, else the tuning DB's for this layer
/// (`kdtree-jit tune --preset kimi-k2-moe`, or tuning at startup; uniform routing) at the T bucket
/// of exact mode's tokens
/// (fast mode: the largest bucket, as for the GEMMs' variant of every M), else
/// [`W4a16Grouped::default_for`] the weights' dtype and group on this GPU. One variant serves every
/// T, so the outputs stay batch-invariant.
fn grouped_variant(b: &CudaBackend, e: &HostExperts, hidden: usize) -> std::result::Result<W4a16Grouped, String> {
    let quantized = |w: &HostLinear| match w {
        HostLinear::Int4(q) => Some((q.n, q.k, q.group_size, q.scales.dtype)),
        HostLinear::Dense(_) => None,
    };
    let chosen = match b.weights.moe {
        super::MoeKernels::PerExpert => return Err("asked for by the options (MoeKernels::PerExpert)".into()),
        super::MoeKernels::Grouped(v) => v,
    };
    let (Some(first_gu), Some(first_down)) =
        (e.experts.first().and_then(|(gu, _)| quantized(gu)), e.experts.first().and_then(|(_, d)| quantized(d)))
    else {
        return Err("the experts are dense (the grouped kernel is W4A16 only)".into());
    };
    for (i, (gu, d)) in e.experts.iter().enumerate() {
        if quantized(gu) != Some(first_gu) || quantized(d) != Some(first_down) {
            return Err(format!("expert {i}'s weights differ in kind, shape, group or dtype from expert 0's"));
        }
    }
    let ((n_gu, k_gu, g, dtype), (n_d, k_d, g_d, dtype_d)) = (first_gu, first_down);
    grouped_limits(e.experts.len(), dtype)?;
    grouped_limits(e.experts.len(), dtype_d)?;
    if g != g_d {
        return Err(format!("gate-up has group size {g}, down {g_d}"));
    }
    if k_gu != hidden || n_d != hidden || n_gu != 2 * k_d {
        return Err(format!("gate-up [{n_gu}, {k_gu}] and down [{n_d}, {k_d}] against a hidden size of {hidden}"));
    }
    let group = u32::try_from(g).map_err(|_| format!("group size {g}"))?;
    let target = Target { arch: b.gpu().arch };
    let planned = Int4Experts {
        gate_up: (n_gu, k_gu),
        down: (n_d, k_d),
        group_size: g,
        dtype,
        experts: e.experts.len(),
        top_k: e.routing.top_k,
    };
    let tuned = || {
        let (layer, group_dtype, tokens) = moe_problem(&planned, b.tuning.mode)?;
        let found = best_grouped(&b.tuning.db, &b.tuning.env, &target, &layer, group_dtype, tokens);
        found.map(|(v, _)| v)
    };
    let v = chosen.or_else(tuned).unwrap_or_else(|| W4a16Grouped::default_for(dtype, group, &target));
    if (v.dtype, v.group_size) != (dtype, group) {
        return Err(format!("{} is for {} g{}, the experts are {dtype} g{group}", v.name(), v.dtype, v.group_size));
    }
    v.check(&target).map_err(|why| format!("{}: {why}", v.name()))?;
    Ok(v)
}

impl Stacked {
    /// Repacks each expert's weight into the variant's layout and copies it to its place in one buffer.
    fn upload(b: &CudaBackend, v: &W4a16Grouped, weights: Vec<QuantizedWeight>) -> Result<Stacked> {
        let (n, k) = weights.first().map_or((0, 0), |w| (w.n, w.k));
        let (packed_len, scales_len) = lengths(n, k, v.group_size as usize);
        let s = b.stream();
        // Written in full below, one expert after the other.
        let mut packed = b.output::<u32>(weights.len() * packed_len)?;
        let mut scales = b.output::<u16>(weights.len() * scales_len)?;
        for (e, w) in weights.into_iter().enumerate() {
            let d = w4a16::repack(&v.stream(), &w)?;
            s.memcpy_htod(&d.packed, &mut packed.slice_mut(e * packed_len..(e + 1) * packed_len))?;
            s.memcpy_htod(&d.scales, &mut scales.slice_mut(e * scales_len..(e + 1) * scales_len))?;
        }
        Ok(Stacked { n, k, packed, scales })
    }
}

impl Grouped {
    fn upload(b: &CudaBackend, v: W4a16Grouped, experts: Vec<(HostLinear, HostLinear)>) -> Result<Grouped> {
        let (mut gate_up, mut down) = (Vec::with_capacity(experts.len()), Vec::with_capacity(experts.len()));
        for (gu, d) in experts {
            match (gu, d) {
                (HostLinear::Int4(gu), HostLinear::Int4(d)) => {
                    gate_up.push(interleave_gate_up(&gu)?);
                    down.push(d);
                }
                _ => {
                    return Err(EngineError::UnsupportedInput {
                        op: "grouped experts",
                        input: "a dense expert".into(),
                        accepted: "INT4 experts".into(),
                    });
                }
            }
        }
        // Each layer loads its own module of the variant (the cubin comes from the disk cache after
        // the first layer).
        let kernel = GroupedKernel::compile(b.gpu(), v, b.tuning.cubins.as_ref())?;
        Ok(Grouped {
            gate_up: Stacked::upload(b, &v, gate_up)?,
            down: Stacked::upload(b, &v, down)?,
            kernel,
            dtype: v.dtype,
        })
    }
}

pub(super) fn forward(b: &CudaBackend, x: &CudaTensor, e: &CudaExperts) -> Result<CudaTensor> {
    let (m, h, r) = (x.rows, x.cols, &e.routing);
    if h != e.hidden {
        return Err(EngineError::shape("moe", format!("rows of {h}, experts of {}", e.hidden)));
    }
    let logits = linear::dense(b, (GemmInput::F32, Compute::F32), &x.data, &e.router, (m, r.n_experts, h))?;
    let mut ids = b.output::<u32>(m * r.top_k)?;
    let mut weights = b.output::<f32>(m * r.top_k)?;
    ops::route(b.kernels(), &logits, &e.bias, r, &mut ids, &mut weights)?;
    let out = match &e.experts {
        Experts::Grouped(g) => grouped_forward(b, x, g, r, &ids, &weights)?,
        Experts::PerExpert { experts, .. } => per_expert_forward(b, x, experts, r, &ids, &weights)?,
    };
    Ok(CudaTensor::new(out, m, h))
}

/// The grouped experts of `x`'s tokens, in chunks of at most [`MAX_ASSIGNMENTS`] assignments (one
/// alignment each; a forward of K2's top-8 has one chunk up to 1024 tokens).
fn grouped_forward(
    b: &CudaBackend,
    x: &CudaTensor,
    g: &Grouped,
    r: &Routing,
    ids: &CudaSlice<u32>,
    weights: &CudaSlice<f32>,
) -> Result<CudaSlice<f32>> {
    let (m, h, top_k) = (x.rows, x.cols, r.top_k);
    let xh = linear::to_half(b, x, g.dtype, m)?;
    let chunk = (MAX_ASSIGNMENTS / top_k).max(1);
    if m <= chunk {
        return grouped_tokens(b, g, r, xh.slice(0..m * h), m, ids.slice(..), weights);
    }
    let s = b.stream();
    let mut out = b.output::<f32>(m * h)?;
    for t0 in (0..m).step_by(chunk) {
        let t1 = (t0 + chunk).min(m);
        let mut w = b.output::<f32>((t1 - t0) * top_k)?;
        s.memcpy_dtod(&weights.slice(t0 * top_k..t1 * top_k), &mut w)?;
        let ids = ids.slice(t0 * top_k..t1 * top_k);
        let part = grouped_tokens(b, g, r, xh.slice(t0 * h..t1 * h), t1 - t0, ids, &w)?;
        s.memcpy_dtod(&part, &mut out.slice_mut(t0 * h..t1 * h))?;
    }
    Ok(out)
}

/// `tokens` tokens' routed experts: align, gate-up with its SiLU product, down, combine.
fn grouped_tokens(
    b: &CudaBackend,
    g: &Grouped,
    r: &Routing,
    xh: CudaView<u16>,
    tokens: usize,
    ids: CudaView<u32>,
    weights: &CudaSlice<f32>,
) -> Result<CudaSlice<f32>> {
    let (k, gpu) = (b.kernels(), b.gpu());
    let (top_k, experts, h) = (r.top_k, r.n_experts, g.down.n);
    let assignments = tokens * top_k;
    let bm = g.kernel.variant().bm as usize;
    let mut a = kdtree_kernels::Alignment::new(k, assignments, experts, bm)?;
    kdtree_kernels::moe_align(k, &ids, &mut a)?;
    if b.monitor.profile.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
        // Profiling only: the one read-back of the routing, for the experts-touched count.
        let meta = b.stream().clone_dtoh(&a.meta)?;
        if meta[2] > 0 {
            return Err(EngineError::RoutedPastExperts { count: meta[2] as usize, experts });
        }
        b.count_experts(meta[1] as usize);
    }

    // One projection of every assignment over the alignment's tiles: X of `x_rows` rows read as `rows`
    // says, Y in sorted order.
    let project = |w: &Stacked, epilogue, x: CudaView<u16>, x_rows, rows, y: CudaViewMut<u16>| {
        let shape = GroupedShape { experts, n: w.n, k: w.k, x_rows, y_rows: assignments };
        let (packed, scales) = (&w.packed, &w.scales);
        let (tiles, tile_count) = (a.tiles.slice(..), a.meta.slice(0..1));
        let buffers = GroupedBuffers { x, rows, packed, scales, tiles, tile_count, y };
        g.kernel.launch(gpu, epilogue, shape, buffers)
    };
    let inter = g.down.k;
    let mut act = b.output::<u16>(assignments * inter)?;
    let gather = DeviceRows::Gather { index: a.sorted.slice(0..assignments), div: top_k };
    project(&g.gate_up, Epilogue::Silu, xh, tokens, gather, act.slice_mut(..))?;
    let mut y = b.output::<u16>(assignments * h)?;
    project(&g.down, Epilogue::Store, act.slice(..), assignments, DeviceRows::Identity, y.slice_mut(..))?;
    // Slot s of token t is sorted row positions[t * top_k + s].
    let mut out = b.output::<f32>(tokens * h)?;
    kdtree_kernels::moe_combine_sorted_bf16(k, &y, &a.positions.slice(0..assignments), weights, top_k, &mut out)?;
    Ok(out)
}

/// The rows of each expert, experts ascending: `order` lists the rows to gather, `dest` the
/// (row, slot) each result goes to (`row * top_k + slot`), `spans` each expert's (expert, start, count).
struct Assignment {
    order: Vec<u32>,
    dest: Vec<u32>,
    spans: Vec<(usize, usize, usize)>,
}

fn assign(ids: &[u32], top_k: usize, n_experts: usize) -> Result<Assignment> {
    let mut by_expert: Vec<Vec<(u32, u32)>> = vec![Vec::new(); n_experts];
    for (i, &e) in ids.iter().enumerate() {
        let list = by_expert.get_mut(e as usize).ok_or_else(|| EngineError::RoutedPastExperts {
            count: ids.iter().filter(|&&id| id as usize >= n_experts).count(),
            experts: n_experts,
        })?;
        list.push(((i / top_k) as u32, i as u32));
    }
    let (mut order, mut dest, mut spans) = (Vec::new(), Vec::new(), Vec::new());
    for (e, list) in by_expert.into_iter().enumerate().filter(|(_, l)| !l.is_empty()) {
        spans.push((e, order.len(), list.len()));
        for (row, slot) in list {
            order.push(row);
            dest.push(slot);
        }
    }
    Ok(Assignment { order, dest, spans })
}

/// `x · Wᵀ` of half rows into half rows, for the per-expert chain of GEMMs.
fn half_linear(b: &CudaBackend, x: &CudaSlice<u16>, m: usize, w: &CudaLinear) -> Result<CudaSlice<u16>> {
    let (n, k) = (w.n(), w.k());
    match w {
        CudaLinear::Int4 { .. } => linear::int4_half(b, x, m, w),
        CudaLinear::Dense32 { .. } => Err(EngineError::UnsupportedInput {
            op: "half_linear",
            input: "an f32 weight".into(),
            accepted: "INT4 and 16-bit weights (per_expert_forward_f32 runs f32 ones)".into(),
        }),
        CudaLinear::Dense { w: wd, dtype, .. } => {
            let input = if *dtype == Dtype::F16 { GemmInput::F16 } else { GemmInput::Bf16 };
            let y = linear::dense(b, (input, Compute::F32), x, wd, (m, n, k))?;
            let mut out = b.output::<u16>(m * n)?;
            ops::to_half(b.kernels(), &y, *dtype, &mut out)?;
            Ok(out)
        }
    }
}

/// The per-expert path: the routing read back to the host, then per expert that has tokens a gather,
/// the two GEMMs and the SiLU product, and a scatter to the slots; then the combine.
fn per_expert_forward(
    b: &CudaBackend,
    x: &CudaTensor,
    experts: &[(CudaLinear, CudaLinear)],
    r: &Routing,
    ids: &CudaSlice<u32>,
    weights: &CudaSlice<f32>,
) -> Result<CudaSlice<f32>> {
    if experts.first().is_some_and(|(w, _)| w.half_dtype().is_none()) {
        return per_expert_forward_f32(b, x, experts, r, ids, weights);
    }
    let (m, h) = (x.rows, x.cols);
    let s = b.stream();
    let plan = assign(&s.clone_dtoh(ids)?, r.top_k, r.n_experts)?;
    b.count_experts(plan.spans.len());
    let (order, dest) = (s.clone_htod(&plan.order)?, s.clone_htod(&plan.dest)?);
    let dtype = experts.first().map_or(Dtype::Bf16, |(w, _)| w.dtype());
    let xh = linear::to_half(b, x, dtype, m)?;
    // Every (row, slot) is one expert's output: the scatters below write all of it.
    let mut slots = b.output::<f32>(m * r.top_k * h)?;
    for &(expert, start, count) in &plan.spans {
        let (gate_up, down) = &experts[expert];
        let mut xg = b.output::<u16>(count * h)?;
        kdtree_kernels::gather_rows_u16(b.kernels(), &xh, h, &order, start, count, &mut xg)?;
        let gu = half_linear(b, &xg, count, gate_up)?;
        let mut act = b.output::<u16>(count * gate_up.n() / 2)?;
        ops::silu_mul_halves_u16(b.kernels(), &gu, count, gate_up.n(), dtype, &mut act)?;
        let y = half_linear(b, &act, count, down)?;
        ops::scatter_rows_to_f32(b.kernels(), &y, dtype, &dest, start, count, h, &mut slots)?;
    }
    let mut out = b.output::<f32>(m * h)?;
    kdtree_kernels::moe_combine(b.kernels(), &slots, weights, r.top_k, &mut out)?;
    Ok(out)
}

/// The per-expert path of f32 experts (an f32 model's), every value f32: the rows gathered in expert
/// order, each expert's gate-up, SiLU product and down as the dense MLP runs them, then the results
/// gathered back into (row, slot) order for the combine.
fn per_expert_forward_f32(
    b: &CudaBackend,
    x: &CudaTensor,
    experts: &[(CudaLinear, CudaLinear)],
    r: &Routing,
    ids: &CudaSlice<u32>,
    weights: &CudaSlice<f32>,
) -> Result<CudaSlice<f32>> {
    let (m, h) = (x.rows, x.cols);
    let (s, k) = (b.stream(), b.kernels());
    let plan = assign(&s.clone_dtoh(ids)?, r.top_k, r.n_experts)?;
    b.count_experts(plan.spans.len());
    let assignments = plan.order.len();
    // Slot `dest[i]` is sorted row `i`: the inverse permutation reads the slots back in order.
    let mut inverse = vec![0u32; assignments];
    for (i, &d) in plan.dest.iter().enumerate() {
        inverse[d as usize] = i as u32;
    }
    let (order, inverse) = (s.clone_htod(&plan.order)?, s.clone_htod(&inverse)?);
    let mut xs = b.output::<f32>(assignments * h)?;
    kdtree_kernels::gather_rows_f32(k, &x.data, h, &order, 0, assignments, &mut xs)?;
    let mut ys = b.output::<f32>(assignments * h)?;
    for &(expert, start, count) in &plan.spans {
        let (gate_up, down) = &experts[expert];
        let rows = start * h..(start + count) * h;
        let mut xe = b.tensor(count, h)?;
        s.memcpy_dtod(&xs.slice(rows.clone()), &mut xe.data.slice_mut(0..count * h))?;
        let act = super::silu_mul_f32(b, &linear::forward(b, &xe, gate_up)?)?;
        let y = linear::forward(b, &act, down)?;
        s.memcpy_dtod(&y.data.slice(0..count * h), &mut ys.slice_mut(rows))?;
    }
    let mut slots = b.output::<f32>(m * r.top_k * h)?;
    kdtree_kernels::gather_rows_f32(k, &ys, h, &inverse, 0, assignments, &mut slots)?;
    let mut out = b.output::<f32>(m * h)?;
    kdtree_kernels::moe_combine(k, &slots, weights, r.top_k, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_grouped_by_expert_ascending_with_their_slots() {
        // Two rows, top-2: row 0 -> experts 3, 1; row 1 -> experts 1, 0.
        let a = assign(&[3, 1, 1, 0], 2, 4).unwrap();
        assert_eq!(a.spans, [(0, 0, 1), (1, 1, 2), (3, 3, 1)]);
        assert_eq!(a.order, [1, 0, 1, 0]);
        assert_eq!(a.dest, [3, 1, 2, 0]);
        assert!(assign(&[7, 0], 2, 4).is_err());
    }

    #[test]
    fn the_per_expert_path_agrees_with_the_grouped_alignment() {
        // The grouped path's sorted list is the per-expert path's `dest` (slot order by expert).
        let ids = [3, 1, 1, 0, 2, 3];
        let a = w4a16::grouped::align(&ids, 4, 8);
        assert_eq!(a.sorted, assign(&ids, 2, 4).unwrap().dest);
    }
}
