//! What a spec writes, before any value is drawn: every tensor's name, dtype and shape, how its
//! values are made, where in the seed's random stream they start, and which shard holds it.

use safetensors::Dtype as StDtype;

use super::{Sharding, TinySpec};
use crate::error::{EngineError, Result};
use crate::model::Layout;

/// The group size of the INT4 routed experts, as Kimi K2 ships them.
pub(crate) const GROUP: usize = 32;

/// One tensor of a shard.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Meta {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
}

impl Meta {
    fn new(name: String, dtype: StDtype, shape: &[usize]) -> Self {
        Self { name, dtype, shape: shape.to_vec() }
    }

    pub fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8) as u64
    }
}

/// How a unit's values are made. Each draws one uniform value per element (per weight element for
/// INT4) from the seed's stream, so a unit's values never depend on how the work is split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fill {
    /// bf16, uniform in `[-scale, scale)`.
    Uniform { scale: f32 },
    /// bf16 norm weights, uniform in `[0.8, 1.2)`.
    Norm,
    /// [`Fill::Norm`]'s draws in f32, not rounded.
    NormF32,
    /// f32, uniform in `[-scale, scale)`.
    UniformF32 { scale: f32 },
    /// An `[n, k]` weight uniform in `[-scale, scale)`, quantized to INT4 (group 32, bf16 scales):
    /// `weight_packed`, `weight_scale` and `weight_shape`.
    Int4 { n: usize, k: usize, scale: f32 },
}

/// Tensors that are made together and sit in one shard: one tensor, or the three of an INT4 weight.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Unit {
    pub tensors: Vec<Meta>,
    pub fill: Fill,
    /// Index of the unit's first draw in the seed's stream.
    pub first_draw: u64,
}

impl Unit {
    pub(crate) fn draws(&self) -> u64 {
        match self.fill {
            Fill::Int4 { n, k, .. } => (n * k) as u64,
            _ => self.tensors[0].shape.iter().product::<usize>() as u64,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.tensors.iter().map(Meta::bytes).sum()
    }
}

/// Every unit of the checkpoint, in the order their values are drawn.
pub(crate) fn units(spec: &TinySpec) -> Vec<Unit> {
    let mut b = Builder::new(spec.f32_weights);
    let (h, heads) = (spec.hidden_size, spec.num_attention_heads);
    let qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim;
    b.bf16("model.embed_tokens.weight", &[spec.vocab_size, h], 1.0);
    for i in 0..spec.num_hidden_layers {
        let p = format!("model.layers.{i}");
        b.norm(&format!("{p}.input_layernorm.weight"), h);
        let a = format!("{p}.self_attn");
        match spec.q_lora_rank {
            None => b.linear(&format!("{a}.q_proj"), heads * qk, h, false),
            Some(r) => {
                b.linear(&format!("{a}.q_a_proj"), r, h, false);
                b.norm(&format!("{a}.q_a_layernorm.weight"), r);
                b.linear(&format!("{a}.q_b_proj"), heads * qk, r, false);
            }
        }
        b.linear(&format!("{a}.kv_a_proj_with_mqa"), spec.kv_lora_rank + spec.qk_rope_head_dim, h, false);
        b.norm(&format!("{a}.kv_a_layernorm.weight"), spec.kv_lora_rank);
        b.linear(
            &format!("{a}.kv_b_proj"),
            heads * (spec.qk_nope_head_dim + spec.v_head_dim),
            spec.kv_lora_rank,
            false,
        );
        b.linear(&format!("{a}.o_proj"), h, heads * spec.v_head_dim, false);
        b.norm(&format!("{p}.post_attention_layernorm.weight"), h);
        let m = format!("{p}.mlp");
        if !spec.is_moe_layer(i) {
            b.mlp(&m, h, spec.intermediate_size, false);
            continue;
        }
        let e = spec.n_routed_experts;
        // Router logits of unit-RMS hidden states have standard deviation 1/sqrt(3): sigmoid scores
        // that differ from token to token, so tokens spread over the experts.
        b.bf16(&format!("{m}.gate.weight"), &[e, h], 1.0 / (h as f32).sqrt());
        let bias = Meta::new(format!("{m}.gate.e_score_correction_bias"), StDtype::F32, &[e]);
        b.push(vec![bias], Fill::UniformF32 { scale: 0.05 });
        for x in 0..e {
            b.mlp(&format!("{m}.experts.{x}"), h, spec.moe_intermediate_size, spec.int4_experts);
        }
        if spec.n_shared_experts > 0 {
            b.mlp(&format!("{m}.shared_experts"), h, spec.moe_intermediate_size * spec.n_shared_experts, false);
        }
    }
    b.norm("model.norm.weight", h);
    b.linear("lm_head", spec.vocab_size, h, false);
    let prefix = spec.layout.text_prefix();
    for m in b.units.iter_mut().flat_map(|u| &mut u.tensors) {
        m.name.insert_str(0, prefix);
    }
    // Drawn after the text model's, whose values are then those of the causal-LM layout.
    if spec.layout == Layout::KimiK25 {
        for (name, shape) in vision_tensors(h) {
            b.bf16(name, &shape, 0.1);
        }
    }
    b.units
}

/// The stand-in vision tower and projector of a Kimi K2.5-layout checkpoint whose text model is
/// `h` wide, by name and shape: small, named as K2.5's MoonViT tower and projector are, there to be
/// skipped by the loader.
fn vision_tensors(h: usize) -> [(&'static str, Vec<usize>); 5] {
    let v = VISION_HIDDEN;
    [
        ("vision_tower.patch_embed.proj.weight", vec![v, 3 * 14 * 14]),
        ("vision_tower.encoder.blocks.0.wqkv.weight", vec![3 * v, v]),
        ("vision_tower.encoder.final_layernorm.weight", vec![v]),
        ("mm_projector.proj.0.weight", vec![4 * v, 4 * v]),
        ("mm_projector.proj.2.weight", vec![h, 4 * v]),
    ]
}

/// The stand-in vision tower's width.
const VISION_HIDDEN: usize = 32;

/// The `vision_config` of a Kimi K2.5-layout checkpoint, describing [`vision_tensors`].
pub(crate) fn vision_config() -> serde_json::Value {
    serde_json::json!({"model_type": "moonvit", "hidden_size": VISION_HIDDEN, "num_hidden_layers": 1,
                       "patch_size": 14, "merge_kernel_size": [2, 2]})
}

/// How many tensors [`units`] makes, counted without making them (`None` beyond `u64`), so that a
/// spec of 2^20 layers of 2^20 experts is refused by its count, not built until memory runs out.
pub(crate) fn tensor_count(spec: &TinySpec) -> Option<u64> {
    let mlp = |int4: bool| if int4 { 9 } else { 3 };
    let layers = spec.num_hidden_layers as u64;
    let moe_layers =
        if spec.n_routed_experts > 0 { layers.saturating_sub(spec.first_k_dense_replace as u64) } else { 0 };
    // Two norms, kv_a_proj_with_mqa, its norm, kv_b_proj, o_proj, and q_proj or q_a_proj, its norm and q_b_proj.
    let attention = 6 + if spec.q_lora_rank.is_some() { 3 } else { 1 };
    // The router's weight and bias, the routed experts, the shared experts as one MLP.
    let shared = if spec.n_shared_experts > 0 { mlp(false) } else { 0 };
    let moe = (spec.n_routed_experts as u64).checked_mul(mlp(spec.int4_experts))?.checked_add(2 + shared)?;
    let per_layer = layers.checked_mul(attention)?;
    let feed_forward = moe_layers.checked_mul(moe)?.checked_add((layers - moe_layers).checked_mul(mlp(false))?)?;
    // The embedding, the final norm and lm_head, and a multimodal checkpoint's vision tensors.
    let vision = if spec.layout == Layout::KimiK25 { vision_tensors(0).len() as u64 } else { 0 };
    per_layer.checked_add(feed_forward)?.checked_add(3 + vision)
}

/// Lays out units one after another in the seed's stream.
pub(super) struct Builder {
    units: Vec<Unit>,
    next_draw: u64,
    /// Dense weights and norms in f32.
    f32: bool,
}

impl Builder {
    /// An empty plan; `f32`: dense weights and norms in f32 rather than bf16.
    pub(super) fn new(f32: bool) -> Self {
        Builder { units: Vec::new(), next_draw: 0, f32 }
    }

    pub(super) fn into_units(self) -> Vec<Unit> {
        self.units
    }

    fn push(&mut self, tensors: Vec<Meta>, fill: Fill) {
        let unit = Unit { tensors, fill, first_draw: self.next_draw };
        self.next_draw += unit.draws();
        self.units.push(unit);
    }

    /// A dense weight: bf16, or f32 for a spec of f32 weights (the same draws, not rounded).
    pub(super) fn bf16(&mut self, name: &str, shape: &[usize], scale: f32) {
        let (dtype, fill) = if self.f32 {
            (StDtype::F32, Fill::UniformF32 { scale })
        } else {
            (StDtype::BF16, Fill::Uniform { scale })
        };
        self.push(vec![Meta::new(name.into(), dtype, shape)], fill);
    }

    pub(super) fn norm(&mut self, name: &str, len: usize) {
        let (dtype, fill) = if self.f32 { (StDtype::F32, Fill::NormF32) } else { (StDtype::BF16, Fill::Norm) };
        self.push(vec![Meta::new(name.into(), dtype, &[len])], fill);
    }

    /// `{module}.weight` `[n, k]` (or its INT4 form), uniform with variance 1/k, so that a unit-RMS
    /// input gives a unit-RMS output.
    pub(super) fn linear(&mut self, module: &str, n: usize, k: usize, int4: bool) {
        let scale = (3.0 / k as f32).sqrt();
        if !int4 {
            return self.bf16(&format!("{module}.weight"), &[n, k], scale);
        }
        let tensors = vec![
            Meta::new(format!("{module}.weight_packed"), StDtype::I32, &[n, k / 8]),
            Meta::new(format!("{module}.weight_scale"), StDtype::BF16, &[n, k / GROUP]),
            Meta::new(format!("{module}.weight_shape"), StDtype::I64, &[2]),
        ];
        self.push(tensors, Fill::Int4 { n, k, scale });
    }

    pub(super) fn mlp(&mut self, prefix: &str, h: usize, inter: usize, int4: bool) {
        self.linear(&format!("{prefix}.gate_proj"), inter, h, int4);
        self.linear(&format!("{prefix}.up_proj"), inter, h, int4);
        self.linear(&format!("{prefix}.down_proj"), h, inter, int4);
    }
}

/// The units' shard numbers (0-based, consecutive, each shard non-empty) and the shard count.
pub(crate) fn shard_of(units: &[Unit], sharding: Sharding) -> Result<(Vec<usize>, usize)> {
    let mut shard = Vec::with_capacity(units.len());
    match sharding {
        Sharding::Count(0) | Sharding::MaxBytes(0) => {
            let what = if matches!(sharding, Sharding::Count(_)) { "the shard count" } else { "the shard size" };
            return Err(EngineError::ArgumentOutOfRange {
                what: what.into(),
                value: 0,
                limit: "a model needs at least one shard of at least one byte".into(),
            });
        }
        // Cut where the running byte count crosses each n-th of the total.
        Sharding::Count(n) => {
            let total: u64 = units.iter().map(Unit::bytes).sum();
            let mut start = 0u64;
            for u in units {
                shard.push(((start as u128 * n as u128 / total.max(1) as u128) as usize).min(n - 1));
                start += u.bytes();
            }
        }
        // Greedy: a unit that would take the shard past the limit opens the next one.
        Sharding::MaxBytes(max) => {
            let (mut current, mut used) = (0, 0u64);
            for u in units {
                if used > 0 && used + u.bytes() > max {
                    current += 1;
                    used = 0;
                }
                used += u.bytes();
                shard.push(current);
            }
        }
    }
    // Number the non-empty shards consecutively (a unit larger than an n-th skips numbers).
    let mut count = 0;
    let mut last = None;
    for s in &mut shard {
        if last != Some(*s) {
            last = Some(*s);
            count += 1;
        }
        *s = count - 1;
    }
    Ok((shard, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tensor_count_is_what_units_makes() {
        let tiny = TinySpec::default();
        for spec in [
            tiny.clone(),
            TinySpec { int4_experts: true, q_lora_rank: None, ..tiny.clone() },
            TinySpec { n_shared_experts: 0, first_k_dense_replace: 5, ..tiny.clone() },
            TinySpec { n_routed_experts: 0, ..tiny.clone() },
            TinySpec::k2_slice(4, 16),
            TinySpec { layout: Layout::KimiK25, ..tiny.clone() },
        ] {
            let made: usize = units(&spec).iter().map(|u| u.tensors.len()).sum();
            assert_eq!(tensor_count(&spec), Some(made as u64), "{spec:?}");
        }
        let huge = TinySpec::k2_slice(usize::MAX, usize::MAX);
        assert_eq!(tensor_count(&huge), None);
    }
}
