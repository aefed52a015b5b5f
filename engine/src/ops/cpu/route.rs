//! DeepSeek-V3's `noaux_tc` router: the reference the GPU router kernel (kdtree-kernels'
//! `route_noaux_tc`) is checked against.

use crate::registry::Routing;

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
