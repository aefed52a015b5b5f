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
struct Linear {
    n: usize,
    k: usize,
    format: Format,
    routed_expert: bool,
}

/// The linears found so far, from the headers of `ckpt` read as config `c` says.
struct Scan<'a> {
    c: &'a Config,
    ckpt: Checkpoint,
    /// The compute dtype asked for, if any.
    dtype: Option<ComputeDtype>,
    found: Vec<Linear>,
}

impl Scan<'_> {
    /// How `module` is stored, as the loader reads it; `None` when absent.
    fn format(&self, module: &str) -> Result<Option<Format>> {
        if let Some((_, _, group_size, dtype)) = self.ckpt.int4_header(module, self.c.quant_group(module))? {
            return Ok(Some(Format::Int4 { group_size, dtype }));
        }
        let stored = self.ckpt.float_dtype(&format!("{module}.weight"));
        Ok(stored.map(|stored| Format::Dense(self.dtype.unwrap_or(stored))))
    }

    /// `parts` (module, rows) of `k` columns as the loader takes them: stacked into one weight when
    /// every part has one format. Absent modules add nothing.
    fn add(&mut self, parts: &[(String, usize)], k: usize, routed_expert: bool) -> Result<()> {
        let formats = parts.iter().map(|(m, _)| self.format(m)).collect::<Result<Vec<_>>>()?;
        let Some(formats) = formats.into_iter().collect::<Option<Vec<_>>>() else { return Ok(()) };
        if formats.windows(2).all(|w| w[0] == w[1]) {
            let n = parts.iter().map(|(_, n)| n).sum();
            self.found.push(Linear { n, k, format: formats[0], routed_expert });
        } else {
            for ((_, n), format) in parts.iter().zip(formats) {
                self.found.push(Linear { n: *n, k, format, routed_expert });
            }
        }
        Ok(())
    }

    /// An MLP at `p`: `[gate; up]`, then down.
    fn mlp(&mut self, p: &str, inter: usize, routed_expert: bool) -> Result<()> {
        let h = self.c.hidden_size;
        self.add(&[(format!("{p}.gate_proj"), inter), (format!("{p}.up_proj"), inter)], h, routed_expert)?;
        self.add(&[(format!("{p}.down_proj"), h)], inter, routed_expert)
    }
}

/// Every linear the load of `dir` hands to the backend, dense weights in `dtype` where one is
/// asked for (else in their stored dtype, as [`Model::load_as`](super::Model::load_as) keeps them).
/// Modules missing from the checkpoint are left out: the load names them.
fn linears(c: &Config, dir: &Path, dtype: Option<ComputeDtype>) -> Result<Vec<Linear>> {
    let mut scan = Scan { c, ckpt: Checkpoint::open(dir, c.layout)?, dtype, found: Vec::new() };
    let h = c.hidden_size;
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}.self_attn");
        let (heads, q_out) = (c.num_attention_heads, c.num_attention_heads * c.qk_head_dim());
        let kv_a = (format!("{p}.kv_a_proj_with_mqa"), c.kv_lora_rank + c.qk_rope_head_dim);
        match c.q_lora_rank {
            None => {
                scan.add(&[(format!("{p}.q_proj"), q_out)], h, false)?;
                scan.add(&[kv_a], h, false)?;
            }
            Some(r) => {
                scan.add(&[(format!("{p}.q_a_proj"), r), kv_a], h, false)?;
                scan.add(&[(format!("{p}.q_b_proj"), q_out)], r, false)?;
            }
        }
        scan.add(&[(format!("{p}.o_proj"), h)], heads * c.v_head_dim, false)?;
        let p = format!("model.layers.{i}.mlp");
        if c.is_moe_layer(i) {
            for e in 0..c.n_routed_experts {
                scan.mlp(&format!("{p}.experts.{e}"), c.moe_intermediate_size, true)?;
            }
            if c.n_shared_experts > 0 {
                scan.mlp(&format!("{p}.shared_experts"), c.moe_intermediate_size * c.n_shared_experts, false)?;
            }
        } else {
            scan.mlp(&p, c.intermediate_size, false)?;
        }
    }
    // The head: its own weight, or the embedding table when tied and absent.
    let tied = c.tie_word_embeddings && !scan.ckpt.contains("lm_head.weight");
    let head = if tied { "model.embed_tokens" } else { "lm_head" };
    scan.add(&[(head.to_owned(), c.vocab_size)], h, false)?;
    Ok(scan.found)
}

/// The routed experts of the MoE layers when every one is INT4 of one group size and scale dtype,
/// gate and up stacked (the grouped kernel's case).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int4Experts {
    /// `[2 x intermediate, hidden]` and `[hidden, intermediate]`, as (N, K).
    pub gate_up: (usize, usize),
    pub down: (usize, usize),
    pub group_size: usize,
    /// The scales' dtype.
    pub dtype: Dtype,
    /// Routed experts a layer, and those a token is routed to.
    pub experts: usize,
    pub top_k: usize,
}

/// What the load of a model will hand to the backend, each kind sorted and distinct.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedWeights {
    pub int4: Vec<Int4Weight>,
    /// Dense bf16 and f16 linears; routed experts are left out: the backend runs them as a whole
    /// ([`Backend::experts`](crate::registry::Backend::experts)).
    pub dense16: Vec<DenseShape>,
    /// `None` without MoE layers, or with routed experts of mixed or dense formats.
    pub experts: Option<Int4Experts>,
}

impl PlannedWeights {
    /// The model in `dir`, its dense weights computed in `dtype` if asked (else in their stored
    /// dtype).
    pub fn read(dir: &Path, dtype: Option<ComputeDtype>) -> Result<PlannedWeights> {
        let c = Config::load(&dir.join("config.json"))?;
        let linears = linears(&c, dir, dtype)?;
        let int4: BTreeSet<Int4Weight> = linears
            .iter()
            .filter_map(|w| match w.format {
                Format::Int4 { group_size, dtype } => {
                    Some(Int4Weight { n: w.n, k: w.k, group_size, dtype, routed_expert: w.routed_expert })
                }
                Format::Dense(_) => None,
            })
            .collect();
        let dense16: BTreeSet<DenseShape> = linears
            .iter()
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
        // Every routed weight INT4 in one format; their shapes are the config's (the load checks).
        let mut formats = linears.iter().filter(|w| w.routed_expert).map(|w| w.format);
        let first = formats.next();
        let experts = match first {
            Some(Format::Int4 { group_size, dtype }) if formats.all(|f| Some(f) == first) => Some(Int4Experts {
                gate_up: (2 * c.moe_intermediate_size, c.hidden_size),
                down: (c.hidden_size, c.moe_intermediate_size),
                group_size,
                dtype,
                experts: c.n_routed_experts,
                top_k: c.num_experts_per_tok,
            }),
            _ => None,
        };
        Ok(PlannedWeights { int4: int4.into_iter().collect(), dense16: dense16.into_iter().collect(), experts })
    }
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
        read(&written(spec), None).int4
    }

    fn read(dir: &tempfile::TempDir, dtype: Option<ComputeDtype>) -> PlannedWeights {
        PlannedWeights::read(dir.path(), dtype).unwrap()
    }

    #[test]
    fn a_bf16_model_has_none_and_int4_experts_are_gate_up_stacked_and_down() {
        let bf16 = written(&TinySpec::default());
        assert_eq!(read(&bf16, None).int4, []);
        assert_eq!(read(&bf16, None).experts, None);
        let spec = TinySpec { int4_experts: true, ..TinySpec::default() };
        let (h, inter) = (spec.hidden_size, spec.moe_intermediate_size);
        let expert = |n, k| Int4Weight { n, k, group_size: 32, dtype: Dtype::Bf16, routed_expert: true };
        let mut want = vec![expert(2 * inter, h), expert(h, inter)];
        want.sort();
        assert_eq!(weights_of(&spec), want);
        let experts = Int4Experts {
            gate_up: (2 * inter, h),
            down: (h, inter),
            group_size: 32,
            dtype: Dtype::Bf16,
            experts: spec.n_routed_experts,
            top_k: spec.num_experts_per_tok,
        };
        assert_eq!(read(&written(&spec), None).experts, Some(experts));
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
        assert_eq!(read(&dir, None).dense16, by_hand(&spec, Dtype::Bf16));
        assert_eq!(read(&dir, Some(ComputeDtype::F16)).dense16, by_hand(&spec, Dtype::F16));
        assert_eq!(read(&dir, Some(ComputeDtype::F32)).dense16, []);
        let direct = TinySpec { q_lora_rank: None, int4_experts: true, ..TinySpec::default() };
        assert_eq!(read(&written(&direct), None).dense16, by_hand(&direct, Dtype::Bf16));
        let f32s = TinySpec { f32_weights: true, ..TinySpec::default() };
        assert_eq!(read(&written(&f32s), None).dense16, []);
        assert_eq!(read(&written(&f32s), Some(ComputeDtype::Bf16)).dense16, by_hand(&f32s, Dtype::Bf16));
    }
}
