//! The gated feed-forward `down(silu(gate(x)) * up(x))`: dense layers, routed and shared experts.

use super::checkpoint::Checkpoint;
use super::config::Config;
use crate::error::Result;
use crate::registry::{LinearWeight, OpRegistry};

#[derive(Clone, Debug)]
pub(crate) struct Mlp {
    gate: LinearWeight,
    up: LinearWeight,
    down: LinearWeight,
}

impl Mlp {
    /// `{prefix}.{gate,up,down}_proj` with `inter` intermediate features; INT4 where the config says.
    pub fn load(ckpt: &Checkpoint, c: &Config, prefix: &str, inter: usize) -> Result<Self> {
        let linear = |name: &str, n, k| {
            let module = format!("{prefix}.{name}");
            ckpt.linear(&module, n, k, c.quant_group(&module))
        };
        let h = c.hidden_size;
        Ok(Self {
            gate: linear("gate_proj", inter, h)?,
            up: linear("up_proj", inter, h)?,
            down: linear("down_proj", h, inter)?,
        })
    }

    pub fn linears_mut(&mut self) -> [&mut LinearWeight; 3] {
        [&mut self.gate, &mut self.up, &mut self.down]
    }

    /// `m` rows of `x` in, `m` rows out.
    pub fn forward(&self, ops: &OpRegistry, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let act = ops.silu_mul(&ops.linear(x, m, &self.gate)?, &ops.linear(x, m, &self.up)?);
        ops.linear(&act, m, &self.down)
    }
}
