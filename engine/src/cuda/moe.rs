//! One MoE layer on the GPU: the router (an f32 GEMM and the `noaux_tc` top-k, both on the GPU),
//! then one launch per expert that has tokens, over the rows routed to it, and the weighted combine.
//!
//! The routing crosses to the host once per layer (each expert's row count sizes its launch) until
//! the grouped MoE kernel takes all experts in one launch. A row's result never depends on the other
//! rows: each expert computes its rows independently (batch-invariant kernels) and the combine adds
//! a row's experts in ascending expert index, as the CPU does.

use cudarc::driver::CudaSlice;
use kdtree_quant::Dtype;

use super::CudaBackend;
use super::gemm::GemmInput;
use super::linear::{self, CudaLinear};
use super::ops;
use super::tensor::CudaTensor;
use crate::error::{EngineError, Result};
use crate::model::Routing;
use crate::registry::HostExperts;

pub struct CudaExperts {
    routing: Routing,
    /// `[n_experts, hidden]`, f32 as the reference router applies it.
    router: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    /// Per expert: gate and up stacked, and down.
    experts: Vec<(CudaLinear, CudaLinear)>,
    hidden: usize,
}

impl CudaExperts {
    pub(super) fn upload(b: &CudaBackend, name: &str, e: HostExperts) -> Result<CudaExperts> {
        let hidden = e.router.len().checked_div(e.routing.n_experts).unwrap_or(0);
        if e.experts.len() != e.routing.n_experts || e.bias.len() != e.routing.n_experts {
            return Err(EngineError::InvalidArgument(format!("{name}: experts, bias and router disagree")));
        }
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
        let s = b.stream();
        Ok(CudaExperts {
            routing: e.routing,
            router: s.clone_htod(&e.router)?,
            bias: s.clone_htod(&e.bias)?,
            experts,
            hidden,
        })
    }
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
        let list = by_expert.get_mut(e as usize).ok_or_else(|| {
            EngineError::InvalidArgument(format!(
                "the router chose expert {e} of {n_experts}: its logits are not finite"
            ))
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

/// `x · Wᵀ` of half rows into half rows, for the experts' chain of GEMMs.
fn half_linear(b: &CudaBackend, x: &CudaSlice<u16>, m: usize, w: &CudaLinear) -> Result<CudaSlice<u16>> {
    let (n, k) = (w.n(), w.k());
    match w {
        CudaLinear::Int4 { .. } => linear::int4_half(b, x, m, w),
        CudaLinear::Dense { w: wd, dtype, .. } => {
            let input = if *dtype == Dtype::F16 { GemmInput::F16 } else { GemmInput::Bf16 };
            let y = linear::dense(b, input, x, wd, (m, n, k))?;
            let mut out = b.output::<u16>(m * n)?;
            ops::to_half(b.kernels(), &y, *dtype, &mut out)?;
            Ok(out)
        }
    }
}

pub(super) fn forward(b: &CudaBackend, x: &CudaTensor, e: &CudaExperts) -> Result<CudaTensor> {
    let (m, h, r) = (x.rows, x.cols, &e.routing);
    if h != e.hidden {
        return Err(EngineError::InvalidArgument(format!("moe: rows of {h}, experts of {}", e.hidden)));
    }
    let s = b.stream();
    let logits = linear::dense(b, GemmInput::F32, &x.data, &e.router, (m, r.n_experts, h))?;
    let mut ids = b.output::<u32>(m * r.top_k)?;
    let mut weights = b.output::<f32>(m * r.top_k)?;
    ops::route(b.kernels(), &logits, &e.bias, r, &mut ids, &mut weights)?;
    let plan = assign(&s.clone_dtoh(&ids)?, r.top_k, r.n_experts)?;
    b.count_experts(plan.spans.len());
    let (order, dest) = (s.clone_htod(&plan.order)?, s.clone_htod(&plan.dest)?);
    let dtype = e.experts.first().map_or(Dtype::Bf16, |(w, _)| w.dtype());
    let xh = linear::to_half(b, x, dtype, m)?;
    // Every (row, slot) is one expert's output: the scatters below write all of it.
    let mut slots = b.output::<f32>(m * r.top_k * h)?;
    for &(expert, start, count) in &plan.spans {
        let (gate_up, down) = &e.experts[expert];
        let mut xg = b.output::<u16>(count * h)?;
        kdtree_kernels::gather_rows_u16(b.kernels(), &xh, h, &order, start, count, &mut xg)?;
        let gu = half_linear(b, &xg, count, gate_up)?;
        let mut act = b.output::<u16>(count * gate_up.n() / 2)?;
        ops::silu_mul_halves_u16(b.kernels(), &gu, count, gate_up.n(), dtype, &mut act)?;
        let y = half_linear(b, &act, count, down)?;
        ops::scatter_rows_to_f32(b.kernels(), &y, dtype, &dest, start, count, h, &mut slots)?;
    }
    let mut out = b.output::<f32>(m * h)?;
    kdtree_kernels::moe_combine(b.kernels(), &slots, &weights, r.top_k, &mut out)?;
    Ok(CudaTensor { data: out, rows: m, cols: h })
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
}
