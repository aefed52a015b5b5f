//! The compressed-tensors `quantization_config` of a checkpoint: which linear modules are INT4.

use kdtree_quant::GROUP_SIZES;
use regex::Regex;

use super::json::{Obj, err};
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

impl QuantConfig {
    /// Parses `quantization_config`; anything but compressed-tensors symmetric INT4 groups is an error.
    pub(crate) fn parse(q: &Obj<'_>) -> Result<Self> {
        let unknown =
            |format: String| EngineError::UnknownQuantization { file: q.file.into(), format, expected: EXPECTED };
        let method = q.str_or("quant_method", "")?;
        let format = q.str_or("format", "")?;
        if method != "compressed-tensors" || format != "pack-quantized" {
            return Err(unknown(format!("{method}/{format}")));
        }
        let groups =
            q.obj("config_groups")?.ok_or_else(|| err(q.file, "quantization_config.config_groups", "is required"))?;
        let mut group_size = None;
        for (name, group) in groups.map {
            let group = Obj::new(q.file, group, name)?;
            let targets = group.strings("targets")?;
            if targets != ["Linear"] {
                return Err(unknown(format!("{name} targets {targets:?} (only [\"Linear\"] is supported)")));
            }
            let w = group.obj("weights")?.ok_or_else(|| err(q.file, name, "has no `weights` scheme"))?;
            // Unstated arguments take compressed-tensors' `QuantizationArgs` defaults.
            let (bits, kind, symmetric) =
                (w.usize_or("num_bits", 8)?, w.str_or("type", "int")?, w.bool_or("symmetric", true)?);
            let strategy = w.str_or("strategy", "group")?;
            if bits != 4 || kind != "int" || !symmetric || strategy != "group" {
                return Err(unknown(format!("{bits}-bit {kind} symmetric={symmetric} strategy={strategy}")));
            }
            let g = w.usize("group_size")?;
            if !GROUP_SIZES.contains(&g) {
                let key = format!("quantization_config.config_groups.{name}.weights.group_size");
                return Err(err(q.file, &key, format!("is {g}; supported are {GROUP_SIZES:?}")));
            }
            if group_size.is_some_and(|other| other != g) {
                return Err(unknown(format!("several group sizes ({g} and {})", group_size.unwrap_or(0))));
            }
            group_size = Some(g);
        }
        let group_size = group_size.ok_or_else(|| err(q.file, "quantization_config.config_groups", "is empty"))?;
        let ignore = q.strings("ignore")?.iter().map(|p| Pattern::parse(q.file, p)).collect::<Result<_>>()?;
        Ok(Self { group_size, ignore })
    }

    /// Whether the linear module `module` (e.g. `model.layers.3.mlp.experts.7.up_proj`) is INT4.
    pub fn is_quantized(&self, module: &str) -> bool {
        !self.ignore.iter().any(|p| p.matches(module))
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
        let q = QuantConfig::parse(&Obj::new("config.json", &json, "quantization_config").unwrap()).unwrap();
        assert_eq!(q.group_size, 32);
        assert!(q.is_quantized("model.layers.1.mlp.experts.7.up_proj"));
        assert!(!q.is_quantized("model.layers.1.mlp.shared_experts.up_proj"));
        assert!(!q.is_quantized("model.layers.0.mlp.down_proj"));
        assert!(!q.is_quantized("model.layers.1.self_attn.q_a_proj"));
        assert!(!q.is_quantized("lm_head"));
    }

    #[test]
    fn an_unsupported_group_size_is_refused_naming_the_key() {
        for g in [0, 7, 256] {
            let json = serde_json::json!({
                "quant_method": "compressed-tensors", "format": "pack-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": g}}}
            });
            let e = QuantConfig::parse(&Obj::new("config.json", &json, "quantization_config").unwrap()).unwrap_err();
            let m = e.to_string();
            assert!(m.contains("config.json") && m.contains(&format!("is {g};")), "{m}");
            assert!(m.contains("`quantization_config.config_groups.group_0.weights.group_size`"), "{m}");
        }
    }

    #[test]
    fn other_formats_are_named_in_the_error() {
        let json = serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
        let e = QuantConfig::parse(&Obj::new("config.json", &json, "quantization_config").unwrap()).unwrap_err();
        assert!(matches!(&e, EngineError::UnknownQuantization { format, .. } if format.contains("fp8")), "{e}");
    }
}
