//! A DFlash drafter's tensors, read in their stored dtype, checked against its config and placed on
//! the target's backend.

use std::path::Path;
use std::sync::Arc;

use super::config::DflashConfig;
use crate::error::Result;
use crate::model::{Checkpoint, Layout, Model, inv_freq, yarn_inv_freq};
use crate::registry::{Backend, HostLinear, Rope, RopeTable};

/// One decoder layer's weights on the backend.
pub(super) struct Layer<B: Backend> {
    pub input_norm: B::Vector,
    pub q_proj: B::Linear,
    /// `k_proj` and `v_proj` stacked, `[2 * kv_heads * head_dim, hidden]`: one GEMM gives a row's key
    /// and value, for the block and for the context alike.
    pub kv_proj: B::Linear,
    pub o_proj: B::Linear,
    /// Per-head RMSNorm weights, `[head_dim]`.
    pub q_norm: B::Vector,
    pub k_norm: B::Vector,
    pub post_norm: B::Vector,
    /// `gate_proj` and `up_proj` stacked, `[2 * intermediate, hidden]`, for [`Backend::silu_mul`].
    pub gate_up: B::Linear,
    pub down_proj: B::Linear,
}

/// A loaded DFlash drafter on its target's backend: its config, weights, and the rotary table of the
/// target's positions.
pub struct DflashModel<B: Backend> {
    pub config: DflashConfig,
    pub(super) backend: Arc<B>,
    pub(super) fc: B::Linear,
    pub(super) hidden_norm: B::Vector,
    pub(super) norm: B::Vector,
    pub(super) layers: Vec<Layer<B>>,
    pub(super) rope: Rope<B>,
}

impl<B: Backend> std::fmt::Debug for DflashModel<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DflashModel").field("config", &self.config).finish()
    }
}

impl<B: Backend> DflashModel<B> {
    /// Loads the drafter folder `dir` for `target`, onto the target's backend. A config that does not
    /// fit the target, or a tensor missing or of the wrong shape, is an error naming the file and key
    /// or tensor. Its dense weights keep their stored dtype unless the target's compute dtype was asked
    /// for ([`crate::registry::Dtypes::chosen`]); then they follow it.
    pub fn load(dir: &Path, target: &Model<B>) -> Result<DflashModel<B>> {
        let c = DflashConfig::load(dir, &target.config)?;
        let mut ckpt = Checkpoint::open(dir, Layout::CausalLm)?;
        ckpt.check_float_dtypes(&dir.join("config.json").display().to_string(), None)?;
        // A compute dtype asked of the target (`--dtype`) is the drafter's too: one arithmetic a run.
        let dtypes = target.dtypes();
        if dtypes.chosen {
            ckpt.set_compute(dtypes.compute);
        }
        let b = target.backend();
        let (h, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_width, kv_width) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let dense = |name: &str, n, k| -> Result<HostLinear> { Ok(HostLinear::Dense(ckpt.dense(name, n, k)?)) };
        let linear = |name: &str, w: HostLinear| b.linear_weight(name, w);
        let vector = |name: &str, len| b.vector(&ckpt.tensor(name, &[len])?);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = |name: &str| format!("layers.{i}.{name}");
            let (attn, mlp) = (|name: &str| p(&format!("self_attn.{name}")), |name: &str| p(&format!("mlp.{name}")));
            let kv = HostLinear::stack(
                dense(&attn("k_proj.weight"), kv_width, h)?,
                dense(&attn("v_proj.weight"), kv_width, h)?,
            )?;
            let gate_up = HostLinear::stack(
                dense(&mlp("gate_proj.weight"), inter, h)?,
                dense(&mlp("up_proj.weight"), inter, h)?,
            )?;
            layers.push(Layer {
                input_norm: vector(&p("input_layernorm.weight"), h)?,
                q_proj: linear(&attn("q_proj"), dense(&attn("q_proj.weight"), q_width, h)?)?,
                kv_proj: linear(&attn("k_proj+v_proj"), kv)?,
                o_proj: linear(&attn("o_proj"), dense(&attn("o_proj.weight"), h, q_width)?)?,
                q_norm: vector(&attn("q_norm.weight"), hd)?,
                k_norm: vector(&attn("k_norm.weight"), hd)?,
                post_norm: vector(&p("post_attention_layernorm.weight"), h)?,
                gate_up: linear(&mlp("gate_proj+up_proj"), gate_up)?,
                down_proj: linear(&mlp("down_proj"), dense(&mlp("down_proj.weight"), h, inter)?)?,
            });
        }
        // Qwen3's rope: frequencies over the whole head, pairs (i, i + head_dim / 2); YaRN's scale cos
        // and sin by its attention factor.
        let (inv_freq, scale) = match &c.rope_scaling {
            None => (inv_freq(hd, c.rope_theta), 1.0),
            Some(y) => (yarn_inv_freq(&y.yarn, hd, c.rope_theta), y.attention_factor),
        };
        let rope = Rope::new(&**b, &RopeTable::new(&inv_freq, target.config.context_len(), scale))?;
        Ok(DflashModel {
            fc: linear("fc", dense("fc.weight", h, c.tap_width())?)?,
            hidden_norm: vector("hidden_norm.weight", h)?,
            norm: vector("norm.weight", h)?,
            layers,
            rope,
            backend: b.clone(),
            config: c,
        })
    }
}
