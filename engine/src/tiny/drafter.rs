//! Random DFlash drafter folders for a given target, in the published layout: `config.json` (a Qwen3
//! config with `dflash_config`) and `layers.N.*`, `fc`, `hidden_norm`, `norm` in bf16 safetensors.
//! [`DrafterSpec::k2_5`] has the dimensions of the published Kimi-K2.5 drafter, for timing a round
//! at its real size; smaller ones are for tests.
//!
//! The drafter is checked by the engine's own loader ([`DflashConfig::parse`]) against the target
//! before anything is written, and its tensors are written as [`super::write_model`] writes a
//! model's: from the seed's stream, straight into the shards, all or nothing.

use std::path::Path;

use serde_json::json;

use super::plan::{Builder, Unit};
use super::{Sharding, Summary};
use crate::error::{EngineError, Result};
use crate::model::Config;
use crate::spec::DflashConfig;

/// The sizes and seed of a generated DFlash drafter. The hidden size and the vocabulary are the
/// target's (the drafter reads its embedding and LM head), so they are not here.
#[derive(Clone, Debug, PartialEq)]
pub struct DrafterSpec {
    pub seed: u64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    /// Positions a round drafts, the bonus token included.
    pub block_size: usize,
    /// `None`: the id Kimi-K2.5-DFlash uses, or the target's last id when its vocabulary is smaller.
    pub mask_token_id: Option<u32>,
    /// `None`: the reference's `build_target_layer_ids` for the target's layer count, clamped into it.
    pub target_layer_ids: Option<Vec<usize>>,
    pub rope_theta: f64,
    /// YaRN rope scaling as Qwen3 configs state it; `None`: plain rope over the target's context.
    pub yarn: Option<DrafterYarn>,
    pub sharding: Sharding,
}

/// A drafter's YaRN: `factor` over `original_max_position_embeddings`, so that its config's
/// `max_position_embeddings` is their product (the loader refuses a config whose lengths disagree
/// with its factor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DrafterYarn {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
}

/// Kimi-K2.5-DFlash's mask token id (a reserved id of K2's 163840-token vocabulary).
pub(crate) const K2_5_MASK_TOKEN_ID: u32 = 163_838;

impl DrafterSpec {
    /// The most bytes of tensors a spec may make: a hundred times Kimi-K2.5-DFlash's 7 GB.
    pub(crate) const MAX_BYTES: u64 = 1 << 40;

    /// The published Kimi-K2.5 DFlash drafter (`z-lab/Kimi-K2.5-DFlash`): 6 Qwen3 layers of 64 query
    /// and 8 key/value heads of 128, SwiGLU of 18432, block size 8, rope theta 50000, reading 6 target
    /// layers (`[1, 12, 24, 35, 47, 58]` of K2's 61), rope scaled by YaRN (factor 64 over 4096
    /// positions: 262144); 3.48 G parameters, 6.96 GB in bf16 beside a hidden size of 7168.
    pub fn k2_5() -> DrafterSpec {
        DrafterSpec {
            seed: 0,
            num_hidden_layers: 6,
            num_attention_heads: 64,
            num_key_value_heads: 8,
            head_dim: 128,
            intermediate_size: 18_432,
            block_size: 8,
            mask_token_id: None,
            target_layer_ids: None,
            rope_theta: 50_000.0,
            yarn: Some(DrafterYarn { factor: 64.0, original_max_position_embeddings: 4096 }),
            sharding: Sharding::MaxBytes(super::DEFAULT_SHARD_BYTES),
        }
    }

    /// The target layers the drafter reads, for `target`.
    pub fn layer_ids(&self, target: &Config) -> Vec<usize> {
        self.target_layer_ids.clone().unwrap_or_else(|| {
            let last = target.num_hidden_layers.saturating_sub(1);
            DflashConfig::reference_layer_ids(target.num_hidden_layers, self.num_hidden_layers)
                .into_iter()
                .map(|id| id.min(last))
                .collect()
        })
    }

    /// The mask token id, for `target`.
    pub fn mask_token(&self, target: &Config) -> u32 {
        self.mask_token_id.unwrap_or_else(|| {
            let last = target.vocab_size.saturating_sub(1).min(u32::MAX as usize) as u32;
            K2_5_MASK_TOKEN_ID.min(last)
        })
    }

    /// config.json of the drafter for `target`, as the reference's Qwen3 config saves it.
    pub fn config_json(&self, target: &Config) -> serde_json::Value {
        let (rope_scaling, max_positions) = match self.yarn {
            None => (serde_json::Value::Null, target.max_position_embeddings),
            Some(y) => (
                json!({"type": "yarn", "factor": y.factor,
                       "original_max_position_embeddings": y.original_max_position_embeddings}),
                (y.factor * y.original_max_position_embeddings as f64).round() as usize,
            ),
        };
        json!({
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "attention_bias": false,
            "rms_norm_eps": 1e-6,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "max_position_embeddings": max_positions,
            "use_sliding_window": false,
            "layer_types": vec!["full_attention"; self.num_hidden_layers],
            "tie_word_embeddings": false,
            "dtype": "bfloat16",
            "block_size": self.block_size,
            "num_target_layers": target.num_hidden_layers,
            "dflash_config": {"target_layer_ids": self.layer_ids(target), "mask_token_id": self.mask_token(target)},
        })
    }

    /// Refuses a drafter the engine could not load for `target`, before anything is planned: the
    /// config goes through the engine's own drafter parser and its checks against the target, and
    /// the bytes are bounded.
    pub fn check(&self, target: &Config) -> Result<DflashConfig> {
        let config = DflashConfig::parse("config.json (of the drafter spec)", &self.config_json(target), target)?;
        let bytes = self.tensor_bytes(target);
        if bytes.is_none_or(|b| b > Self::MAX_BYTES) {
            return Err(EngineError::SpecTooLarge {
                spec: "drafter spec",
                sizes: format!(
                    "{} layers of {} heads x {} and an MLP of {}",
                    self.num_hidden_layers, self.num_attention_heads, self.head_dim, self.intermediate_size
                ),
                max: Self::MAX_BYTES,
                unit: "bytes of weights",
                real: "Kimi-K2.5-DFlash has 7 GB",
                remedy: "fewer layers or smaller ones",
            });
        }
        Ok(config)
    }

    /// Bytes of the bf16 tensors, counted without planning them (`None` beyond `u64`).
    fn tensor_bytes(&self, target: &Config) -> Option<u64> {
        let h = target.hidden_size as u64;
        let hd = self.head_dim as u64;
        let q = (self.num_attention_heads as u64).checked_mul(hd)?;
        let kv = (self.num_key_value_heads as u64).checked_mul(hd)?;
        // q, k, v and o; gate, up and down; four norms.
        let attention = h.checked_mul(q.checked_mul(2)?.checked_add(kv.checked_mul(2)?)?)?;
        let mlp = h.checked_mul(self.intermediate_size as u64)?.checked_mul(3)?;
        let norms = h.checked_mul(2)?.checked_add(hd.checked_mul(2)?)?;
        let layer = attention.checked_add(mlp)?.checked_add(norms)?;
        let taps = (self.layer_ids(target).len() as u64).checked_mul(h)?;
        let fc = h.checked_mul(taps)?;
        let params = layer.checked_mul(self.num_hidden_layers as u64)?.checked_add(fc)?.checked_add(2 * h)?;
        params.checked_mul(2)
    }

    /// Every tensor, in the order its values are drawn.
    fn units(&self, target: &Config) -> Vec<Unit> {
        let mut b = Builder::new(false);
        let h = target.hidden_size;
        let (q, kv) = (self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim);
        b.linear("fc", h, self.layer_ids(target).len() * h, false);
        b.norm("hidden_norm.weight", h);
        for i in 0..self.num_hidden_layers {
            let p = format!("layers.{i}");
            b.norm(&format!("{p}.input_layernorm.weight"), h);
            for (name, n, k) in [("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h), ("o_proj", h, q)] {
                b.linear(&format!("{p}.self_attn.{name}"), n, k, false);
            }
            b.norm(&format!("{p}.self_attn.q_norm.weight"), self.head_dim);
            b.norm(&format!("{p}.self_attn.k_norm.weight"), self.head_dim);
            b.norm(&format!("{p}.post_attention_layernorm.weight"), h);
            b.mlp(&format!("{p}.mlp"), h, self.intermediate_size, false);
        }
        b.norm("norm.weight", h);
        b.into_units()
    }

    /// What [`write_drafter`] writes for `target`, without writing it.
    pub fn summary(&self, target: &Config) -> Result<Summary> {
        self.check(target)?;
        let units = self.units(target);
        Ok(Summary::of(&units, &super::shards(&units, self.sharding)?))
    }
}

/// Writes the drafter `spec` describes for `target` into `dir`, all or nothing as
/// [`super::write_model`] does; `progress` hears of the bytes of each piece written.
pub fn write_drafter(
    dir: &Path,
    spec: &DrafterSpec,
    target: &Config,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Summary> {
    spec.check(target)?;
    super::write_folder(dir, &spec.config_json(target), &spec.units(target), spec.sharding, spec.seed, progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiny::TinySpec;

    fn k2(layers: usize) -> Config {
        Config::parse("config.json", &TinySpec::k2_slice(layers, 8).config_json()).unwrap()
    }

    #[test]
    fn k2_5_has_the_published_sizes() {
        let spec = DrafterSpec::k2_5();
        let target = k2(61);
        assert_eq!(spec.layer_ids(&target), [1, 12, 24, 35, 47, 58]);
        assert_eq!(spec.mask_token(&target), K2_5_MASK_TOKEN_ID);
        let config = spec.check(&target).unwrap();
        assert_eq!((config.tap_width(), config.block_size), (6 * 7168, 8));
        // The published rope: YaRN, factor 64 over 4096 positions, read back as the loader reads it.
        let yarn = config.rope_scaling.as_ref().expect("YaRN");
        assert_eq!((yarn.yarn.factor, yarn.yarn.original_max_position_embeddings), (64.0, 4096));
        assert_eq!(spec.config_json(&target)["max_position_embeddings"], 262_144);
        let plain = DrafterSpec { yarn: None, ..DrafterSpec::k2_5() };
        assert!(plain.check(&target).unwrap().rope_scaling.is_none());
        // 3.48 G parameters in bf16: the published folder's 6.48 GiB.
        let bytes = spec.tensor_bytes(&target).unwrap();
        assert!((6.95e9..6.97e9).contains(&(bytes as f64)), "{bytes}");
        let summary = spec.summary(&target).unwrap();
        assert_eq!(summary.bf16_bytes, bytes);
        assert_eq!(summary.shards.iter().map(|s| s.tensors).sum::<usize>(), 6 * 11 + 3);
    }

    #[test]
    fn a_slice_target_clamps_the_reference_layer_ids_and_a_small_vocabulary_the_mask() {
        let spec = DrafterSpec::k2_5();
        assert_eq!(spec.layer_ids(&k2(4)), [1; 6]);
        assert_eq!(spec.layer_ids(&k2(1)), [0; 6]);
        let tiny = Config::parse("config.json", &TinySpec::default().config_json()).unwrap();
        assert_eq!(spec.mask_token(&tiny), 255);
        assert_eq!(DrafterSpec { mask_token_id: Some(7), ..spec }.mask_token(&tiny), 7);
    }

    #[test]
    fn what_the_loader_would_refuse_is_refused_by_key() {
        let target = k2(4);
        let bad = |spec: DrafterSpec, says: &str| {
            let e = spec.check(&target).unwrap_err().to_string();
            assert!(e.contains(says), "{says}: {e}");
        };
        bad(DrafterSpec { target_layer_ids: Some(vec![1, 4]), ..DrafterSpec::k2_5() }, "target_layer_ids");
        bad(DrafterSpec { num_key_value_heads: 7, ..DrafterSpec::k2_5() }, "num_key_value_heads");
        bad(DrafterSpec { block_size: 1, ..DrafterSpec::k2_5() }, "block_size");
        bad(DrafterSpec { mask_token_id: Some(163_840), ..DrafterSpec::k2_5() }, "mask_token_id");
        bad(DrafterSpec { num_hidden_layers: 1 << 16, ..DrafterSpec::k2_5() }, "more than");
        bad(DrafterSpec { head_dim: 1 << 40, ..DrafterSpec::k2_5() }, "more than");
    }
}
