//! What a config.json may hold. Every value the model sizes a buffer by or computes with is checked
//! when the file is read, so that a typo is an error naming the key, its value and the limit, not an
//! allocation failure, an overflow panic or a model that emits token 0 forever.
//!
//! | keys | allowed | why |
//! |---|---|---|
//! | dimensions and counts (`hidden_size`, `vocab_size`, head dims, ranks, experts, layers) | 1 (0 where none is meaningful) ..= 2^20 | the largest of any DeepSeek-V3-family model is Kimi K2's vocabulary, 163840; 2^20 keeps a product of three of them within 64 bits |
//! | `max_position_embeddings`, YaRN's `original_max_position_embeddings` | 1 ..= 2^24 | the longest contexts published are about 10M (2^23.3) positions |
//! | `rope_theta` | finite, > 1 | the base of the rotary frequencies θ^(-2i/d): at 1 they are all 1 and YaRN's correction range divides by ln θ = 0; below 1 they rise instead of fall |
//! | `rms_norm_eps` | finite, in (0, 1) as an f32 | a stabiliser added to a mean square: 0 divides zero rows by zero, ≥ 1 drowns the activations |
//! | `routed_scaling_factor` | finite, in (0, 1000] | multiplies the routed experts' sum: DeepSeek-V3 2.5, Kimi K2 2.827, DeepSeek-V2 16; 1000 is a typo's margin |
//! | YaRN `factor` | finite, ≥ 1 | the context extension ratio: DeepSeek's `precompute_freqs_cis` divides the slow frequencies by it and its mscale takes ln(factor); transformers' `_validate_yarn_parameters` asks ≥ 1 too |
//! | YaRN `beta_fast`, `beta_slow` | finite, > 0 | rotation counts inside ln(L / (2π β)) |
//! | YaRN `mscale`, `mscale_all_dim` | finite, ≥ 0 | coefficients m of the attention temperature 0.1 m ln(factor) + 1, which must stay ≥ 1 |
//!
//! The rotary table is built for at most [`Config::MAX_ROTARY_POSITIONS`] positions whatever
//! `max_position_embeddings` says ([`Config::context_len`]): a run needs no more than its prompt and
//! new tokens, and the table costs 256 bytes a position for a 64-wide rotary head.

use super::{Config, Yarn};
use crate::error::{EngineError, Result};
use crate::model::json::err;

impl Config {
    /// The most any dimension or count may be.
    pub(crate) const MAX_DIM: usize = 1 << 20;
    /// The most `max_position_embeddings` (and YaRN's original context) may be.
    pub(crate) const MAX_POSITIONS: usize = 1 << 24;
    /// The most positions the rotary table holds: Kimi K2's whole context (DeepSeek-V3's is 163840).
    pub(crate) const MAX_ROTARY_POSITIONS: usize = 1 << 18;
    /// The largest `routed_scaling_factor` accepted.
    pub(crate) const MAX_ROUTED_SCALING: f64 = 1e3;

    /// The positions a run may use: `max_position_embeddings`, at most `Self::MAX_ROTARY_POSITIONS`.
    pub fn context_len(&self) -> usize {
        self.max_position_embeddings.min(Self::MAX_ROTARY_POSITIONS)
    }

    /// Whether `prompt` tokens followed by `max_new` generated ones fit the context: the last new
    /// token is never fed back, so positions `0..prompt + max_new - 1` are used.
    pub fn check_context(&self, prompt: usize, max_new: usize) -> Result<()> {
        let context = self.context_len();
        let needed = prompt.checked_add(max_new.saturating_sub(1));
        if needed.is_some_and(|n| n <= context) {
            return Ok(());
        }
        let mut limit = format!("`max_position_embeddings` in config.json is {}", self.max_position_embeddings);
        if context < self.max_position_embeddings {
            limit += &format!(", and the engine's rotary table holds at most {context} positions");
        }
        Err(EngineError::ContextExceeded { prompt, max_new, context, limit })
    }

    /// Checks that a checkpoint holding the tensors `names` has no decoder layer beyond the config's
    /// `num_hidden_layers` (plus `num_nextn_predict_layers`, DeepSeek-V3's multi-token-prediction
    /// layer, which the engine does not run): such layers would silently be ignored. `config_file`
    /// names config.json in the error.
    pub(crate) fn check_checkpoint_layers<'a>(
        &self,
        config_file: &str,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<()> {
        let allowed = self.num_hidden_layers + self.num_nextn_predict_layers;
        // A layer number too long for u64 is certainly beyond the config's.
        let beyond = names
            .into_iter()
            .filter_map(|name| name.strip_prefix("model.layers.")?.split('.').next())
            .filter(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
            .map(|index| index.parse::<u64>().unwrap_or(u64::MAX))
            .filter(|&index| index >= allowed as u64)
            .max();
        let Some(index) = beyond else { return Ok(()) };
        let mut reason = format!("is {}", self.num_hidden_layers);
        if self.num_nextn_predict_layers > 0 {
            reason += &format!(" (and num_nextn_predict_layers {})", self.num_nextn_predict_layers);
        }
        reason += &format!(
            ", but the checkpoint holds layer {index} (model.layers.{index}.*): layers beyond the config's would be \
             ignored"
        );
        Err(err(config_file, "num_hidden_layers", reason))
    }

    /// Checks that a checkpoint holding the tensors `names` has no shared experts in the layers the
    /// engine runs when the config's `n_shared_experts` is 0: left unread, they would silently drop
    /// a term of every MoE layer's output. `config_file` names config.json in the error.
    pub(crate) fn check_checkpoint_shared_experts<'a>(
        &self,
        config_file: &str,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<()> {
        if self.n_shared_experts > 0 {
            return Ok(());
        }
        // The first by name, so that the error is the same whatever the order of `names`.
        let held = names.into_iter().filter(|name| {
            let Some((layer, rest)) = name.strip_prefix("model.layers.").and_then(|n| n.split_once('.')) else {
                return false;
            };
            rest.starts_with("mlp.shared_experts.") && layer.parse::<usize>().is_ok_and(|i| i < self.num_hidden_layers)
        });
        let held = held.min();
        let Some(name) = held else { return Ok(()) };
        let reason = format!("is 0, but the checkpoint holds {name}: the shared experts would be ignored");
        Err(err(config_file, "n_shared_experts", reason))
    }

    /// The value checks of everything but the rotary keys (which [`check_rope`] does as they are read).
    pub(super) fn check(&self, file: &str) -> Result<()> {
        let mut dims = vec![
            ("vocab_size", self.vocab_size, 1),
            ("hidden_size", self.hidden_size, 1),
            ("intermediate_size", self.intermediate_size, 1),
            ("moe_intermediate_size", self.moe_intermediate_size, 1),
            ("num_hidden_layers", self.num_hidden_layers, 1),
            ("num_attention_heads", self.num_attention_heads, 1),
            ("kv_lora_rank", self.kv_lora_rank, 1),
            ("qk_nope_head_dim", self.qk_nope_head_dim, 0),
            ("qk_rope_head_dim", self.qk_rope_head_dim, 2),
            ("v_head_dim", self.v_head_dim, 1),
            ("first_k_dense_replace", self.first_k_dense_replace, 0),
            ("moe_layer_freq", self.moe_layer_freq, 1),
            ("n_routed_experts", self.n_routed_experts, 0),
            ("num_experts_per_tok", self.num_experts_per_tok, 0),
            ("n_shared_experts", self.n_shared_experts, 0),
            ("n_group", self.n_group, 0),
            ("topk_group", self.topk_group, 0),
            ("num_nextn_predict_layers", self.num_nextn_predict_layers, 0),
        ];
        if let Some(rank) = self.q_lora_rank {
            dims.push(("q_lora_rank", rank, 1));
        }
        for (key, value, min) in dims {
            in_range(file, key, value, min, Self::MAX_DIM)?;
        }
        in_range(file, "max_position_embeddings", self.max_position_embeddings, 1, Self::MAX_POSITIONS)?;
        let eps = self.rms_norm_eps;
        if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
            let reason = format!("is {} (as an f32), must be finite and in (0, 1)", number(eps.into()));
            return Err(err(file, "rms_norm_eps", reason));
        }
        let scaling = self.routed_scaling_factor;
        if !(scaling.is_finite() && scaling > 0.0 && f64::from(scaling) <= Self::MAX_ROUTED_SCALING) {
            let (value, max) = (number(scaling.into()), number(Self::MAX_ROUTED_SCALING));
            return Err(err(file, "routed_scaling_factor", format!("is {value}, must be finite and in (0, {max}]")));
        }
        self.check_routing(file)
    }

    /// The router's group arithmetic.
    fn check_routing(&self, file: &str) -> Result<()> {
        let moe = self.n_routed_experts > 0;
        let bad = |key: &str, reason: &str| Err(err(file, key, reason));
        if !self.qk_rope_head_dim.is_multiple_of(2) {
            return bad("qk_rope_head_dim", "must be even");
        }
        if moe && (self.n_group == 0 || !self.n_routed_experts.is_multiple_of(self.n_group)) {
            return bad("n_group", "must divide n_routed_experts");
        }
        if moe && (self.topk_group == 0 || self.topk_group > self.n_group) {
            return bad("topk_group", "must be in 1..=n_group");
        }
        let eligible = self.topk_group * self.n_routed_experts / self.n_group.max(1);
        if moe && (self.num_experts_per_tok == 0 || self.num_experts_per_tok > eligible) {
            // Names every key the bound comes from: an edit of any of them can break it.
            let (k, experts, groups, topk) =
                (self.num_experts_per_tok, self.n_routed_experts, self.n_group, self.topk_group);
            let reason = format!(
                "is {k}, must be in 1..={eligible}: the experts in topk_group ({topk}) of the n_group ({groups}) groups \
                 of n_routed_experts ({experts})"
            );
            return Err(err(file, "num_experts_per_tok", reason));
        }
        Ok(())
    }
}

/// `rope_theta` (under `theta_key`) and the YaRN parameters of the section `section`
/// (`rope_scaling` or `rope_parameters`).
pub(crate) fn check_rope(file: &str, theta_key: &str, theta: f64, section: &str, yarn: Option<&Yarn>) -> Result<()> {
    if !(theta.is_finite() && theta > 1.0) {
        return Err(err(file, theta_key, format!("is {}, must be finite and > 1", number(theta))));
    }
    let Some(y) = yarn else { return Ok(()) };
    let key = |name: &str| format!("{section}.{name}");
    let finite = |name: &str, value: f64, ok: bool, limit: &str| match value.is_finite() && ok {
        true => Ok(()),
        false => Err(err(file, &key(name), format!("is {}, must be finite and {limit}", number(value)))),
    };
    finite("factor", y.factor, y.factor >= 1.0, ">= 1")?;
    finite("beta_fast", y.beta_fast, y.beta_fast > 0.0, "> 0")?;
    finite("beta_slow", y.beta_slow, y.beta_slow > 0.0, "> 0")?;
    finite("mscale", y.mscale, y.mscale >= 0.0, ">= 0")?;
    finite("mscale_all_dim", y.mscale_all_dim, y.mscale_all_dim >= 0.0, ">= 0")?;
    let original = y.original_max_position_embeddings;
    in_range(file, &key("original_max_position_embeddings"), original, 1, Config::MAX_POSITIONS)
}

fn in_range(file: &str, key: &str, value: usize, min: usize, max: usize) -> Result<()> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(err(file, key, format!("is {value}, must be in {min}..={max}")))
    }
}

/// A number as a person reads it: plain when moderate, with an exponent when huge or tiny.
fn number(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-4..1e6).contains(&x.abs()) { format!("{x:e}") } else { format!("{x}") }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn base() -> Value {
        json!({"model_type": "kimi_k2", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4, "q_lora_rank": null, "n_routed_experts": 8,
               "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2, "max_position_embeddings": 512,
               "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 128,
                                "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}})
    }

    /// The error message of `base()` with `edit` applied.
    fn refused(edit: impl FnOnce(&mut Value)) -> String {
        let mut v = base();
        edit(&mut v);
        match Config::parse("config.json", &v) {
            Ok(_) => panic!("accepted {v}"),
            Err(e) => e.to_string(),
        }
    }

    fn assert_names(message: &str, parts: &[&str]) {
        assert!(parts.iter().all(|p| message.contains(p)), "{message} should name {parts:?}");
    }

    #[test]
    fn meaningless_rotary_values_are_refused_naming_key_value_and_limit() {
        assert!(Config::parse("config.json", &base()).is_ok());
        for (theta, shown) in [(json!(0.0), "is 0,"), (json!(-5.0), "is -5,"), (json!(1.0), "is 1,")] {
            let m = refused(|v| v["rope_theta"] = theta);
            assert_names(&m, &["config.json", "`rope_theta`", shown, "> 1"]);
        }
        let cases = [
            ("factor", json!(0.0), ">= 1"),
            ("factor", json!(-2.0), ">= 1"),
            ("factor", json!(0.5), ">= 1"),
            ("beta_fast", json!(0.0), "> 0"),
            ("beta_slow", json!(-1.0), "> 0"),
            ("mscale", json!(-1.0), ">= 0"),
            ("mscale_all_dim", json!(-0.5), ">= 0"),
        ];
        for (key, value, limit) in cases {
            let m = refused(|v| v["rope_scaling"][key] = value.clone());
            assert_names(&m, &[&format!("`rope_scaling.{key}`"), limit]);
        }
        let m = refused(|v| v["rope_scaling"]["original_max_position_embeddings"] = json!(0));
        assert_names(&m, &["`rope_scaling.original_max_position_embeddings`", "is 0", "1..="]);
        // Under transformers 5's rope_parameters the key is named there.
        let m = refused(|v| {
            v.as_object_mut().unwrap().remove("rope_scaling");
            v["rope_parameters"] = json!({"rope_type": "yarn", "rope_theta": 0.5, "factor": 4.0});
        });
        assert_names(&m, &["`rope_parameters.rope_theta`", "is 0.5"]);
    }

    #[test]
    fn norm_epsilon_and_routed_scaling_must_be_physical() {
        for eps in [json!(0.0), json!(-1.0), json!(1.0), json!(1e-50)] {
            let m = refused(|v| v["rms_norm_eps"] = eps.clone());
            assert_names(&m, &["`rms_norm_eps`", "(0, 1)"]);
        }
        for scale in [json!(0.0), json!(-2.5), json!(1e39), json!(1001.0)] {
            let m = refused(|v| v["routed_scaling_factor"] = scale.clone());
            assert_names(&m, &["`routed_scaling_factor`", "(0, 1000]"]);
        }
        assert!(refused(|v| v["routed_scaling_factor"] = json!(1e39)).contains("inf"), "1e39 overflows an f32");
    }

    #[test]
    fn sizes_are_bounded_before_anything_is_allocated_from_them() {
        for huge in [1u64 << 26, 1 << 40, 1 << 62, u64::MAX] {
            let m = refused(|v| v["max_position_embeddings"] = json!(huge));
            assert_names(&m, &["`max_position_embeddings`", &format!("is {huge}"), "1..=16777216"]);
        }
        assert_names(&refused(|v| v["max_position_embeddings"] = json!(0)), &["is 0"]);
        for key in ["vocab_size", "hidden_size", "num_attention_heads", "kv_lora_rank", "n_routed_experts"] {
            let m = refused(|v| v[key] = json!(u64::MAX));
            assert_names(&m, &[&format!("`{key}`"), "..=1048576"]);
        }
        assert_names(&refused(|v| v["hidden_size"] = json!(0)), &["`hidden_size`", "is 0", "1..="]);
        assert_names(&refused(|v| v["q_lora_rank"] = json!(0)), &["`q_lora_rank`", "is 0"]);
    }

    #[test]
    fn the_rotary_table_and_the_context_are_capped() {
        let mut v = base();
        v["max_position_embeddings"] = json!(1 << 24);
        let c = Config::parse("config.json", &v).unwrap();
        assert_eq!(c.context_len(), Config::MAX_ROTARY_POSITIONS);
        let e = c.check_context(3, Config::MAX_ROTARY_POSITIONS).unwrap_err().to_string();
        assert_names(&e, &["max_position_embeddings", "16777216", "at most 262144"]);

        let c = Config::parse("config.json", &base()).unwrap();
        // The last new token is never fed back: 3 + 510 tokens use positions 0..512.
        assert!(c.check_context(3, 510).is_ok() && c.check_context(512, 1).is_ok());
        let e = c.check_context(3, 511).unwrap_err().to_string();
        assert_names(&e, &["3 prompt tokens", "511 new", "512 positions", "`max_position_embeddings` in config.json"]);
        assert!(c.check_context(3, usize::MAX).is_err() && c.check_context(usize::MAX, 2).is_err());
    }

    #[test]
    fn layers_beyond_the_config_are_an_error_naming_num_hidden_layers() {
        let c = Config::parse("config.json", &base()).unwrap();
        let names = ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.1.x", "lm_head"];
        assert!(c.check_checkpoint_layers("config.json", names).is_ok());
        let e =
            c.check_checkpoint_layers("m/config.json", ["model.layers.1.a", "model.layers.3.b", "model.layers.2.c"]);
        let m = e.unwrap_err().to_string();
        assert_names(&m, &["m/config.json", "`num_hidden_layers`", "is 2", "layer 3"]);
        let huge = "model.layers.99999999999999999999999.x";
        assert!(c.check_checkpoint_layers("config.json", [huge]).is_err());
        // Not a layer number: not a layer.
        assert!(c.check_checkpoint_layers("config.json", ["model.layers.x.y", "model.layers..z"]).is_ok());
        // DeepSeek-V3 ships its multi-token-prediction layer as model.layers.{num_hidden_layers}.
        let mut v = base();
        v["num_nextn_predict_layers"] = json!(1);
        let c = Config::parse("config.json", &v).unwrap();
        assert!(c.check_checkpoint_layers("config.json", ["model.layers.2.eh_proj.weight"]).is_ok());
        assert!(c.check_checkpoint_layers("config.json", ["model.layers.3.eh_proj.weight"]).is_err());
    }
}
