//! config.json of a DeepSeek-V3-architecture checkpoint (DeepSeek-V3, Kimi K2, Kimi K2.5's text
//! model), under its own key names. Defaults are those of transformers' `DeepseekV3Config`. What
//! each value may be is in [`limits`].
//!
//! The file is read with serde into `raw`'s structs, key for key, and an error names the file and the
//! path of the key (`rope_scaling.factor`, `text_config.hidden_size`); defaults and limits then apply.

mod limits;
mod raw;

pub(crate) use limits::check_rope;

use std::path::Path;

use kdtree_jit::mla::MlaShape;

use super::json::{err, read, read_capped, under};
use super::layout::Layout;
use super::quant_config::QuantConfig;
use crate::error::{EngineError, Result};
use crate::registry::{Heads, KvDtype};

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
    /// The root's `model_type` (`kimi_k25` for a multimodal checkpoint).
    pub model_type: String,
    /// Where the checkpoint keeps the text model's tensors.
    pub layout: Layout,
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
    /// The type the weights are stored in, as written (`torch_dtype`, or transformers 5's `dtype`):
    /// the loader holds the shards' headers to it.
    pub torch_dtype: Option<String>,
    /// INT4 modules, from `quantization_config`; `None` for an unquantized checkpoint.
    pub quantization: Option<QuantConfig>,
}

impl Config {
    /// The most bytes a config.json may have (Kimi K2's has 4 KiB): a link to an endless file is
    /// refused, not read until memory runs out.
    pub(crate) const MAX_FILE_BYTES: u64 = 16 << 20;

    pub fn load(path: &Path) -> Result<Self> {
        let file = path.display().to_string();
        let text = read_capped(path, "a config.json", Self::MAX_FILE_BYTES)?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(&file, "<root>", e.to_string()))?;
        Self::parse(&file, &value)
    }

    /// Parses a config; `file` names it in errors. The root's `model_type` says the layout: a causal
    /// LM's keys sit at the root; Kimi K2.5's (`kimi_k25`) under `text_config` (keys in errors then
    /// start with `text_config.`), its `quantization_config` at the root or there.
    pub fn parse(file: &str, value: &serde_json::Value) -> Result<Self> {
        if !value.is_object() {
            return Err(err(file, "<root>", "is not a JSON object"));
        }
        let kind: raw::Kind = read(file, "", value)?;
        let model_type = kind.model_type.unwrap_or_default();
        let layout = match model_type.as_str() {
            "deepseek_v3" | "kimi_k2" => Layout::CausalLm,
            "kimi_k25" => Layout::KimiK25,
            _ => return Err(EngineError::UnknownModelType { file: file.into(), model_type }),
        };
        if layout == Layout::CausalLm {
            return Self::parse_text(file, value, model_type, layout);
        }
        let text = value.get("text_config").filter(|t| !t.is_null()).ok_or_else(|| {
            err(file, "text_config", "is required: a kimi_k25 config holds its text model's config there")
        })?;
        let text_kind: raw::Kind = read(file, "text_config", text)?;
        // transformers' KimiK25Config fills an absent text model type with DeepSeek-V3's.
        if let Some(other) = text_kind.model_type.filter(|t| !["deepseek_v3", "kimi_k2"].contains(&t.as_str())) {
            let reason = format!("`{other}` is not a DeepSeek-V3 text model (deepseek_v3 or kimi_k2)");
            return Err(err(file, "text_config.model_type", reason));
        }
        let mut config = Self::parse_text(file, text, model_type, layout).map_err(|e| under("text_config", e))?;
        let root_quant = value.get("quantization_config").filter(|q| !q.is_null());
        if let (Some(q), None) = (root_quant, &config.quantization) {
            config.quantization = Some(QuantConfig::parse(file, q)?);
        }
        Ok(config)
    }

    /// The text model's config object `c`, of a checkpoint of `model_type` and `layout`; errors name
    /// keys relative to `c`.
    fn parse_text(file: &str, c: &serde_json::Value, model_type: String, layout: Layout) -> Result<Self> {
        let kind: raw::Kind = read(file, "", c)?;
        let scoring = kind.scoring_func.as_deref().unwrap_or("sigmoid");
        let topk_method = kind.topk_method.as_deref().unwrap_or("noaux_tc");
        if scoring != "sigmoid" || topk_method != "noaux_tc" {
            let reason = format!("{scoring} scoring with {topk_method} is not supported (sigmoid with noaux_tc is)");
            return Err(err(file, "scoring_func/topk_method", reason));
        }
        let r: raw::Config = read(file, "", c)?;
        let quantization = r.quantization_config.as_ref().map(|q| QuantConfig::parse(file, q)).transpose()?;
        let (rope_theta, rope_scaling) = rope(file, &r)?;
        let required = |value: Option<usize>, key: &str| value.ok_or_else(|| err(file, key, "is required"));
        let config = Self {
            model_type,
            layout,
            vocab_size: required(r.vocab_size, "vocab_size")?,
            hidden_size: required(r.hidden_size, "hidden_size")?,
            intermediate_size: required(r.intermediate_size, "intermediate_size")?,
            moe_intermediate_size: r.moe_intermediate_size.unwrap_or(2048),
            num_hidden_layers: required(r.num_hidden_layers, "num_hidden_layers")?,
            num_nextn_predict_layers: r.num_nextn_predict_layers.unwrap_or(0),
            num_attention_heads: required(r.num_attention_heads, "num_attention_heads")?,
            // Absent: DeepSeek-V3's 1536; `null`: no low-rank pair, one q_proj.
            q_lora_rank: r.q_lora_rank.unwrap_or(Some(1536)),
            kv_lora_rank: r.kv_lora_rank.unwrap_or(512),
            qk_nope_head_dim: r.qk_nope_head_dim.unwrap_or(128),
            qk_rope_head_dim: r.qk_rope_head_dim.unwrap_or(64),
            v_head_dim: r.v_head_dim.unwrap_or(128),
            first_k_dense_replace: r.first_k_dense_replace.unwrap_or(3),
            moe_layer_freq: r.moe_layer_freq.unwrap_or(1),
            n_routed_experts: r.n_routed_experts.unwrap_or(0),
            num_experts_per_tok: r.num_experts_per_tok.unwrap_or(8),
            n_shared_experts: r.n_shared_experts.unwrap_or(1),
            n_group: r.n_group.unwrap_or(1),
            topk_group: r.topk_group.unwrap_or(1),
            routed_scaling_factor: r.routed_scaling_factor.unwrap_or(1.0) as f32,
            norm_topk_prob: r.norm_topk_prob.unwrap_or(true),
            rope_theta,
            rope_scaling,
            rope_interleave: r.rope_interleave.unwrap_or(true),
            rms_norm_eps: r.rms_norm_eps.unwrap_or(1e-6) as f32,
            max_position_embeddings: r.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: r.tie_word_embeddings.unwrap_or(false),
            torch_dtype: r.torch_dtype.or(r.dtype),
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
        self.n_routed_experts > 0 && i >= self.first_k_dense_replace && i.is_multiple_of(self.moe_layer_freq)
    }

    /// MLA's head sizes, with the cache storing its entries as `kv`.
    pub fn heads(&self, kv: KvDtype) -> Heads {
        let mla = MlaShape {
            heads: self.num_attention_heads,
            nope: self.qk_nope_head_dim,
            rope: self.qk_rope_head_dim,
            v: self.v_head_dim,
            latent: self.kv_lora_rank,
            scale: super::rotary::softmax_scale(self),
        };
        Heads { mla, kv }
    }

    /// The group size of the linear module `module` (the text model's name) if the quantization
    /// config makes it INT4. A multimodal checkpoint's ignore list may name a module either way
    /// (`lm_head` or `language_model.lm_head`): ignored under either name, it stays dense.
    pub fn quant_group(&self, module: &str) -> Option<usize> {
        let stored = format!("{}{module}", self.layout.text_prefix());
        self.quantization.as_ref().filter(|q| q.is_quantized(module) && q.is_quantized(&stored)).map(|q| q.group_size)
    }
}

/// `rope_theta` and the scaling, from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`,
/// checked ([`limits::check_rope`]) under the key they were read from.
fn rope(file: &str, c: &raw::Config) -> Result<(f64, Option<Yarn>)> {
    let params = c.rope_parameters.as_ref();
    let section = if params.is_some() { "rope_parameters" } else { "rope_scaling" };
    let (theta_key, theta) = match params.and_then(|p| p.rope_theta) {
        Some(theta) => ("rope_parameters.rope_theta", theta),
        None => ("rope_theta", c.rope_theta.unwrap_or(10000.0)),
    };
    let yarn = match params.or(c.rope_scaling.as_ref()) {
        Some(s) => yarn(file, section, s)?,
        None => None,
    };
    limits::check_rope(file, theta_key, theta, section, yarn.as_ref())?;
    Ok((theta, yarn))
}

/// The YaRN parameters of the scaling section `s` (named `section`); `None` for `default` scaling.
fn yarn(file: &str, section: &str, s: &raw::Rope) -> Result<Option<Yarn>> {
    let (kind_key, kind) = match (&s.rope_type, &s.kind) {
        (Some(kind), _) => ("rope_type", kind.as_str()),
        (None, Some(kind)) => ("type", kind.as_str()),
        // transformers standardises a typeless `rope_parameters` to the default rope, but fails on a
        // typeless `rope_scaling` (`{}` included): what was meant is unknown.
        (None, None) if section == "rope_scaling" => {
            let reason = "names no `type` (or `rope_type`): give \"yarn\" with its parameters or \"default\", or leave \
                          rope_scaling out (or null) for plain rope";
            return Err(err(file, section, reason));
        }
        (None, None) => ("type", "default"),
    };
    match kind {
        "default" => Ok(None),
        "yarn" => Ok(Some(Yarn {
            factor: s.factor.ok_or_else(|| err(file, &format!("{section}.factor"), "is required"))?,
            original_max_position_embeddings: s.original_max_position_embeddings.unwrap_or(4096),
            beta_fast: s.beta_fast.unwrap_or(32.0),
            beta_slow: s.beta_slow.unwrap_or(1.0),
            mscale: s.mscale.unwrap_or(1.0),
            mscale_all_dim: s.mscale_all_dim.unwrap_or(0.0),
        })),
        other => Err(err(file, &format!("{section}.{kind_key}"), format!("`{other}` is not supported (yarn is)"))),
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

    /// The message of the error `v` gives.
    fn message(v: &serde_json::Value) -> String {
        Config::parse("config.json", v).map(|_| panic!("accepted {v}")).unwrap_err().to_string()
    }

    #[test]
    fn wrong_types_and_missing_keys_name_the_key_path() {
        let with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut v = base();
            edit(&mut v);
            v
        };
        let m = message(&with(&|v| v["hidden_size"] = json!(64.5)));
        assert!(m.starts_with("config.json: `hidden_size`: invalid type: floating point `64.5`"), "{m}");
        let m = message(&with(&|v| v["rope_scaling"]["factor"] = json!("big")));
        assert!(m.contains("`rope_scaling.factor`: invalid type: string"), "{m}");
        let m = message(&with(&|v| v["rope_scaling"]["type"] = json!("linear")));
        assert!(m.contains("`rope_scaling.type`: `linear` is not supported"), "{m}");
        let m = message(&with(&|v| drop(v.as_object_mut().unwrap().remove("vocab_size"))));
        assert!(m.contains("`vocab_size`: is required"), "{m}");
        let m = message(&json!({"model_type": "kimi_k25", "text_config": with(&|v| v["norm_topk_prob"] = json!(1))}));
        assert!(m.contains("`text_config.norm_topk_prob`: invalid type: integer `1`, expected a boolean"), "{m}");
        let m = message(&json!({"model_type": "kimi_k25", "text_config": with(&|v| v["rms_norm_eps"] = json!(0))}));
        assert!(m.contains("`text_config.rms_norm_eps`: is 0"), "{m}");
        let m = message(&json!([1, 2]));
        assert!(m.contains("`<root>`: is not a JSON object"), "{m}");
    }

    #[test]
    fn a_quantization_config_at_the_root_serves_a_nested_text_config() {
        let q = json!({"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head", 7],
                       "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32}}}});
        let m = message(&json!({"model_type": "kimi_k25", "text_config": base(), "quantization_config": q}));
        assert!(m.contains("`quantization_config.ignore[1]`: invalid type: integer `7`"), "{m}");
        let mut text = base();
        text["quantization_config"] = q.clone();
        let m = message(&json!({"model_type": "kimi_k25", "text_config": text}));
        assert!(m.contains("`text_config.quantization_config.ignore[1]`"), "{m}");
        let mut q = q;
        q["ignore"] = json!(["lm_head"]);
        let c = Config::parse(
            "config.json",
            &json!({"model_type": "kimi_k25", "text_config": base(), "quantization_config": q}),
        )
        .unwrap();
        assert_eq!(c.layout, Layout::KimiK25);
        assert_eq!(c.quant_group("model.layers.1.mlp.experts.0.up_proj"), Some(32));
        assert_eq!(c.quant_group("lm_head"), None);
    }

    #[test]
    fn a_multimodal_ignore_list_may_name_modules_with_their_stored_prefix() {
        let q = json!({"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["language_model.lm_head"],
                       "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32}}}});
        let c = Config::parse(
            "config.json",
            &json!({"model_type": "kimi_k25", "text_config": base(), "quantization_config": q}),
        )
        .unwrap();
        assert_eq!(c.quant_group("lm_head"), None);
        assert_eq!(c.quant_group("model.layers.1.mlp.experts.0.up_proj"), Some(32));
    }

    #[test]
    fn a_multimodal_config_needs_a_deepseek_v3_text_config() {
        let m = message(&json!({"model_type": "kimi_k25", "vision_config": {}}));
        assert!(m.contains("`text_config`: is required"), "{m}");
        let mut text = base();
        text["model_type"] = json!("qwen2");
        let m = message(&json!({"model_type": "kimi_k25", "text_config": text}));
        assert!(m.contains("`text_config.model_type`: `qwen2` is not a DeepSeek-V3 text model"), "{m}");
        // A text_config without a model type is DeepSeek-V3's, as transformers fills it.
        let mut text = base();
        text.as_object_mut().unwrap().remove("model_type");
        let c = Config::parse("config.json", &json!({"model_type": "kimi_k25", "text_config": text})).unwrap();
        assert_eq!((c.model_type.as_str(), c.layout), ("kimi_k25", Layout::KimiK25));
        // Only kimi_k25 nests: another model type is refused, text_config or not.
        let e = Config::parse("config.json", &json!({"model_type": "llava", "text_config": base()})).unwrap_err();
        assert!(matches!(&e, EngineError::UnknownModelType { model_type, .. } if model_type == "llava"), "{e}");
    }

    #[test]
    fn a_typeless_rope_scaling_and_a_zero_moe_layer_freq_are_refused() {
        let mut v = base();
        v["rope_scaling"] = json!({});
        assert!(message(&v).contains("`rope_scaling`: names no `type` (or `rope_type`)"), "{}", message(&v));
        v["rope_scaling"] = json!({"factor": 4.0});
        assert!(message(&v).contains("`rope_scaling`: names no `type`"), "{}", message(&v));
        // null (or absent) is plain rope; a typeless rope_parameters is the default rope, as in transformers.
        v["rope_scaling"] = json!(null);
        assert_eq!(Config::parse("config.json", &v).unwrap().rope_scaling, None);
        v["rope_parameters"] = json!({"rope_theta": 20000.0});
        assert_eq!(Config::parse("config.json", &v).unwrap().rope_theta, 20000.0);
        let mut v = base();
        v["moe_layer_freq"] = json!(0);
        assert!(message(&v).contains("`moe_layer_freq`: is 0, must be in 1..="), "{}", message(&v));
        v["moe_layer_freq"] = json!(2);
        let c = Config::parse("config.json", &v).unwrap();
        assert!(!c.is_moe_layer(3) && c.is_moe_layer(4));
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
