//! The compressed-tensors `quantization_config` of a checkpoint: which linear modules are INT4.

use kdtree_quant::GROUP_SIZES;
use regex::Regex;
use serde_json::Value;

use super::json::{err, read};
use crate::error::{EngineError, Result};

/// Symmetric INT4 group quantization of the linear modules the ignore list leaves out.
#[derive(Clone, Debug)]
pub struct QuantConfig {
    pub group_size: usize,
    ignore: Vec<Pattern>,
}

/// A compressed-tensors module pattern: `re:<regex>` (Python `re.match`, so anchored at the start
/// only) or an exact module name.
#[derive(Clone, Debug)]
enum Pattern {
    Exact(String),
    Regex(Regex),
}

impl Pattern {
    fn parse(file: &str, text: &str) -> Result<Self> {
        match text.strip_prefix("re:") {
            Some(re) => Regex::new(&format!("^(?:{re})"))
                .map(Pattern::Regex)
                .map_err(|e| err(file, "quantization_config.ignore", format!("bad regex `{re}`: {e}"))),
            None => Ok(Pattern::Exact(text.to_owned())),
        }
    }

    fn matches(&self, module: &str) -> bool {
        match self {
            Pattern::Exact(name) => name == module,
            Pattern::Regex(re) => re.is_match(module),
        }
    }
}

const EXPECTED: &str = "supported is compressed-tensors pack-quantized, 4-bit symmetric int, group strategy";

/// Where `quantization_config` sits in config.json: its errors name keys under it.
const SECTION: &str = "quantization_config";

/// `quantization_config` as written (see [`super::json`]).
mod raw {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    /// What decides whether the rest is read at all.
    #[derive(Debug, Deserialize)]
    pub struct Method {
        pub quant_method: Option<String>,
        pub format: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    pub(crate) struct Quant {
        /// By name, in name order.
        pub config_groups: Option<BTreeMap<String, Group>>,
        pub ignore: Option<Vec<String>>,
    }

    #[derive(Debug, Deserialize)]
    pub(crate) struct Group {
        pub targets: Option<Vec<String>>,
        pub weights: Option<Weights>,
        /// A scheme here quantizes activations too (W4A8 and the like).
        pub input_activations: Option<serde_json::Value>,
        pub output_activations: Option<serde_json::Value>,
    }

    /// compressed-tensors' `QuantizationArgs`, the keys the engine reads.
    #[derive(Debug, Deserialize)]
    pub struct Weights {
        pub num_bits: Option<usize>,
        #[serde(rename = "type")]
        pub kind: Option<String>,
        pub symmetric: Option<bool>,
        pub strategy: Option<String>,
        pub group_size: Option<usize>,
        /// `group` (or `true`) reorders K by a per-column group index (`weight_g_idx`); `weight`
        /// (`static`) only ordered the quantizer's passes and stores plain groups.
        pub actorder: Option<serde_json::Value>,
        /// `true` or `local`: scales computed at run time, not stored.
        pub dynamic: Option<serde_json::Value>,
    }
}

impl QuantConfig {
    /// Parses `quantization_config` (`q`) of `file`; anything but compressed-tensors symmetric INT4
    /// groups is an error.
    pub(crate) fn parse(file: &str, q: &Value) -> Result<Self> {
        let unknown =
            |format: String| EngineError::UnknownQuantization { file: file.into(), format, expected: EXPECTED };
        let m: raw::Method = read(file, SECTION, q)?;
        let (method, format) = (m.quant_method.unwrap_or_default(), m.format.unwrap_or_default());
        if method == "fp8" {
            return Err(EngineError::Fp8Weights { file: file.into() });
        }
        if method != "compressed-tensors" || format != "pack-quantized" {
            return Err(unknown(format!("{method}/{format}")));
        }
        let q: raw::Quant = read(file, SECTION, q)?;
        let groups = q.config_groups.ok_or_else(|| err(file, &format!("{SECTION}.config_groups"), "is required"))?;
        let mut group_size = None;
        for (name, group) in groups {
            let key = format!("{SECTION}.config_groups.{name}");
            let targets = group.targets.unwrap_or_default();
            if targets != ["Linear"] {
                return Err(unknown(format!("{name} targets {targets:?} (only [\"Linear\"] is supported)")));
            }
            for (scheme, value) in
                [("input_activations", &group.input_activations), ("output_activations", &group.output_activations)]
            {
                if value.is_some() {
                    let reason = "quantizes activations, which changes the numerics: the engine computes W4A16 (only \
                                  weights quantized), so this key must be null";
                    return Err(err(file, &format!("{key}.{scheme}"), reason));
                }
            }
            let w = group.weights.ok_or_else(|| err(file, &key, "has no `weights` scheme"))?;
            check_static_groups(file, &format!("{key}.weights"), &w)?;
            // Unstated arguments take compressed-tensors' `QuantizationArgs` defaults.
            let bits = w.num_bits.unwrap_or(8);
            let kind = w.kind.as_deref().unwrap_or("int");
            let symmetric = w.symmetric.unwrap_or(true);
            let strategy = w.strategy.as_deref().unwrap_or("group");
            if bits != 4 || kind != "int" || !symmetric || strategy != "group" {
                return Err(unknown(format!("{bits}-bit {kind} symmetric={symmetric} strategy={strategy}")));
            }
            let key = format!("{key}.weights.group_size");
            let g = w.group_size.ok_or_else(|| err(file, &key, "is required"))?;
            if !GROUP_SIZES.contains(&g) {
                return Err(err(file, &key, format!("is {g}; supported are {GROUP_SIZES:?}")));
            }
            if group_size.is_some_and(|other| other != g) {
                return Err(unknown(format!("several group sizes ({g} and {})", group_size.unwrap_or(0))));
            }
            group_size = Some(g);
        }
        let group_size = group_size.ok_or_else(|| err(file, &format!("{SECTION}.config_groups"), "is empty"))?;
        let ignore = q.ignore.unwrap_or_default().iter().map(|p| Pattern::parse(file, p)).collect::<Result<_>>()?;
        Ok(Self { group_size, ignore })
    }

    /// Whether the linear module `module` (e.g. `model.layers.3.mlp.experts.7.up_proj`) is INT4.
    pub(crate) fn is_quantized(&self, module: &str) -> bool {
        !self.ignore.iter().any(|p| p.matches(module))
    }
}

/// Refuses the weight arguments that change what the stored groups mean: activation ordering by
/// group index, and scales computed at run time. `key` is the weights scheme's.
fn check_static_groups(file: &str, key: &str, w: &raw::Weights) -> Result<()> {
    use serde_json::Value::{Bool, Null, String};
    match &w.actorder {
        None | Some(Null | Bool(false)) => {}
        Some(String(order)) if order == "weight" || order == "static" => {}
        Some(other) => {
            let reason = format!(
                "is {other}: group activation ordering permutes K by a stored group index, which the engine's kernels \
                 do not read (null, false and \"weight\" are supported)"
            );
            return Err(err(file, &format!("{key}.actorder"), reason));
        }
    }
    match &w.dynamic {
        None | Some(Null | Bool(false)) => Ok(()),
        Some(other) => {
            let reason = format!(
                "is {other}: scales computed at run time change the numerics; the engine reads stored scales (false)"
            );
            Err(err(file, &format!("{key}.dynamic"), reason))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kimi_k2s_ignore_list_keeps_only_routed_experts_quantized() {
        let json = serde_json::json!({
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]
        });
        let q = QuantConfig::parse("config.json", &json).unwrap();
        assert_eq!(q.group_size, 32);
        assert!(q.is_quantized("model.layers.1.mlp.experts.7.up_proj"));
        assert!(!q.is_quantized("model.layers.1.mlp.shared_experts.up_proj"));
        assert!(!q.is_quantized("model.layers.0.mlp.down_proj"));
        assert!(!q.is_quantized("model.layers.1.self_attn.q_a_proj"));
        assert!(!q.is_quantized("lm_head"));
    }

    /// Kimi K2's scheme with `edit` applied to its group.
    fn k2_with(edit: impl FnOnce(&mut Value)) -> Value {
        let mut json = serde_json::json!({
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "output_activations": null,
                "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32,
                            "dynamic": false, "actorder": null}}}
        });
        edit(&mut json["config_groups"]["group_0"]);
        json
    }

    #[test]
    fn activation_quantization_group_actorder_and_dynamic_scales_are_refused_naming_the_key() {
        let key = "`quantization_config.config_groups.group_0";
        for (edit, says) in [
            (
                serde_json::json!({"input_activations": {"num_bits": 8, "type": "int", "dynamic": true}}),
                "input_activations`: quantizes activations",
            ),
            (serde_json::json!({"output_activations": {"num_bits": 8}}), "output_activations`: quantizes activations"),
            (serde_json::json!({"weights": {"actorder": "group"}}), "weights.actorder`: is \"group\""),
            (serde_json::json!({"weights": {"actorder": true}}), "weights.actorder`: is true"),
            (serde_json::json!({"weights": {"dynamic": true}}), "weights.dynamic`: is true"),
            (serde_json::json!({"weights": {"dynamic": "local"}}), "weights.dynamic`: is \"local\""),
        ] {
            let json = k2_with(|g| {
                for (k, v) in edit.as_object().unwrap() {
                    match v.as_object() {
                        Some(fields) if k == "weights" => fields.iter().for_each(|(f, x)| g["weights"][f] = x.clone()),
                        _ => g[k] = v.clone(),
                    }
                }
            });
            let m = QuantConfig::parse("config.json", &json).unwrap_err().to_string();
            assert!(m.contains(&format!("{key}.{says}")), "{edit}: {m}");
        }
        // What only ordered the quantizer's passes stores plain groups.
        for order in ["weight", "static"] {
            let json = k2_with(|g| g["weights"]["actorder"] = order.into());
            assert_eq!(QuantConfig::parse("config.json", &json).unwrap().group_size, 32);
        }
    }

    #[test]
    fn an_unsupported_group_size_is_refused_naming_the_key() {
        for g in [0, 7, 256] {
            let json = serde_json::json!({
                "quant_method": "compressed-tensors", "format": "pack-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": g}}}
            });
            let e = QuantConfig::parse("config.json", &json).unwrap_err();
            let m = e.to_string();
            assert!(m.contains("config.json") && m.contains(&format!("is {g};")), "{m}");
            assert!(m.contains("`quantization_config.config_groups.group_0.weights.group_size`"), "{m}");
        }
    }

    #[test]
    fn other_formats_are_named_in_the_error() {
        let json = serde_json::json!({"quant_method": "gptq", "bits": 4});
        let e = QuantConfig::parse("config.json", &json).unwrap_err();
        assert!(matches!(&e, EngineError::UnknownQuantization { format, .. } if format.contains("gptq")), "{e}");
    }

    #[test]
    fn deepseek_v3s_fp8_blocks_are_refused_as_not_supported_yet() {
        // DeepSeek-V3's own quantization_config.
        let json = serde_json::json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]});
        let e = QuantConfig::parse("config.json", &json).unwrap_err();
        assert!(matches!(&e, EngineError::Fp8Weights { file } if file == "config.json"), "{e}");
        assert!(e.to_string().contains("FP8 weights") && e.to_string().contains("not supported yet"), "{e}");
    }
}
