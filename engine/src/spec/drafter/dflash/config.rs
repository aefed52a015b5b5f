//! A DFlash drafter's config.json: a Qwen3 decoder's keys plus `dflash_config`, checked against the
//! target it drafts for. Keys follow the reference (`dflash/model.py` of the DFlash release): `block_size`
//! at the root (first releases) or under `dflash_config` (later ones), `target_layer_ids` defaulting to
//! its `build_target_layer_ids`.

use std::path::Path;

use serde::Deserialize;

use crate::error::Result;
use crate::model::json::{err, read, read_capped};
use crate::model::{Config, Yarn, check_rope, yarn_mscale};

/// The sizes and constants of a DFlash drafter, valid for the target it was checked against.
#[derive(Clone, Debug, PartialEq)]
pub struct DflashConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    /// YaRN rope scaling, `None` for plain rope.
    pub rope_scaling: Option<DraftYarn>,
    /// The target layers whose outputs, concatenated in this order, are the drafter's context features.
    pub target_layer_ids: Vec<usize>,
    /// Positions drafted a round: the bonus token and `block_size - 1` masks.
    pub block_size: usize,
    pub mask_token_id: u32,
    /// Multiplies the target's embedding of the block.
    pub input_embedding_scale: f32,
    /// Multiplies the logits from the target's LM head.
    pub output_multiplier: f32,
    /// `cap * tanh(logits / cap)`, after the multiplier.
    pub final_logit_softcapping: Option<f32>,
}

#[derive(Deserialize)]
struct Raw {
    architectures: Option<Vec<String>>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: Option<usize>,
    vocab_size: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    max_position_embeddings: Option<usize>,
    rope_scaling: Option<serde_json::Value>,
    rope_parameters: Option<serde_json::Value>,
    attention_bias: Option<bool>,
    use_sliding_window: Option<bool>,
    layer_types: Option<Vec<String>>,
    hidden_act: Option<String>,
    block_size: Option<usize>,
    num_target_layers: Option<usize>,
    dflash_config: Option<RawDflash>,
}

#[derive(Deserialize)]
struct RawDflash {
    target_layer_ids: Option<Vec<usize>>,
    block_size: Option<usize>,
    mask_token_id: Option<u32>,
    input_embedding_scale: Option<f32>,
    output_multiplier: Option<f32>,
    final_logit_softcapping: Option<f32>,
}

impl DflashConfig {
    /// Reads `dir/config.json` and checks it against `target`.
    pub fn load(dir: &Path, target: &Config) -> Result<DflashConfig> {
        let path = dir.join("config.json");
        let file = path.display().to_string();
        let text = read_capped(&path, "a config.json", Config::MAX_FILE_BYTES)?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(&file, "<root>", e.to_string()))?;
        Self::parse(&file, &value, target)
    }

    /// Parses a drafter config (`file` names it in errors) and checks it against `target`.
    pub fn parse(file: &str, value: &serde_json::Value, target: &Config) -> Result<DflashConfig> {
        let raw: Raw = read(file, "", value)?;
        refuse_unsupported(file, &raw)?;
        let d = raw.dflash_config.as_ref().ok_or_else(|| {
            err(file, "dflash_config", "is required: it is what makes a Qwen3 config a DFlash drafter's")
        })?;
        let need = |key: &str, v: Option<usize>| v.ok_or_else(|| err(file, key, "is required"));
        let hidden_size = need("hidden_size", raw.hidden_size)?;
        let num_hidden_layers = need("num_hidden_layers", raw.num_hidden_layers)?;
        let num_attention_heads = need("num_attention_heads", raw.num_attention_heads)?;
        let num_key_value_heads = raw.num_key_value_heads.unwrap_or(num_attention_heads);
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None => hidden_size.checked_div(num_attention_heads).unwrap_or(0),
        };
        let target_layer_ids = match (&d.target_layer_ids, raw.num_target_layers) {
            (Some(ids), _) => ids.clone(),
            (None, Some(n)) => default_target_layer_ids(n, num_hidden_layers),
            (None, None) => {
                return Err(err(file, "dflash_config.target_layer_ids", "is required (or num_target_layers)"));
            }
        };
        let block_size = match (raw.block_size, d.block_size) {
            (Some(a), Some(b)) if a != b => {
                let reason = format!("is {b}, but the root's block_size is {a}");
                return Err(err(file, "dflash_config.block_size", reason));
            }
            (a, b) => {
                a.or(b).ok_or_else(|| err(file, "block_size", "is required (at the root or in dflash_config)"))?
            }
        };
        let (rope_theta, rope_scaling) = rope(file, &raw)?;
        let config = DflashConfig {
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            intermediate_size: need("intermediate_size", raw.intermediate_size)?,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_scaling,
            target_layer_ids,
            block_size,
            mask_token_id: d.mask_token_id.ok_or_else(|| err(file, "dflash_config.mask_token_id", "is required"))?,
            input_embedding_scale: d.input_embedding_scale.unwrap_or(1.0),
            output_multiplier: d.output_multiplier.unwrap_or(1.0),
            final_logit_softcapping: d.final_logit_softcapping,
        };
        config.check(file, raw.vocab_size, target)?;
        Ok(config)
    }

    /// The reference's `build_target_layer_ids`: the target layers a drafter of `draft_layers` layers
    /// reads when its config lists none, for a target of `target_layers` layers.
    pub(crate) fn reference_layer_ids(target_layers: usize, draft_layers: usize) -> Vec<usize> {
        default_target_layer_ids(target_layers, draft_layers)
    }

    /// Width of a context row as the target hands it: one hidden state per listed layer.
    pub fn tap_width(&self) -> usize {
        self.target_layer_ids.len() * self.hidden_size
    }

    fn check(&self, file: &str, vocab_size: Option<usize>, target: &Config) -> Result<()> {
        let bad = |key: &str, reason: String| Err(err(file, key, reason));
        if self.hidden_size != target.hidden_size {
            let reason = format!(
                "is {}, the target's is {}: the drafter reads the target's embedding and LM head",
                self.hidden_size, target.hidden_size
            );
            return bad("hidden_size", reason);
        }
        if let Some(v) = vocab_size.filter(|&v| v != target.vocab_size) {
            return bad("vocab_size", format!("is {v}, the target's is {}", target.vocab_size));
        }
        if self.mask_token_id as usize >= target.vocab_size {
            let reason = format!("{} is outside the target's vocabulary of {}", self.mask_token_id, target.vocab_size);
            return bad("dflash_config.mask_token_id", reason);
        }
        if self.target_layer_ids.is_empty() {
            return bad("dflash_config.target_layer_ids", "is empty: the drafter needs the target's features".into());
        }
        if let Some(&id) = self.target_layer_ids.iter().find(|&&id| id >= target.num_hidden_layers) {
            let reason = format!("names layer {id}, the target has {} layers", target.num_hidden_layers);
            return bad("dflash_config.target_layer_ids", reason);
        }
        if self.block_size < 2 {
            return bad(
                "block_size",
                format!("is {}: a block holds the bonus token and at least one mask", self.block_size),
            );
        }
        for (key, v) in [
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("intermediate_size", self.intermediate_size),
        ] {
            if v == 0 {
                return bad(key, "is 0".into());
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            let reason = format!(
                "{} does not divide num_attention_heads {}",
                self.num_key_value_heads, self.num_attention_heads
            );
            return bad("num_key_value_heads", reason);
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("head_dim", format!("is {}: rotary embedding needs an even, positive width", self.head_dim));
        }
        let finite = [
            ("dflash_config.input_embedding_scale", self.input_embedding_scale),
            ("dflash_config.output_multiplier", self.output_multiplier),
            ("dflash_config.final_logit_softcapping", self.final_logit_softcapping.unwrap_or(1.0)),
        ];
        if let Some((key, v)) = finite.into_iter().find(|(_, v)| !v.is_finite()) {
            return bad(key, format!("is {v}"));
        }
        if self.final_logit_softcapping.is_some_and(|cap| cap <= 0.0) {
            return bad("dflash_config.final_logit_softcapping", "must be positive".into());
        }
        Ok(())
    }
}

/// What the reference's layers do not do, or what this engine does not do yet: refused by name.
fn refuse_unsupported(file: &str, raw: &Raw) -> Result<()> {
    if let Some(arch) = raw.architectures.iter().flatten().find(|a| a.as_str() != "DFlashDraftModel") {
        let reason = format!(
            "`{arch}` is not supported: only the first DFlash format (DFlashDraftModel) is; the second generation \
             (per-layer causal convolutions, a candidate selector) is not yet"
        );
        return Err(err(file, "architectures", reason));
    }
    if raw.attention_bias == Some(true) {
        return Err(err(file, "attention_bias", "true is not supported: DFlash drafters have no attention biases"));
    }
    if let Some(act) = raw.hidden_act.as_ref().filter(|a| a.as_str() != "silu") {
        return Err(err(file, "hidden_act", format!("`{act}` is not supported (silu is)")));
    }
    let sliding = raw.use_sliding_window == Some(true)
        || raw.layer_types.iter().flatten().any(|t| t.as_str() != "full_attention");
    if sliding {
        return Err(err(file, "layer_types", "sliding-window drafter layers are not supported yet"));
    }
    Ok(())
}

/// YaRN as transformers reads it for a Qwen3 drafter (`_compute_yarn_parameters`): the frequencies of
/// `crate::model::yarn_inv_freq`, cos and sin scaled by `attention_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftYarn {
    pub yarn: Yarn,
    /// The config's `attention_factor`; else `mscale(factor, mscale) / mscale(factor, mscale_all_dim)`
    /// where both are given and nonzero; else `mscale(factor, 1)`.
    pub attention_factor: f64,
}

/// `rope_theta` and the scaling, from `rope_parameters` or the root and `rope_scaling`: plain rope or
/// YaRN; other scalings are refused.
fn rope(file: &str, raw: &Raw) -> Result<(f64, Option<DraftYarn>)> {
    let (section, scaling) = match (&raw.rope_parameters, &raw.rope_scaling) {
        (Some(p), _) => ("rope_parameters", p),
        (None, Some(s)) if !s.is_null() => ("rope_scaling", s),
        _ => {
            let theta = raw.rope_theta.unwrap_or(10000.0);
            check_rope(file, "rope_theta", theta, "", None)?;
            return Ok((theta, None));
        }
    };
    let key = |k: &str| format!("{section}.{k}");
    let number = |k: &str| -> Result<Option<f64>> {
        match scaling.get(k) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| err(file, &key(k), format!("is {v}, not a number"))),
        }
    };
    let (theta_key, theta) = match number("rope_theta")? {
        Some(t) => (key("rope_theta"), t),
        None => ("rope_theta".to_owned(), raw.rope_theta.unwrap_or(10000.0)),
    };
    let kind_key = if scaling.get("rope_type").is_some() { "rope_type" } else { "type" };
    let yarn = match scaling.get(kind_key).and_then(|k| k.as_str()) {
        None | Some("default") => None,
        Some("yarn") => Some(draft_yarn(file, section, raw.max_position_embeddings, &number, scaling)?),
        Some(other) => {
            let reason = format!("`{other}` is not supported for a DFlash drafter (default and yarn are)");
            return Err(err(file, &key(kind_key), reason));
        }
    };
    check_rope(file, &theta_key, theta, section, yarn.as_ref().map(|y| &y.yarn))?;
    Ok((theta, yarn))
}

/// The YaRN section `section` (`scaling`, its numbers read by `number`) of a config that declares
/// `declared` positions.
fn draft_yarn(
    file: &str,
    section: &str,
    declared: Option<usize>,
    number: &dyn Fn(&str) -> Result<Option<f64>>,
    scaling: &serde_json::Value,
) -> Result<DraftYarn> {
    let key = |k: &str| format!("{section}.{k}");
    let factor = number("factor")?.ok_or_else(|| err(file, &key("factor"), "is required"))?;
    let original = match number("original_max_position_embeddings")? {
        Some(o) if o.fract() == 0.0 && o >= 1.0 => o as usize,
        Some(o) => return Err(err(file, &key("original_max_position_embeddings"), format!("is {o}"))),
        None => declared.ok_or_else(|| err(file, "max_position_embeddings", "is required with YaRN"))?,
    };
    // transformers before 5 takes the factor from the two lengths where both are given, 5 takes
    // `factor`: a config on which they disagree means two different ropes.
    if let Some(declared) = declared.filter(|_| scaling.get("original_max_position_embeddings").is_some()) {
        let implied = declared as f64 / original as f64;
        if (implied - factor).abs() > 1e-9 * factor {
            let reason = format!(
                "is {factor}, but max_position_embeddings / original_max_position_embeddings is {declared} / \
                 {original} = {implied}: transformers versions disagree on which one YaRN uses"
            );
            return Err(err(file, &key("factor"), reason));
        }
    }
    if scaling.get("truncate").is_some_and(|t| t != &serde_json::Value::Bool(true)) {
        return Err(err(file, &key("truncate"), "only true (the default) is supported"));
    }
    let (mscale, mscale_all_dim) = (number("mscale")?.unwrap_or(0.0), number("mscale_all_dim")?.unwrap_or(0.0));
    let yarn = Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: number("beta_fast")?.unwrap_or(32.0),
        beta_slow: number("beta_slow")?.unwrap_or(1.0),
        mscale,
        mscale_all_dim,
    };
    let attention_factor = match number("attention_factor")? {
        Some(a) if a.is_finite() && a > 0.0 => a,
        Some(a) => return Err(err(file, &key("attention_factor"), format!("is {a}, must be finite and > 0"))),
        None if mscale != 0.0 && mscale_all_dim != 0.0 => {
            yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        }
        None => yarn_mscale(factor, 1.0),
    };
    Ok(DraftYarn { yarn, attention_factor })
}

/// The reference's `build_target_layer_ids`: one layer in the middle, or layers spread evenly from the
/// second to the fourth-last, rounded as Python's `round` does (ties to even).
fn default_target_layer_ids(target_layers: usize, draft_layers: usize) -> Vec<usize> {
    if draft_layers <= 1 {
        return vec![target_layers / 2];
    }
    let (start, end) = (1.0, target_layers as f64 - 3.0);
    (0..draft_layers)
        .map(|i| (start + i as f64 * (end - start) / (draft_layers - 1) as f64).round_ties_even() as usize)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rope of a minimal drafter config (`max_position_embeddings` 262144) whose `rope_scaling` is
    /// `section`.
    fn yarn_of(section: serde_json::Value) -> Result<(f64, Option<DraftYarn>)> {
        let mut v = serde_json::json!({"max_position_embeddings": 262144, "rope_theta": 50000.0});
        v["rope_scaling"] = section;
        rope("config.json", &serde_json::from_value(v).unwrap())
    }

    #[test]
    fn yarn_is_read_as_transformers_reads_it_for_qwen3() {
        // Kimi-K2.5-DFlash's: factor 64 over 4096 positions, no mscale keys: cos and sin scaled by
        // mscale(64) = 0.1 ln 64 + 1.
        let k2_5 = serde_json::json!({"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096});
        let (theta, y) = yarn_of(k2_5).unwrap();
        let y = y.unwrap();
        let read = (theta, y.yarn.original_max_position_embeddings, y.yarn.beta_fast, y.yarn.beta_slow);
        assert_eq!(read, (50000.0, 4096, 32.0, 1.0));
        assert!((y.attention_factor - (0.1 * 64f64.ln() + 1.0)).abs() < 1e-12);
        // Both mscales given (DeepSeek's convention): their ratio; an explicit attention_factor wins.
        let both = serde_json::json!({"rope_type": "yarn", "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0});
        assert_eq!(yarn_of(both).unwrap().1.unwrap().attention_factor, 1.0);
        let explicit = serde_json::json!({"rope_type": "yarn", "factor": 64.0, "attention_factor": 0.5});
        assert_eq!(yarn_of(explicit).unwrap().1.unwrap().attention_factor, 0.5);
        // No original length: the declared one.
        let bare = yarn_of(serde_json::json!({"type": "yarn", "factor": 1.0})).unwrap().1.unwrap();
        assert_eq!((bare.yarn.original_max_position_embeddings, bare.attention_factor), (262144, 1.0));
        assert_eq!(yarn_of(serde_json::json!({"type": "default"})).unwrap().1, None);
    }

    #[test]
    fn yarn_that_transformers_versions_read_differently_is_refused_by_key() {
        let key = |section| match yarn_of(section).unwrap_err() {
            crate::EngineError::Config { key, .. } => key,
            e => panic!("{e}"),
        };
        // 262144 / 4096 = 64, not 32: transformers 4 would use 64, 5 would use 32.
        let ambiguous = serde_json::json!({"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096});
        assert_eq!(key(ambiguous), "rope_scaling.factor");
        assert_eq!(
            key(serde_json::json!({"type": "yarn", "factor": 64.0, "truncate": false})),
            "rope_scaling.truncate"
        );
        assert_eq!(key(serde_json::json!({"type": "yarn"})), "rope_scaling.factor");
        assert_eq!(key(serde_json::json!({"type": "yarn", "factor": 0.5})), "rope_scaling.factor");
        assert_eq!(key(serde_json::json!({"type": "linear", "factor": 2.0})), "rope_scaling.type");
        let negative = serde_json::json!({"type": "yarn", "factor": 2.0, "attention_factor": -1.0});
        assert_eq!(key(negative), "rope_scaling.attention_factor");
    }

    #[test]
    fn default_layer_ids_are_the_references() {
        // 36 target layers, 5 drafter layers: evenly from the second layer (1) to the fourth-last (33).
        assert_eq!(default_target_layer_ids(36, 5), [1, 9, 17, 25, 33]);
        assert_eq!(default_target_layer_ids(61, 1), [30]);
        // Kimi-K2.5-DFlash's: 6 drafter layers over K2.5's 61.
        assert_eq!(default_target_layer_ids(61, 6), [1, 12, 24, 35, 47, 58]);
        // 2.5 rounds to 2, as Python's round does.
        assert_eq!(default_target_layer_ids(7, 3), [1, 2, 4]);
    }
}
