//! The linear weights a load will hand to the backend, known from config.json and the safetensors
//! headers alone (no weight is read), so that a backend can get their kernels ready before the
//! load: the CUDA backend tunes the shapes its tuning DB lacks. The modules and their stacking are
//! the loader's ([`Attention::load`](super::attention), [`Mlp::load`](super::mlp), the MoE and the
//! head): `[q_a_proj; kv_a_proj_with_mqa]` where their formats match, each MLP's `[gate; up]`.

use std::collections::BTreeSet;
use std::path::Path;

use kdtree_quant::Dtype;
use serde::Serialize;

use super::checkpoint::Checkpoint;
use super::config::Config;
use crate::error::Result;
use crate::registry::ComputeDtype;

/// One distinct INT4 weight as the backend receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Int4Weight {
    pub n: usize,
    pub k: usize,
    pub group_size: usize,
    /// The scales' dtype.
    pub dtype: Dtype,
    /// A routed expert's weight, which a backend may run other than through per-shape kernels.
    pub routed_expert: bool,
}

/// A dense 16-bit weight's problem, as the tuning DB keys it (M aside).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DenseShape {
    pub n: usize,
    pub k: usize,
    pub dtype: Dtype,
}

impl std::fmt::Display for DenseShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{} {}", self.n, self.k, self.dtype)
    }
}

/// How a module is stored, as the loader reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Int4 {
        group_size: usize,
        dtype: Dtype,
    },
    /// In the dtype the load computes it in.
    Dense(ComputeDtype),
}

/// One weight the loader hands to the backend: `n` may be two modules' rows stacked.
struct Planned {
    n: usize,
    k: usize,
    format: Format,
    routed_expert: bool,
}

/// Every linear the load of `dir` hands to the backend, dense weights in `dtype` where one is
/// asked for (else in their stored dtype, as [`Model::load_as`](super::Model::load_as) keeps them).
/// Modules missing from the checkpoint are left out: the load names them.
fn planned(dir: &Path, dtype: Option<ComputeDtype>) -> Result<Vec<Planned>> {
    let c = Config::load(&dir.join("config.json"))?;
    let ckpt = Checkpoint::open(dir, c.layout)?;
    let format = |module: &str| -> Result<Option<Format>> {
        if let Some((_, _, group_size, dtype)) = ckpt.int4_header(module, c.quant_group(module))? {
            return Ok(Some(Format::Int4 { group_size, dtype }));
        }
        Ok(ckpt.float_dtype(&format!("{module}.weight")).map(|stored| Format::Dense(dtype.unwrap_or(stored))))
    };
    let mut out = Vec::new();
    // `parts` as the loader takes them: stacked into one weight when every part has one format.
    let mut add = |parts: &[(String, usize)], k: usize, routed_expert: bool| -> Result<()> {
        let formats = parts.iter().map(|(m, _)| format(m)).collect::<Result<Vec<_>>>()?;
        let Some(formats) = formats.into_iter().collect::<Option<Vec<_>>>() else { return Ok(()) };
        if formats.windows(2).all(|w| w[0] == w[1]) {
            let n = parts.iter().map(|(_, n)| n).sum();
            out.push(Planned { n, k, format: formats[0], routed_expert });
        } else {
            parts
                .iter()
                .zip(formats)
                .for_each(|((_, n), format)| out.push(Planned { n: *n, k, format, routed_expert }));
        }
        Ok(())
    };
    let h = c.hidden_size;
    let mlp =
        |add: &mut dyn FnMut(&[(String, usize)], usize, bool) -> Result<()>, p: &str, inter: usize, routed: bool| {
            add(&[(format!("{p}.gate_proj"), inter), (format!("{p}.up_proj"), inter)], h, routed)?;
            add(&[(format!("{p}.down_proj"), h)], inter, routed)
        };
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}.self_attn");
        let (heads, q_out) = (c.num_attention_heads, c.num_attention_heads * c.qk_head_dim());
        let kv_a = (format!("{p}.kv_a_proj_with_mqa"), c.kv_lora_rank + c.qk_rope_head_dim);
        match c.q_lora_rank {
            None => {
                add(&[(format!("{p}.q_proj"), q_out)], h, false)?;
                add(&[kv_a], h, false)?;
            }
            Some(r) => {
                add(&[(format!("{p}.q_a_proj"), r), kv_a], h, false)?;
                add(&[(format!("{p}.q_b_proj"), q_out)], r, false)?;
            }
        }
        add(&[(format!("{p}.o_proj"), h)], heads * c.v_head_dim, false)?;
        let p = format!("model.layers.{i}.mlp");
        if c.is_moe_layer(i) {
            for e in 0..c.n_routed_experts {
                mlp(&mut add, &format!("{p}.experts.{e}"), c.moe_intermediate_size, true)?;
            }
            if c.n_shared_experts > 0 {
                mlp(&mut add, &format!("{p}.shared_experts"), c.moe_intermediate_size * c.n_shared_experts, false)?;
            }
        } else {
            mlp(&mut add, &p, c.intermediate_size, false)?;
        }
    }
    // The head: its own weight, or the embedding table when tied and absent.
    let tied = c.tie_word_embeddings && !ckpt.contains("lm_head.weight");
    let head = if tied { "model.embed_tokens" } else { "lm_head" };
    add(&[(head.to_owned(), c.vocab_size)], h, false)?;
    Ok(out)
}

/// The distinct INT4 weights of the model in `dir`, sorted.
pub fn int4_weights(dir: &Path) -> Result<Vec<Int4Weight>> {
    let found: BTreeSet<Int4Weight> = planned(dir, None)?
        .into_iter()
        .filter_map(|w| match w.format {
            Format::Int4 { group_size, dtype } => {
                Some(Int4Weight { n: w.n, k: w.k, group_size, dtype, routed_expert: w.routed_expert })
            }
            Format::Dense(_) => None,
        })
        .collect();
    Ok(found.into_iter().collect())
}

/// The distinct dense 16-bit weights the load of `dir` hands to the backend as linears, sorted,
/// computed in `dtype` if asked (else in their stored dtype). Routed experts are left out: the
/// backend runs them as a whole ([`Backend::experts`](crate::registry::Backend::experts)).
pub fn dense16_weights(dir: &Path, dtype: Option<ComputeDtype>) -> Result<Vec<DenseShape>> {
    let found: BTreeSet<DenseShape> = planned(dir, dtype)?
        .into_iter()
        .filter(|w| !w.routed_expert)
        .filter_map(|w| {
            let dtype = match w.format {
                Format::Dense(ComputeDtype::Bf16) => Dtype::Bf16,
                Format::Dense(ComputeDtype::F16) => Dtype::F16,
                Format::Dense(ComputeDtype::F32) | Format::Int4 { .. } => return None,
            };
            Some(DenseShape { n: w.n, k: w.k, dtype })
        })
        .collect();
    Ok(found.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiny::{TinySpec, write_tiny_model};

    fn written(spec: &TinySpec) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_model(dir.path(), spec).unwrap();
        dir
    }

    fn weights_of(spec: &TinySpec) -> Vec<Int4Weight> {
        int4_weights(written(spec).path()).unwrap()
    }

    #[test]
    fn a_bf16_model_has_none_and_int4_experts_are_gate_up_stacked_and_down() {
        assert_eq!(weights_of(&TinySpec::default()), []);
        let spec = TinySpec { int4_experts: true, ..TinySpec::default() };
        let (h, inter) = (spec.hidden_size, spec.moe_intermediate_size);
        let expert = |n, k| Int4Weight { n, k, group_size: 32, dtype: Dtype::Bf16, routed_expert: true };
        let mut want = vec![expert(2 * inter, h), expert(h, inter)];
        want.sort();
        assert_eq!(weights_of(&spec), want);
    }

    /// The dense shapes the loader makes of `spec`, by hand: `[q_a; kv_a]` (or `q_proj` and `kv_a`),
    /// `q_b`, `o_proj`, the dense and shared MLPs' `[gate; up]` and down, and the head.
    fn by_hand(spec: &TinySpec, dtype: Dtype) -> Vec<DenseShape> {
        let d = |n, k| DenseShape { n, k, dtype };
        let (h, heads, kv_a) = (spec.hidden_size, spec.num_attention_heads, spec.kv_lora_rank + spec.qk_rope_head_dim);
        let q_out = heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim);
        let shared = spec.moe_intermediate_size * spec.n_shared_experts;
        let mut want =
            vec![d(h, heads * spec.v_head_dim), d(2 * spec.intermediate_size, h), d(h, spec.intermediate_size)];
        want.extend([d(2 * shared, h), d(h, shared), d(spec.vocab_size, h)]);
        match spec.q_lora_rank {
            Some(r) => want.extend([d(r + kv_a, h), d(q_out, r)]),
            None => want.extend([d(q_out, h), d(kv_a, h)]),
        }
        want.sort();
        want.dedup();
        want
    }

    #[test]
    fn dense_weights_are_the_loaders_linears_stacked_as_it_stacks_them() {
        let spec = TinySpec::default();
        let dir = written(&spec);
        // Routed experts in bf16 run as a whole, not as linears: absent.
        assert_eq!(dense16_weights(dir.path(), None).unwrap(), by_hand(&spec, Dtype::Bf16));
        assert_eq!(dense16_weights(dir.path(), Some(ComputeDtype::F16)).unwrap(), by_hand(&spec, Dtype::F16));
        assert_eq!(dense16_weights(dir.path(), Some(ComputeDtype::F32)).unwrap(), []);
        let direct = TinySpec { q_lora_rank: None, int4_experts: true, ..TinySpec::default() };
        assert_eq!(dense16_weights(written(&direct).path(), None).unwrap(), by_hand(&direct, Dtype::Bf16));
        let f32s = TinySpec { f32_weights: true, ..TinySpec::default() };
        assert_eq!(dense16_weights(written(&f32s).path(), None).unwrap(), []);
        assert_eq!(
            dense16_weights(written(&f32s).path(), Some(ComputeDtype::Bf16)).unwrap(),
            by_hand(&f32s, Dtype::Bf16)
        );
    }
}
