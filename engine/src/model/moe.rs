//! DeepSeek-V3's mixture of experts (`DeepseekV3MoE` with the `noaux_tc` router; the routing itself is
//! [`crate::ops::cpu::route`]).

use super::WeightBytes;
use super::checkpoint::Checkpoint;
use super::config::Config;
use super::mlp::{Mlp, load_host};
use super::probe::Probe;
use crate::error::Result;
use crate::registry::{Backend, HostExperts, Routing};

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
