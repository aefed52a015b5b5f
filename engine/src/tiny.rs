//! Tiny random checkpoints of the Kimi K2 architecture with the real file layout: `config.json`
//! (with the compressed-tensors `quantization_config` of K2 for the INT4 variant), two safetensors
//! shards and `model.safetensors.index.json`. Seeded, so a spec always writes the same bytes.

use std::collections::BTreeMap;
use std::path::Path;

use half::bf16;
use kdtree_quant::{Dtype, QuantizedWeight, Tensor, write_file};
use safetensors::Dtype as StDtype;
use serde_json::json;

use crate::error::{EngineError, Result};

/// The sizes and seed of a tiny model. [`Default`] is the bf16 model tests use.
#[derive(Clone, Debug, PartialEq)]
pub struct TinySpec {
    pub seed: u64,
    /// Routed experts INT4 (symmetric, group 32, bf16 scales), everything else bf16, as K2 ships.
    pub int4_experts: bool,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// `None` writes one `q_proj` instead of the low-rank pair.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub n_shared_experts: usize,
    pub first_k_dense_replace: usize,
    pub max_position_embeddings: usize,
    /// YaRN factor 4 over an original context of `max_position_embeddings / 4`.
    pub yarn: bool,
    /// DeepSeek-V3's adjacent-pair rotary layout; `false` writes `rope_interleave: false`.
    pub rope_interleave: bool,
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            seed: 0,
            int4_experts: false,
            vocab_size: 256,
            hidden_size: 64,
            num_hidden_layers: 3,
            num_attention_heads: 4,
            q_lora_rank: Some(32),
            kv_lora_rank: 32,
            qk_nope_head_dim: 16,
            qk_rope_head_dim: 8,
            v_head_dim: 16,
            intermediate_size: 128,
            moe_intermediate_size: 32,
            n_routed_experts: 8,
            num_experts_per_tok: 2,
            n_group: 2,
            topk_group: 1,
            n_shared_experts: 1,
            first_k_dense_replace: 1,
            max_position_embeddings: 512,
            yarn: true,
            rope_interleave: true,
        }
    }
}

impl TinySpec {
    pub fn config_json(&self) -> serde_json::Value {
        let mut c = json!({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "first_k_dense_replace": self.first_k_dense_replace,
            "moe_layer_freq": 1,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "n_shared_experts": self.n_shared_experts,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "routed_scaling_factor": 2.827,
            "norm_topk_prob": true,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "rope_theta": 50000.0,
            "rope_interleave": self.rope_interleave,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
        });
        if self.yarn {
            c["rope_scaling"] = json!({
                "type": "yarn", "factor": 4.0, "original_max_position_embeddings": self.max_position_embeddings / 4,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            });
        }
        if self.int4_experts {
            // Kimi K2's own quantization_config.
            c["quantization_config"] = json!({
                "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "output_activations": null,
                    "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32,
                                "dynamic": false, "actorder": null, "observer": "minmax"}}},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
                "kv_cache_scheme": null,
            });
        }
        c
    }

    /// Every tensor of the checkpoint, in a fixed order.
    fn tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let mut rng = SplitMix(self.seed);
        let mut out = Vec::new();
        let (h, heads) = (self.hidden_size, self.num_attention_heads);
        let qk = self.qk_nope_head_dim + self.qk_rope_head_dim;
        out.push(rng.bf16("model.embed_tokens.weight", &[self.vocab_size, h], 1.0));
        for i in 0..self.num_hidden_layers {
            let p = format!("model.layers.{i}");
            out.push(rng.norm(&format!("{p}.input_layernorm.weight"), h));
            let a = format!("{p}.self_attn");
            match self.q_lora_rank {
                None => out.push(rng.linear(&format!("{a}.q_proj"), heads * qk, h)),
                Some(r) => {
                    out.push(rng.linear(&format!("{a}.q_a_proj"), r, h));
                    out.push(rng.norm(&format!("{a}.q_a_layernorm.weight"), r));
                    out.push(rng.linear(&format!("{a}.q_b_proj"), heads * qk, r));
                }
            }
            out.push(rng.linear(&format!("{a}.kv_a_proj_with_mqa"), self.kv_lora_rank + self.qk_rope_head_dim, h));
            out.push(rng.norm(&format!("{a}.kv_a_layernorm.weight"), self.kv_lora_rank));
            out.push(rng.linear(
                &format!("{a}.kv_b_proj"),
                heads * (self.qk_nope_head_dim + self.v_head_dim),
                self.kv_lora_rank,
            ));
            out.push(rng.linear(&format!("{a}.o_proj"), h, heads * self.v_head_dim));
            out.push(rng.norm(&format!("{p}.post_attention_layernorm.weight"), h));
            let m = format!("{p}.mlp");
            if i < self.first_k_dense_replace || self.n_routed_experts == 0 {
                out.extend(rng.mlp(&m, h, self.intermediate_size, false)?);
                continue;
            }
            out.push(rng.bf16(&format!("{m}.gate.weight"), &[self.n_routed_experts, h], 1.0 / (h as f32).sqrt()));
            out.push(rng.bf16(&format!("{m}.gate.e_score_correction_bias"), &[self.n_routed_experts], 0.05));
            for e in 0..self.n_routed_experts {
                out.extend(rng.mlp(&format!("{m}.experts.{e}"), h, self.moe_intermediate_size, self.int4_experts)?);
            }
            if self.n_shared_experts > 0 {
                let inter = self.moe_intermediate_size * self.n_shared_experts;
                out.extend(rng.mlp(&format!("{m}.shared_experts"), h, inter, false)?);
            }
        }
        out.push(rng.norm("model.norm.weight", h));
        out.push(rng.linear("lm_head", self.vocab_size, h));
        Ok(out)
    }
}

/// Writes the tiny model `spec` describes into `dir` (created if missing).
pub fn write_tiny_model(dir: &Path, spec: &TinySpec) -> Result<()> {
    let io = |path: &Path, source| EngineError::Io { file: path.display().to_string(), source };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let config = serde_json::to_string_pretty(&spec.config_json()).map_err(|e| io(dir, std::io::Error::other(e)))?;
    std::fs::write(dir.join("config.json"), config).map_err(|e| io(&dir.join("config.json"), e))?;

    let tensors = spec.tensors()?;
    // Split in the middle, but never between the three tensors of one INT4 weight.
    let mut half = tensors.len() / 2;
    while tensors[half].0.ends_with(".weight_scale") || tensors[half].0.ends_with(".weight_shape") {
        half += 1;
    }
    let mut weight_map = BTreeMap::new();
    let mut total_size = 0;
    for (i, shard) in [&tensors[..half], &tensors[half..]].into_iter().enumerate() {
        let name = format!("model-{:05}-of-00002.safetensors", i + 1);
        for (tensor, t) in shard {
            weight_map.insert(tensor.clone(), name.clone());
            total_size += t.data.len();
        }
        let path = dir.join(&name);
        write_file(&path, shard).map_err(|source| EngineError::Quant {
            file: path.display().to_string(),
            tensor: String::new(),
            source: Box::new(source),
        })?;
    }
    let index = json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
    let path = dir.join("model.safetensors.index.json");
    std::fs::write(&path, index.to_string()).map_err(|e| io(&path, e))
}

/// SplitMix64: a seeded generator with no dependencies, stable across versions.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-scale, scale)`.
    fn values(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| ((self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale).collect()
    }

    fn bf16(&mut self, name: &str, shape: &[usize], scale: f32) -> (String, Tensor) {
        let v: Vec<bf16> = self.values(shape.iter().product(), scale).into_iter().map(bf16::from_f32).collect();
        (name.into(), Tensor::new(StDtype::BF16, shape.to_vec(), &v))
    }

    /// A norm weight near 1.
    fn norm(&mut self, name: &str, len: usize) -> (String, Tensor) {
        let v: Vec<bf16> = self.values(len, 0.2).into_iter().map(|x| bf16::from_f32(1.0 + x)).collect();
        (name.into(), Tensor::new(StDtype::BF16, vec![len], &v))
    }

    /// A bf16 `{module}.weight` of shape `[n, k]`, scaled like a default initialisation.
    fn linear(&mut self, module: &str, n: usize, k: usize) -> (String, Tensor) {
        self.bf16(&format!("{module}.weight"), &[n, k], (3.0 / k as f32).sqrt())
    }

    fn mlp(&mut self, prefix: &str, h: usize, inter: usize, int4: bool) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for (name, n, k) in [("gate_proj", inter, h), ("up_proj", inter, h), ("down_proj", h, inter)] {
            let module = format!("{prefix}.{name}");
            if int4 {
                let w = self.values(n * k, (3.0 / k as f32).sqrt());
                let q = QuantizedWeight::quantize(&w, n, k, 32, Dtype::Bf16).map_err(|source| EngineError::Quant {
                    file: "<tiny model>".into(),
                    tensor: module.clone(),
                    source: Box::new(source),
                })?;
                out.extend(q.to_tensors(&module));
            } else {
                out.push(self.linear(&module, n, k));
            }
        }
        Ok(out)
    }
}
