//! DeepSeek-V3's mixture of experts (`DeepseekV3MoE` with the `noaux_tc` router) and its routing.

use super::checkpoint::Checkpoint;
use super::config::Config;
use super::mlp::Mlp;
use crate::error::Result;
use crate::registry::{LinearWeight, OpRegistry};

/// The router's settings, from the config.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub n_experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
}

impl Routing {
    pub fn from_config(c: &Config) -> Self {
        Self {
            n_experts: c.n_routed_experts,
            top_k: c.num_experts_per_tok,
            n_group: c.n_group,
            topk_group: c.topk_group,
            norm_topk_prob: c.norm_topk_prob,
            routed_scaling_factor: c.routed_scaling_factor,
        }
    }
}

/// The experts one token goes to, in ascending expert index, with their weights.
///
/// 1. `s = sigmoid(logit)`; the selection score is `s + bias` (the bias only selects).
/// 2. A group's score is the sum of its two best selection scores; the `topk_group` best groups
///    stay eligible. Experts of other groups are excluded outright (DeepSeek's reference code masks
///    them with -inf; Hugging Face fills 0, which differs only when selection scores are negative).
/// 3. The `top_k` best eligible selection scores win.
/// 4. Weights are the unbiased `s`, divided by their sum (+1e-20, summed in ascending expert
///    index) when `norm_topk_prob`, times `routed_scaling_factor`.
///
/// Every top-k breaks ties by the lowest index (group index, then expert index).
pub fn route(logits: &[f32], bias: &[f32], r: &Routing) -> Vec<(usize, f32)> {
    let scores: Vec<f32> = logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
    let choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let per_group = r.n_experts / r.n_group;
    let group_scores: Vec<f32> =
        choice.chunks_exact(per_group).map(|g| top_indices(g, 2.min(per_group)).iter().map(|&i| g[i]).sum()).collect();
    let mut eligible = vec![f32::NEG_INFINITY; r.n_experts];
    for g in top_indices(&group_scores, r.topk_group) {
        eligible[g * per_group..(g + 1) * per_group].copy_from_slice(&choice[g * per_group..(g + 1) * per_group]);
    }
    let mut chosen = top_indices(&eligible, r.top_k);
    chosen.sort_unstable();
    let mut weights: Vec<f32> = chosen.iter().map(|&e| scores[e]).collect();
    if r.norm_topk_prob {
        let sum = weights.iter().sum::<f32>() + 1e-20;
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    chosen.into_iter().zip(weights).map(|(e, w)| (e, w * r.routed_scaling_factor)).collect()
}

/// Indices of the `k` largest values, largest first, ties to the lowest index.
fn top_indices(values: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

#[derive(Clone, Debug)]
pub(crate) struct Moe {
    routing: Routing,
    /// `mlp.gate.weight`, `[n_experts, hidden]`, applied in f32 like the reference router.
    router: LinearWeight,
    bias: Vec<f32>,
    experts: Vec<Mlp>,
    shared: Option<Mlp>,
}

impl Moe {
    pub fn load(ckpt: &Checkpoint, c: &Config, prefix: &str) -> Result<Self> {
        let (e, h) = (c.n_routed_experts, c.hidden_size);
        let router = LinearWeight::Dense { n: e, k: h, w: ckpt.tensor(&format!("{prefix}.gate.weight"), &[e, h])? };
        let bias = ckpt.tensor(&format!("{prefix}.gate.e_score_correction_bias"), &[e])?;
        let experts = (0..e)
            .map(|i| Mlp::load(ckpt, c, &format!("{prefix}.experts.{i}"), c.moe_intermediate_size))
            .collect::<Result<_>>()?;
        let shared_inter = c.moe_intermediate_size * c.n_shared_experts;
        let shared = (c.n_shared_experts > 0)
            .then(|| Mlp::load(ckpt, c, &format!("{prefix}.shared_experts"), shared_inter))
            .transpose()?;
        Ok(Self { routing: Routing::from_config(c), router, bias, experts, shared })
    }

    pub fn linears_mut(&mut self) -> impl Iterator<Item = &mut LinearWeight> {
        let mlps = self.experts.iter_mut().chain(self.shared.as_mut());
        std::iter::once(&mut self.router).chain(mlps.flat_map(Mlp::linears_mut))
    }

    /// `m` rows of `x` in, `m` rows out: the weighted routed experts (added in ascending expert
    /// index) plus the shared experts. Each expert runs on the rows routed to it; every op is
    /// row-independent, so a row's result does not depend on which other rows came along.
    pub fn forward(&self, ops: &OpRegistry, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let h = x.len() / m.max(1);
        let logits = ops.linear(x, m, &self.router)?;
        let routes: Vec<Vec<(usize, f32)>> =
            logits.chunks_exact(self.routing.n_experts).map(|l| route(l, &self.bias, &self.routing)).collect();
        let k = self.routing.top_k;
        // Expert outputs by (row, slot), slot = rank of the expert among the row's choices.
        let mut outs = vec![0f32; m * k * h];
        for (e, expert) in self.experts.iter().enumerate() {
            let users: Vec<(usize, usize)> = routes
                .iter()
                .enumerate()
                .filter_map(|(row, r)| r.iter().position(|&(x, _)| x == e).map(|slot| (row, slot)))
                .collect();
            if users.is_empty() {
                continue;
            }
            let xs: Vec<f32> = users.iter().flat_map(|&(row, _)| x[row * h..(row + 1) * h].to_vec()).collect();
            let ys = expert.forward(ops, &xs, users.len())?;
            for (&(row, slot), y) in users.iter().zip(ys.chunks_exact(h)) {
                outs[(row * k + slot) * h..][..h].copy_from_slice(y);
            }
        }
        let mut y = vec![0f32; m * h];
        for (row, r) in routes.iter().enumerate() {
            let acc = &mut y[row * h..(row + 1) * h];
            for (slot, &(_, w)) in r.iter().enumerate() {
                for (a, &o) in acc.iter_mut().zip(&outs[(row * k + slot) * h..][..h]) {
                    *a += o * w;
                }
            }
        }
        if let Some(shared) = &self.shared {
            for (a, s) in y.iter_mut().zip(shared.forward(ops, x, m)?) {
                *a += s;
            }
        }
        Ok(y)
    }
}
