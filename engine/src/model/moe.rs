//! DeepSeek-V3's mixture of experts (`DeepseekV3MoE` with the `noaux_tc` router) and its routing.

use super::WeightBytes;
use super::checkpoint::Checkpoint;
use super::config::Config;
use super::mlp::{Mlp, load_host};
use super::probe::Probe;
use crate::error::Result;
use crate::registry::{Backend, HostExperts};

/// The router's settings: one type for the CPU reference and the GPU router kernel.
pub use kdtree_kernels::Routing;

impl Config {
    /// The router's settings.
    pub fn routing(&self) -> Routing {
        Routing {
            n_experts: self.n_routed_experts,
            top_k: self.num_experts_per_tok,
            n_group: self.n_group,
            topk_group: self.topk_group,
            norm_topk_prob: self.norm_topk_prob,
            routed_scaling_factor: self.routed_scaling_factor,
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

pub(crate) struct Moe<B: Backend> {
    experts: B::Experts,
    shared: Option<Mlp<B>>,
}

impl<B: Backend> Moe<B> {
    pub fn load(ckpt: &Checkpoint, c: &Config, b: &B, prefix: &str, bytes: &mut WeightBytes) -> Result<Self> {
        let (e, h) = (c.n_routed_experts, c.hidden_size);
        let router = ckpt.tensor(&format!("{prefix}.gate.weight"), &[e, h])?;
        bytes.dense += 4 * router.len();
        let bias = ckpt.tensor(&format!("{prefix}.gate.e_score_correction_bias"), &[e])?;
        let experts = (0..e)
            .map(|i| {
                let (gate_up, down) = load_host(ckpt, c, &format!("{prefix}.experts.{i}"), c.moe_intermediate_size)?;
                bytes.expert(&gate_up);
                bytes.expert(&down);
                Ok((gate_up, down))
            })
            .collect::<Result<_>>()?;
        let host = HostExperts { routing: c.routing(), router, bias, experts };
        let shared_inter = c.moe_intermediate_size * c.n_shared_experts;
        let shared = (c.n_shared_experts > 0)
            .then(|| Mlp::load(ckpt, c, b, &format!("{prefix}.shared_experts"), shared_inter, bytes))
            .transpose()?;
        Ok(Self { experts: b.experts(prefix, host)?, shared })
    }

    /// `m` rows in, `m` rows out: the weighted routed experts (added in ascending expert index) plus
    /// the shared experts. Every op is row-independent, so a row's result does not depend on which
    /// other rows came along. `probe` checks the routed experts' sum (`moe`), then the shared experts.
    pub fn forward(&self, b: &B, x: &B::Tensor, probe: &Probe<'_, B>) -> Result<B::Tensor> {
        let mut y = b.moe(x, &self.experts)?;
        probe.check(&y, "moe")?;
        if let Some(shared) = &self.shared {
            b.add_assign(&mut y, &shared.forward(b, x, probe, "shared_experts")?)?;
            probe.check(&y, "moe + shared_experts")?;
        }
        Ok(y)
    }
}
