//! config.json of a DeepSeek-V3-architecture checkpoint (DeepSeek-V3, Kimi K2, Kimi K2.5's text
//! model), under its own key names. Defaults are those of transformers' `DeepseekV3Config`. What
//! each value may be is in [`limits`].

mod limits;

use std::io::Read;
use std::path::Path;

use super::json::{Obj, err};
use super::quant_config::QuantConfig;
use crate::error::{EngineError, Result};

/// YaRN rope scaling (DeepSeek-V3's `rope_scaling` with `type`/`rope_type` "yarn").
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: f64,
    pub mscale_all_dim: f64,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    /// DeepSeek-V3's multi-token-prediction layers, stored after the others; the engine does not run them.
    pub num_nextn_predict_layers: usize,
    pub num_attention_heads: usize,
    /// `None`: queries come from one `q_proj`, not the low-rank `q_a_proj`/`q_b_proj` pair.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub first_k_dense_replace: usize,
    pub moe_layer_freq: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    pub rope_theta: f64,
    pub rope_scaling: Option<Yarn>,
    pub rope_interleave: bool,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// INT4 modules, from `quantization_config`; `None` for an unquantized checkpoint.
    pub quantization: Option<QuantConfig>,
}

impl Config {
    /// The most bytes a config.json may have (Kimi K2's has 4 KiB): a link to an endless file is
    /// refused, not read until memory runs out.
    pub const MAX_FILE_BYTES: u64 = 16 << 20;

    pub fn load(path: &Path) -> Result<Self> {
        let file = path.display().to_string();
        let mut text = String::new();
        let limit = Self::MAX_FILE_BYTES;
        let read = std::fs::File::open(path).and_then(|f| f.take(limit + 1).read_to_string(&mut text));
        read.map_err(|source| EngineError::Io { file: file.clone(), source })?;
        if text.len() as u64 > limit {
            return Err(err(&file, "<root>", format!("is larger than {limit} bytes: not a config.json")));
        }
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(&file, "<root>", e.to_string()))?;
        Self::parse(&file, &value)
    }

    /// Parses a config; `file` names it in errors. Kimi K2.5 nests the text model under `text_config`.
    pub fn parse(file: &str, value: &serde_json::Value) -> Result<Self> {
        let root = Obj::new(file, value, "<root>")?;
        let c = root.obj("text_config")?.unwrap_or(Obj { file, map: root.map });
        let model_type = c.str_or("model_type", "")?;
        if !["deepseek_v3", "kimi_k2"].contains(&model_type) {
            return Err(EngineError::UnknownModelType { file: file.into(), model_type: model_type.into() });
        }
        let scoring = c.str_or("scoring_func", "sigmoid")?;
        let topk_method = c.str_or("topk_method", "noaux_tc")?;
        if scoring != "sigmoid" || topk_method != "noaux_tc" {
            let reason = format!("{scoring} scoring with {topk_method} is not supported (sigmoid with noaux_tc is)");
            return Err(err(file, "scoring_func/topk_method", reason));
        }
        let quantization = match c.obj("quantization_config")?.or(root.obj("quantization_config")?) {
            Some(q) => Some(QuantConfig::parse(&q)?),
            None => None,
        };
        let (rope_theta, rope_scaling) = rope(&c)?;
        let config = Self {
            model_type: model_type.into(),
            vocab_size: c.usize("vocab_size")?,
            hidden_size: c.usize("hidden_size")?,
            intermediate_size: c.usize("intermediate_size")?,
            moe_intermediate_size: c.usize_or("moe_intermediate_size", 2048)?,
            num_hidden_layers: c.usize("num_hidden_layers")?,
            num_nextn_predict_layers: c.usize_or("num_nextn_predict_layers", 0)?,
            num_attention_heads: c.usize("num_attention_heads")?,
            q_lora_rank: if c.map.contains_key("q_lora_rank") { c.opt_usize("q_lora_rank")? } else { Some(1536) },
            kv_lora_rank: c.usize_or("kv_lora_rank", 512)?,
            qk_nope_head_dim: c.usize_or("qk_nope_head_dim", 128)?,
            qk_rope_head_dim: c.usize_or("qk_rope_head_dim", 64)?,
            v_head_dim: c.usize_or("v_head_dim", 128)?,
            first_k_dense_replace: c.usize_or("first_k_dense_replace", 3)?,
            moe_layer_freq: c.usize_or("moe_layer_freq", 1)?.max(1),
            n_routed_experts: c.usize_or("n_routed_experts", 0)?,
            num_experts_per_tok: c.usize_or("num_experts_per_tok", 8)?,
            n_shared_experts: c.usize_or("n_shared_experts", 1)?,
            n_group: c.usize_or("n_group", 1)?,
            topk_group: c.usize_or("topk_group", 1)?,
            routed_scaling_factor: c.f64_or("routed_scaling_factor", 1.0)? as f32,
            norm_topk_prob: c.bool_or("norm_topk_prob", true)?,
            rope_theta,
            rope_scaling,
            rope_interleave: c.bool_or("rope_interleave", true)?,
            rms_norm_eps: c.f64_or("rms_norm_eps", 1e-6)? as f32,
            max_position_embeddings: c.usize_or("max_position_embeddings", 4096)?,
            tie_word_embeddings: c.bool_or("tie_word_embeddings", false)?,
            quantization,
        };
        config.check(file)?;
        Ok(config)
    }

    /// Width of one attention head's query and key: the non-rotary plus the rotary part.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Whether layer `i` has the MoE feed-forward (otherwise the dense MLP).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.n_routed_experts > 0 && i >= self.first_k_dense_replace && i % self.moe_layer_freq == 0
    }

    /// The group size of the linear module `module` if the quantization config makes it INT4.
    pub fn quant_group(&self, module: &str) -> Option<usize> {
        self.quantization.as_ref().filter(|q| q.is_quantized(module)).map(|q| q.group_size)
    }
}

/// `rope_theta` and the scaling, from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`,
/// checked ([`limits::check_rope`]) under the key they were read from.
fn rope(c: &Obj<'_>) -> Result<(f64, Option<Yarn>)> {
    let params = c.obj("rope_parameters")?;
    let section = if params.is_some() { "rope_parameters" } else { "rope_scaling" };
    let (theta_key, theta) = match params.as_ref().map(|p| p.opt_f64("rope_theta")).transpose()?.flatten() {
        Some(theta) => ("rope_parameters.rope_theta", theta),
        None => ("rope_theta", c.f64_or("rope_theta", 10000.0)?),
    };
    let yarn = match params.or(c.obj("rope_scaling")?) {
        Some(s) => yarn(c.file, section, &s)?,
        None => None,
    };
    limits::check_rope(c.file, theta_key, theta, section, yarn.as_ref())?;
    Ok((theta, yarn))
}

/// The YaRN parameters of the scaling section `s` (named `section`); `None` for `default` scaling.
fn yarn(file: &str, section: &str, s: &Obj<'_>) -> Result<Option<Yarn>> {
    let kind = match s.opt_str("rope_type")? {
        Some(kind) => kind,
        None => s.str_or("type", "default")?,
    };
    match kind {
        "default" => Ok(None),
        "yarn" => Ok(Some(Yarn {
            factor: s.opt_f64("factor")?.ok_or_else(|| err(file, &format!("{section}.factor"), "is required"))?,
            original_max_position_embeddings: s.usize_or("original_max_position_embeddings", 4096)?,
            beta_fast: s.f64_or("beta_fast", 32.0)?,
            beta_slow: s.f64_or("beta_slow", 1.0)?,
            mscale: s.f64_or("mscale", 1.0)?,
            mscale_all_dim: s.f64_or("mscale_all_dim", 0.0)?,
        })),
        other => Err(err(file, &format!("{section}.type"), format!("`{other}` is not supported (yarn is)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> serde_json::Value {
        json!({"model_type": "kimi_k2", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4, "q_lora_rank": null, "n_routed_experts": 8,
               "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
               "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}})
    }

    #[test]
    fn null_q_lora_rank_means_q_proj_and_yarn_is_read() {
        let c = Config::parse("config.json", &base()).unwrap();
        assert_eq!(c.q_lora_rank, None);
        assert_eq!(c.rope_scaling.as_ref().map(|y| (y.factor, y.beta_fast)), Some((32.0, 1.0)));
        assert!(!c.is_moe_layer(2) && c.is_moe_layer(3));
    }

    #[test]
    fn text_config_and_rope_parameters_are_understood() {
        let mut text = base();
        text.as_object_mut().unwrap().remove("rope_scaling");
        text["rope_parameters"] = json!({"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0});
        let c = Config::parse("config.json", &json!({"model_type": "kimi_k25", "text_config": text})).unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling.map(|y| y.factor)), (50000.0, Some(4.0)));
    }

    #[test]
    fn unknown_model_type_names_the_file() {
        let mut v = base();
        v["model_type"] = json!("llama");
        let e = Config::parse("dir/config.json", &v).unwrap_err();
        assert!(
            matches!(&e, EngineError::UnknownModelType { file, model_type } if file == "dir/config.json" && model_type == "llama")
        );
    }
}
