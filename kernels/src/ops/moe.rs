//! DeepSeek-V3's router and the weighted sum of the routed experts' outputs.

use cudarc::driver::{CudaSlice, CudaView};
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::{launch, shape};

/// The router's settings (the engine's config gives them, and its CPU router takes the same type).
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub n_experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
}

/// The `noaux_tc` router per token, as the engine's CPU `route`: `logits` [T, n_experts], `bias`
/// `[n_experts]` -> `ids` [T, top_k] in ascending expert index and their `weights` [T, top_k]. The same
/// selection and ties (the lowest index wins, group then expert) and the same sums; the sigmoid's
/// exponential is computed in double, so the weights match the CPU's to the last bit almost always (CPU
/// and GPU exponentials may round differently by one ulp). At most [`shape::MAX_EXPERTS`] experts,
/// [`shape::MAX_GROUPS`] groups and [`shape::MAX_TOP_K`] picks.
pub fn route_noaux_tc(
    k: &Kernels,
    logits: &CudaSlice<f32>,
    bias: &CudaSlice<f32>,
    routing: &Routing,
    ids: &mut CudaSlice<u32>,
    weights: &mut CudaSlice<f32>,
) -> Result<()> {
    let r = routing;
    let groups = (r.n_group, r.topk_group);
    let a = shape::route(logits.len(), bias.len(), (ids.len(), weights.len()), r.n_experts, r.top_k, groups)?;
    if a.tokens > 0 {
        // SAFETY: logits are tokens x experts, bias experts (<= MAX_EXPERTS), ids and weights tokens x
        // top_k; n_group <= 32 divides experts, 1 <= topk_group <= n_group, 1 <= top_k <= min(experts, 32).
        unsafe {
            launch::route_noaux_tc(
                k,
                logits,
                bias,
                ids,
                weights,
                a.tokens,
                a.experts,
                a.top_k,
                a.n_group,
                a.topk_group,
                r.norm_topk_prob,
                r.routed_scaling_factor,
            )
        }?;
    }
    Ok(())
}

/// `out[t] = sum over s < top_k of weights[t, s] * slots[t * top_k + s]`, accumulated from 0 in ascending
/// s, products and sums rounded separately as the engine's CPU MoE: the same bits. `slots` is
/// [T * top_k, h], `weights` [T, top_k], `out` [T, h].
pub fn moe_combine(
    k: &Kernels,
    slots: &CudaSlice<f32>,
    weights: &CudaSlice<f32>,
    top_k: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let (tokens, top_k, h) = shape::moe_combine(slots.len(), weights.len(), top_k, out.len())?;
    if tokens > 0 && h > 0 {
        // SAFETY: slots are tokens x top_k x h, weights tokens x top_k, out tokens x h.
        unsafe { launch::moe_combine(k, slots, weights, out, tokens, top_k, h) }?;
    }
    Ok(())
}

/// [`moe_combine`] of the grouped experts' output where it lies: `rows` ([n_rows, h] bf16 bits) in
/// [`moe_align`](crate::moe_align)'s sorted order, `positions` ([T * top_k], that alignment's
/// [`positions`](crate::Alignment::positions)) the row of each (token, slot). Each value is widened to
/// f32 exactly and summed as [`moe_combine`] sums: the bits of
/// [`scatter_rows_bf16_to_f32`](crate::scatter_rows_bf16_to_f32) to the slots then [`moe_combine`], in
/// one launch. A position past the rows (no alignment writes one) makes its token's row NaN.
pub fn moe_combine_sorted_bf16(
    k: &Kernels,
    rows: &CudaSlice<u16>,
    positions: &CudaView<u32>,
    weights: &CudaSlice<f32>,
    top_k: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let a = shape::moe_combine_sorted(rows.len(), positions.len(), weights.len(), top_k, out.len())?;
    if a.tokens > 0 && a.h > 0 {
        // SAFETY: rows are n_rows x h, positions and weights tokens x top_k (top_k <= the kernel's 32), out
        // tokens x h; the kernel reads no row at or past n_rows.
        unsafe { launch::moe_combine_sorted_bf16(k, rows, positions, weights, out, a.tokens, a.top_k, a.h, a.n_rows) }?;
    }
    Ok(())
}
