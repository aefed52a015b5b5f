//! A DFlash drafter's tensors, read in their stored dtype and checked against its config.

use std::path::Path;

use super::config::DflashConfig;
use crate::error::Result;
use crate::model::{Checkpoint, Config, Layout};
use crate::registry::{DenseWeight, RopeTable};

/// One decoder layer's weights.
pub(super) struct Layer {
    pub input_norm: Vec<f32>,
    pub q_proj: DenseWeight,
    pub k_proj: DenseWeight,
    pub v_proj: DenseWeight,
    pub o_proj: DenseWeight,
    /// Per-head RMSNorm weights, `[head_dim]`.
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub gate_proj: DenseWeight,
    pub up_proj: DenseWeight,
    pub down_proj: DenseWeight,
}

/// A loaded DFlash drafter: its config and weights, and the rotary table of the target's positions.
pub struct DflashModel {
    pub config: DflashConfig,
    pub(super) fc: DenseWeight,
    pub(super) hidden_norm: Vec<f32>,
    pub(super) norm: Vec<f32>,
    pub(super) layers: Vec<Layer>,
    pub(super) rope: RopeTable,
}

impl std::fmt::Debug for DflashModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DflashModel").field("config", &self.config).finish()
    }
}

impl DflashModel {
    /// Loads the drafter folder `dir` for a target of config `target`. A config that does not fit the
    /// target, or a tensor missing or of the wrong shape, is an error naming the file and key or tensor.
    pub fn load(dir: &Path, target: &Config) -> Result<DflashModel> {
        let c = DflashConfig::load(dir, target)?;
        let ckpt = Checkpoint::open(dir, Layout::CausalLm)?;
        ckpt.check_float_dtypes(&dir.join("config.json").display().to_string(), None)?;
        let (h, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_width, kv_width) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("layers.{i}");
            layers.push(Layer {
                input_norm: ckpt.tensor(&format!("{p}.input_layernorm.weight"), &[h])?,
                q_proj: ckpt.dense(&format!("{p}.self_attn.q_proj.weight"), q_width, h)?,
                k_proj: ckpt.dense(&format!("{p}.self_attn.k_proj.weight"), kv_width, h)?,
                v_proj: ckpt.dense(&format!("{p}.self_attn.v_proj.weight"), kv_width, h)?,
                o_proj: ckpt.dense(&format!("{p}.self_attn.o_proj.weight"), h, q_width)?,
                q_norm: ckpt.tensor(&format!("{p}.self_attn.q_norm.weight"), &[hd])?,
                k_norm: ckpt.tensor(&format!("{p}.self_attn.k_norm.weight"), &[hd])?,
                post_norm: ckpt.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_proj: ckpt.dense(&format!("{p}.mlp.gate_proj.weight"), inter, h)?,
                up_proj: ckpt.dense(&format!("{p}.mlp.up_proj.weight"), inter, h)?,
                down_proj: ckpt.dense(&format!("{p}.mlp.down_proj.weight"), h, inter)?,
            });
        }
        // Qwen3's default rope: frequencies over the whole head, pairs (i, i + head_dim / 2).
        let inv_freq: Vec<f64> = (0..hd / 2).map(|i| 1.0 / c.rope_theta.powf((2 * i) as f64 / hd as f64)).collect();
        Ok(DflashModel {
            fc: ckpt.dense("fc.weight", h, c.tap_width())?,
            hidden_norm: ckpt.tensor("hidden_norm.weight", &[h])?,
            norm: ckpt.tensor("norm.weight", &[h])?,
            layers,
            rope: RopeTable::new(&inv_freq, target.context_len(), 1.0),
            config: c,
        })
    }
}
