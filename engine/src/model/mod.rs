//! The DeepSeek-V3 architecture as Kimi K2 uses it, loaded from a Hugging Face-style folder
//! (`config.json`, safetensors shards, optionally `model.safetensors.index.json`).
//!
//! What checks it (tests under `engine/tests/`):
//!
//! | part | reference |
//! |---|---|
//! | whole forward: MLA (q_lora and q_proj), interleaved and half-split rope, YaRN and its mscale², dense MLP, MoE with shared experts, INT4 unpacking | a NumPy float64 transcription of transformers' `modeling_deepseek_v3.py` (`reference.rs`, agreement 5e-7 of the logits' scale) |
//! | routing, ties included | a scalar re-implementation of the `noaux_tc` router (`routing.rs`) |
//! | INT4 experts | the same checkpoint with dequantized f32 weights, bitwise (`int4.rs`) |
//! | KV cache, tree masks, compaction | one-token forwards, bitwise (`model.rs`) |
//!
//! Not supported yet: FP8 (block-quantized) checkpoints such as DeepSeek-V3's own release, softmax
//! scoring and the older `greedy`/`group_limited_greedy` routers, rope scaling other than YaRN,
//! INT4 weights whose three tensors sit in different shards, and memory-mapped loading (every
//! shard is read into memory and dense weights are widened to f32).

mod attention;
mod cache;
mod checkpoint;
mod config;
mod json;
mod mlp;
mod moe;
mod quant_config;
mod rotary;

use std::path::Path;

pub use cache::KvCache;
pub use config::{Config, Yarn};
pub use moe::{Routing, route};
pub use quant_config::QuantConfig;
pub use rotary::{softmax_scale, yarn_mscale};

use attention::{Attention, AttnCtx};
use checkpoint::Checkpoint;
use mlp::Mlp;
use moe::Moe;

use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use crate::ops::cpu::RopeTable;
use crate::registry::{Backend, LinearWeight, OpRegistry};

#[derive(Clone, Debug)]
enum FeedForward {
    Dense(Mlp),
    Moe(Moe),
}

#[derive(Clone, Debug)]
struct Layer {
    input_norm: Vec<f32>,
    attn: Attention,
    post_norm: Vec<f32>,
    ffn: FeedForward,
}

/// A loaded model: weights in f32 (dense) or INT4, and the ops it runs through.
#[derive(Clone, Debug)]
pub struct Model {
    pub config: Config,
    ops: OpRegistry,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: LinearWeight,
    rope: RopeTable,
    scale: f32,
}

impl Model {
    /// Loads `dir` onto the CPU backend.
    pub fn load(dir: &Path) -> Result<Model> {
        Self::load_with(dir, OpRegistry::default())
    }

    /// Loads `dir`; the model's ops run through `ops`. On the CUDA backend the W4A16 weights are
    /// then uploaded with the kernels their shapes' plans name (see [`crate::cuda`]).
    pub fn load_with(dir: &Path, ops: OpRegistry) -> Result<Model> {
        let config = Config::load(&dir.join("config.json"))?;
        let ckpt = Checkpoint::open(dir)?;
        let c = &config;
        let (h, v) = (c.hidden_size, c.vocab_size);
        let embed = ckpt.tensor("model.embed_tokens.weight", &[v, h])?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let ffn = if c.is_moe_layer(i) {
                    FeedForward::Moe(Moe::load(&ckpt, c, &format!("{p}.mlp"))?)
                } else {
                    FeedForward::Dense(Mlp::load(&ckpt, c, &format!("{p}.mlp"), c.intermediate_size)?)
                };
                Ok(Layer {
                    input_norm: ckpt.tensor(&format!("{p}.input_layernorm.weight"), &[h])?,
                    attn: Attention::load(&ckpt, c, &format!("{p}.self_attn"))?,
                    post_norm: ckpt.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                    ffn,
                })
            })
            .collect::<Result<_>>()?;
        let lm_head = if c.tie_word_embeddings && !ckpt.contains("lm_head.weight") {
            LinearWeight::Dense { n: v, k: h, w: embed.clone() }
        } else {
            ckpt.linear("lm_head", v, h, c.quant_group("lm_head"))?
        };
        let mut model = Model {
            norm: ckpt.tensor("model.norm.weight", &[h])?,
            rope: rotary::rope_table(c),
            scale: rotary::softmax_scale(c),
            embed,
            layers,
            lm_head,
            ops,
            config,
        };
        if let Backend::Cuda(cuda) = model.ops.backend().clone() {
            cuda.upload(model.linears_mut())?;
        }
        Ok(model)
    }

    /// Every linear weight of the model.
    fn linears_mut(&mut self) -> impl Iterator<Item = &mut LinearWeight> {
        let layers = self.layers.iter_mut().flat_map(|layer| {
            let ffn: Box<dyn Iterator<Item = &mut LinearWeight>> = match &mut layer.ffn {
                FeedForward::Dense(mlp) => Box::new(mlp.linears_mut().into_iter()),
                FeedForward::Moe(moe) => Box::new(moe.linears_mut()),
            };
            layer.attn.linears_mut().into_iter().chain(ffn)
        });
        layers.chain(std::iter::once(&mut self.lm_head))
    }

    pub fn ops(&self) -> &OpRegistry {
        &self.ops
    }

    /// An empty cache for this model.
    pub fn new_cache(&self) -> KvCache {
        let c = &self.config;
        let heads = c.num_attention_heads;
        KvCache::new(c.num_hidden_layers, heads * c.qk_head_dim(), heads * c.v_head_dim)
    }

    /// Runs `tokens` at position ids `positions`, attending to everything in `cache` plus the new
    /// tokens `mask` allows (`None` = causal). Appends all new K/V to the cache (nothing on error).
    /// Returns logits `[tokens.len(), vocab]`, f32.
    pub fn forward(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        positions: &[usize],
        mask: Option<&TreeMask>,
    ) -> Result<Vec<f32>> {
        let n = tokens.len();
        let causal;
        let mask = match mask {
            Some(m) => m,
            None => {
                causal = TreeMask::causal(n);
                &causal
            }
        };
        if positions.len() != n || mask.len() != n {
            return Err(EngineError::InvalidArgument(format!(
                "forward: {n} tokens, {} positions, a mask of {}",
                positions.len(),
                mask.len()
            )));
        }
        let max = self.rope.max_positions();
        if let Some(&position) = positions.iter().find(|&&p| p >= max) {
            return Err(EngineError::PositionOutOfRange { position, max });
        }
        let result = self.run(cache, tokens, positions, mask);
        match &result {
            Ok(_) => cache.commit(n),
            Err(_) => cache.rollback(),
        }
        result
    }

    fn run(&self, cache: &mut KvCache, tokens: &[u32], positions: &[usize], mask: &TreeMask) -> Result<Vec<f32>> {
        let (c, ops, n) = (&self.config, &self.ops, tokens.len());
        let cx = AttnCtx { config: c, ops, rope: &self.rope, scale: self.scale, positions, mask };
        let mut x = ops.embedding(&self.embed, c.hidden_size, tokens)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let attn = layer.attn.forward(&ops.rmsnorm(&x, &layer.input_norm, c.rms_norm_eps), i, cache, &cx)?;
            add(&mut x, &attn);
            let normed = ops.rmsnorm(&x, &layer.post_norm, c.rms_norm_eps);
            let ffn = match &layer.ffn {
                FeedForward::Dense(mlp) => mlp.forward(ops, &normed, n)?,
                FeedForward::Moe(moe) => moe.forward(ops, &normed, n)?,
            };
            add(&mut x, &ffn);
        }
        ops.linear(&ops.rmsnorm(&x, &self.norm, c.rms_norm_eps), n, &self.lm_head)
    }
}

/// The residual add `x += y`.
fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}
