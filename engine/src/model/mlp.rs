//! The gated feed-forward `down(silu(gate(x)) * up(x))`: dense layers, routed and shared experts.
//! Gate and up are one weight (`[gate; up]`), so both come out of one GEMM.

use super::WeightBytes;
use super::checkpoint::Checkpoint;
use super::config::Config;
use super::probe::Probe;
use crate::error::Result;
use crate::registry::{Backend, HostLinear};

pub(crate) struct Mlp<B: Backend> {
    gate_up: B::Linear,
    down: B::Linear,
}

/// `{prefix}.{gate,up,down}_proj` with `inter` intermediate features, INT4 where the config says:
/// gate and up stacked, and down.
pub(crate) fn load_host(ckpt: &Checkpoint, c: &Config, prefix: &str, inter: usize) -> Result<(HostLinear, HostLinear)> {
    let linear = |name: &str, n, k| {
        let module = format!("{prefix}.{name}");
        ckpt.linear(&module, n, k, c.quant_group(&module))
    };
    let h = c.hidden_size;
    let gate_up = HostLinear::stack(linear("gate_proj", inter, h)?, linear("up_proj", inter, h)?)?;
    Ok((gate_up, linear("down_proj", h, inter)?))
}

impl<B: Backend> Mlp<B> {
    pub fn load(
        ckpt: &Checkpoint,
        c: &Config,
        b: &B,
        prefix: &str,
        inter: usize,
        bytes: &mut WeightBytes,
    ) -> Result<Self> {
        let (gate_up, down) = load_host(ckpt, c, prefix, inter)?;
        bytes.dense(&gate_up);
        bytes.dense(&down);
        Ok(Self {
            gate_up: b.linear_weight(&format!("{prefix}.gate_up_proj"), gate_up)?,
            down: b.linear_weight(&format!("{prefix}.down_proj"), down)?,
        })
    }

    /// `m` rows in, `m` rows out; `probe` checks each op's output, naming it under `module`
    /// (`mlp`, `shared_experts`).
    pub fn forward(&self, b: &B, x: &B::Tensor, probe: &Probe<'_, B>, module: &str) -> Result<B::Tensor> {
        let checked = |op: &str, x: B::Tensor| probe.check(&x, format_args!("{module}.{op}")).map(|()| x);
        let gate_up = checked("gate_up_proj", b.linear(x, &self.gate_up)?)?;
        let act = checked("silu_mul", b.silu_mul(&gate_up, &self.down)?)?;
        checked("down_proj", b.linear(&act, &self.down)?)
    }
}
