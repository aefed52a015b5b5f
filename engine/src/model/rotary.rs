//! Rotary frequencies and YaRN, as DeepSeek-V3's reference `model.py` (`precompute_freqs_cis`,
//! `yarn_*`) and the Hugging Face `DeepseekV3YarnRotaryEmbedding` compute them.

use std::f64::consts::PI;

use super::config::{Config, Yarn};
use crate::registry::RopeTable;

/// `mscale(s, m) = 0.1 m ln(s) + 1` for `s > 1`, else 1.
pub fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 }
}

/// The rotary table for the positions of the context, `0..c.context_len()`: `max_position_embeddings`
/// capped at [`Config::MAX_ROTARY_POSITIONS`], so that a huge declared context allocates nothing
/// beyond the cap (a position past the table is [`crate::EngineError::PositionOutOfRange`]).
pub(crate) fn rope_table(c: &Config) -> RopeTable {
    rope_table_for(c, c.context_len())
}

/// The rotary table for positions `0..positions`, at most the context's: what a run of known length needs.
pub(crate) fn rope_table_for(c: &Config, positions: usize) -> RopeTable {
    let positions = positions.min(c.context_len());
    let dim = c.qk_rope_head_dim;
    match &c.rope_scaling {
        None => RopeTable::new(&inv_freq(dim, c.rope_theta), positions, 1.0),
        Some(y) => {
            // DeepSeek's cos/sin factor: mscale(f, mscale) / mscale(f, mscale_all_dim), 1 for K2.
            let mscale = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim);
            RopeTable::new(&yarn_inv_freq(y, dim, c.rope_theta), positions, mscale)
        }
    }
}

/// Plain rope's `dim / 2` frequencies, `theta^(-2i / dim)`.
pub(crate) fn inv_freq(dim: usize, theta: f64) -> Vec<f64> {
    (0..dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f64 / dim as f64)).collect()
}

/// YaRN's `dim / 2` frequencies: the fast ones kept, the slow ones divided by `factor`, a linear ramp
/// between (DeepSeek's `precompute_freqs_cis` and transformers' `_compute_yarn_parameters` agree).
pub(crate) fn yarn_inv_freq(y: &Yarn, dim: usize, theta: f64) -> Vec<f64> {
    let (low, high) = correction_range(y, dim, theta);
    inv_freq(dim, theta)
        .iter()
        .enumerate()
        .map(|(i, &extra)| {
            // The ramp is 0 for fast (high-frequency) dims, which keep `extra`, and 1 for slow ones,
            // which are interpolated by `factor`.
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            extra / y.factor * (1.0 - keep) + extra * keep
        })
        .collect()
}

/// `(low, high)` of the YaRN ramp over the `dim / 2` frequencies (`yarn_find_correction_range`
/// with its floor/ceil, clamped to `[0, dim - 1]`; equal ends are widened by 0.001 as in
/// `yarn_linear_ramp_mask`).
fn correction_range(y: &Yarn, dim: usize, base: f64) -> (f64, f64) {
    let correction_dim = |rotations: f64| {
        dim as f64 * (y.original_max_position_embeddings as f64 / (rotations * 2.0 * PI)).ln() / (2.0 * base.ln())
    };
    let low = correction_dim(y.beta_fast).floor().max(0.0);
    let high = correction_dim(y.beta_slow).ceil().min(dim as f64 - 1.0);
    if low == high { (low, high + 0.001) } else { (low, high) }
}

/// The attention softmax scale: `1 / sqrt(qk_head_dim)`, times `mscale(factor, mscale_all_dim)²`
/// under YaRN (DeepSeek-V3's attention `softmax_scale`).
pub fn softmax_scale(c: &Config) -> f32 {
    let mut scale = 1.0 / (c.qk_head_dim() as f64).sqrt();
    if let Some(y) = c.rope_scaling.as_ref().filter(|y| y.mscale_all_dim != 0.0) {
        let m = yarn_mscale(y.factor, y.mscale_all_dim);
        scale *= m * m;
    }
    scale as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_position_embeddings: u64) -> Config {
        let json = serde_json::json!({"model_type": "kimi_k2", "vocab_size": 16, "hidden_size": 8,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "qk_rope_head_dim": 8,
            "max_position_embeddings": max_position_embeddings});
        Config::parse("config.json", &json).unwrap()
    }

    #[test]
    fn the_table_is_sized_by_the_capped_context_not_the_declared_one() {
        assert_eq!(rope_table(&config(512)).max_positions(), 512);
        // 2^24 declared positions would take 512 MiB of table for this 8-wide head; the cap takes 8 MiB.
        let huge = config(1 << 24);
        let table = rope_table(&huge);
        assert_eq!(table.max_positions(), Config::MAX_ROTARY_POSITIONS);
        assert_eq!(rope_table_for(&huge, 40).max_positions(), 40);
        assert_eq!(rope_table_for(&config(16), 40).max_positions(), 16);
        // Positions below the cap are what the uncapped table held.
        let small = rope_table(&config(64));
        assert_eq!(small.cos[..], table.cos[..small.cos.len()]);
    }

    #[test]
    fn kimi_k2_yarn_values() {
        // Kimi K2: factor 32, mscale = mscale_all_dim = 1, qk_head_dim 192.
        assert!((yarn_mscale(32.0, 1.0) - 1.346_573_590_279_972_6).abs() < 1e-12);
        assert_eq!(yarn_mscale(1.0, 1.0), 1.0);
        let y = Yarn {
            factor: 32.0,
            original_max_position_embeddings: 4096,
            beta_fast: 1.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim: 1.0,
        };
        // correction_dim(1) = 64 ln(4096 / 2pi) / (2 ln 50000) = 19.16 -> floor 19, ceil 20.
        assert_eq!(correction_range(&y, 64, 50000.0), (19.0, 20.0));
    }
}
