//! config.json as written, key for key: what serde reads before defaults and limits apply. Unknown keys
//! are ignored (real configs carry many the engine does not use), `null` reads as absent.

use serde::Deserialize;
use serde_json::Value;

use crate::model::json::present;

/// What decides whether the rest is read at all: the architecture and the router.
#[derive(Debug, Deserialize)]
pub(super) struct Kind {
    pub model_type: Option<String>,
    pub scoring_func: Option<String>,
    pub topk_method: Option<String>,
}

/// The text model's keys that the engine reads.
#[derive(Debug, Deserialize)]
pub(super) struct Config {
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_nextn_predict_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    /// Absent and `null` differ: `null` says there is no low-rank query pair.
    #[serde(default, deserialize_with = "present")]
    pub q_lora_rank: Option<Option<usize>>,
    pub kv_lora_rank: Option<usize>,
    pub qk_nope_head_dim: Option<usize>,
    pub qk_rope_head_dim: Option<usize>,
    pub v_head_dim: Option<usize>,
    pub first_k_dense_replace: Option<usize>,
    pub moe_layer_freq: Option<usize>,
    pub n_routed_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    pub n_shared_experts: Option<usize>,
    pub n_group: Option<usize>,
    pub topk_group: Option<usize>,
    pub routed_scaling_factor: Option<f64>,
    pub norm_topk_prob: Option<bool>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<Rope>,
    /// transformers 5's form of `rope_theta` + `rope_scaling`.
    pub rope_parameters: Option<Rope>,
    pub rope_interleave: Option<bool>,
    pub rms_norm_eps: Option<f64>,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub torch_dtype: Option<String>,
    /// transformers 5's name of `torch_dtype`.
    pub dtype: Option<String>,
    /// Read by [`crate::model::QuantConfig`], whose errors name keys under it.
    pub quantization_config: Option<Value>,
}

/// `rope_scaling` or `rope_parameters`.
#[derive(Debug, Deserialize)]
pub(super) struct Rope {
    /// transformers' name of the scaling type; DeepSeek-V3's own configs say `type`.
    pub rope_type: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    /// Only under `rope_parameters`.
    pub rope_theta: Option<f64>,
}
