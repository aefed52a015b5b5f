//! Random checkpoints of the Kimi K2 architecture in the real file layout: `config.json` (with
//! K2's compressed-tensors `quantization_config` when the routed experts are INT4), safetensors
//! shards and `model.safetensors.index.json`. Tiny ones for tests and demos ([`TinySpec::default`]),
//! and slices of K2 itself for benchmarks ([`TinySpec::k2_slice`]): the real per-layer dimensions,
//! fewer layers and experts.
//!
//! One code path writes both, and never holds a shard: each shard's header is written from the
//! tensors' dtypes and shapes, then the tensors are made in pieces on all cores and written to
//! their offsets. The values are seeded draws addressed by their index in the seed's stream, so
//! the same spec writes the same bytes however the work is split.
//!
//! A DFlash drafter for a given target is written the same way ([`DrafterSpec`], [`write_drafter`]).
//!
//! | module | what |
//! |---|---|
//! | `drafter` | a DFlash drafter's config and tensors, checked against its target |
//! | `plan` | the tensors, how their values are made, which shard holds them |
//! | `fill` | the values of a piece of a tensor |
//! | `shard` | a safetensors file written piece by piece |
//! | `staging` | the folder written all or nothing |

mod drafter;
mod fill;
mod plan;
mod shard;
mod staging;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;

use safetensors::Dtype as StDtype;
use serde::Serialize;
use serde_json::json;

use crate::error::{EngineError, Result};
use crate::model::{Config, Layout, Yarn};
pub use drafter::{DrafterSpec, DrafterYarn, write_drafter};
use plan::{GROUP, Unit};
use shard::Shard;
use staging::Staging;

/// The sizes, seed and file layout of a generated model. [`Default`] is the tiny bf16 model tests
/// use; [`TinySpec::k2_slice`] has Kimi K2's dimensions.
#[derive(Clone, Debug, PartialEq)]
pub struct TinySpec {
    pub seed: u64,
    /// Routed experts INT4 (symmetric, group 32, bf16 scales), everything else bf16, as K2 ships.
    pub int4_experts: bool,
    /// Dense weights and norms in f32 (`torch_dtype: float32`, as transformers saves a model made
    /// in f32), drawn as the bf16 ones are but not rounded; INT4 scales stay bf16.
    pub f32_weights: bool,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// `None` writes one `q_proj` instead of the low-rank pair.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub n_shared_experts: usize,
    pub first_k_dense_replace: usize,
    pub max_position_embeddings: usize,
    /// `rope_scaling` (YaRN); `None` writes plain rope.
    pub rope_scaling: Option<Yarn>,
    /// DeepSeek-V3's adjacent-pair rotary layout; `false` writes `rope_interleave: false`.
    pub rope_interleave: bool,
    /// The checkpoint's layout: a causal LM, or Kimi K2.5's multimodal one (the same text model under
    /// `language_model.` and `text_config`, with a small vision tower and projector beside it).
    pub layout: Layout,
    pub sharding: Sharding,
}

/// How the tensors are split into safetensors files. An INT4 weight's three tensors always share
/// a file (the loader reads them from one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharding {
    /// This many files, cut where the running byte count crosses each n-th of the total (fewer
    /// when a tensor spans several n-ths).
    Count(usize),
    /// Files of at most this many bytes of tensors; a tensor larger than that gets a file of its own.
    MaxBytes(u64),
}

impl Default for TinySpec {
    fn default() -> Self {
        Self {
            seed: 0,
            int4_experts: false,
            f32_weights: false,
            vocab_size: 256,
            hidden_size: 64,
            num_hidden_layers: 3,
            num_attention_heads: 4,
            q_lora_rank: Some(32),
            kv_lora_rank: 32,
            qk_nope_head_dim: 16,
            // The GPU's MLA kernels take rope widths in multiples of 16.
            qk_rope_head_dim: 16,
            v_head_dim: 16,
            intermediate_size: 128,
            moe_intermediate_size: 32,
            n_routed_experts: 8,
            num_experts_per_tok: 2,
            n_group: 2,
            topk_group: 1,
            n_shared_experts: 1,
            first_k_dense_replace: 1,
            max_position_embeddings: 512,
            rope_scaling: Some(Yarn {
                factor: 4.0,
                original_max_position_embeddings: 128,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: 1.0,
                mscale_all_dim: 1.0,
            }),
            rope_interleave: true,
            layout: Layout::CausalLm,
            sharding: Sharding::Count(2),
        }
    }
}

/// Bytes of tensors per file of a benchmark checkpoint: 4 GiB.
pub const DEFAULT_SHARD_BYTES: u64 = 4 << 30;

impl TinySpec {
    /// Kimi K2 (Instruct/Thinking) with `layers` layers, the first dense and every other one with
    /// `experts` routed INT4 experts: hidden 7168, MLA with q_lora_rank 1536, kv_lora_rank 512 and
    /// 64 heads of 128 + 64 (rope) query/key and 128 value dims, dense intermediate 18432, experts
    /// of 2048 (top 8, one group, one shared expert), vocabulary 163840, rope_theta 50000 with
    /// YaRN factor 32 over 4096 positions. `max_position_embeddings` is 4096 (K2 says 131072; the
    /// engine builds rope tables of that many positions), shards of [`DEFAULT_SHARD_BYTES`].
    pub fn k2_slice(layers: usize, experts: usize) -> TinySpec {
        TinySpec {
            seed: 0,
            int4_experts: true,
            f32_weights: false,
            vocab_size: 163_840,
            hidden_size: 7168,
            num_hidden_layers: layers,
            num_attention_heads: 64,
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
            intermediate_size: 18_432,
            moe_intermediate_size: 2048,
            n_routed_experts: experts,
            num_experts_per_tok: 8,
            n_group: 1,
            topk_group: 1,
            n_shared_experts: 1,
            first_k_dense_replace: 1,
            max_position_embeddings: 4096,
            rope_scaling: Some(Yarn {
                factor: 32.0,
                original_max_position_embeddings: 4096,
                beta_fast: 1.0,
                beta_slow: 1.0,
                mscale: 1.0,
                mscale_all_dim: 1.0,
            }),
            rope_interleave: true,
            layout: Layout::CausalLm,
            sharding: Sharding::MaxBytes(DEFAULT_SHARD_BYTES),
        }
    }

    /// Whether layer `i` has the MoE feed-forward (otherwise the dense MLP).
    fn is_moe_layer(&self, i: usize) -> bool {
        self.n_routed_experts > 0 && i >= self.first_k_dense_replace
    }

    pub fn config_json(&self) -> serde_json::Value {
        let mut c = json!({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "first_k_dense_replace": self.first_k_dense_replace,
            "moe_layer_freq": 1,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "n_shared_experts": self.n_shared_experts,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "routed_scaling_factor": 2.827,
            "norm_topk_prob": true,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "rope_theta": 50000.0,
            "rope_interleave": self.rope_interleave,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": false,
            "torch_dtype": if self.f32_weights { "float32" } else { "bfloat16" },
        });
        if let Some(y) = &self.rope_scaling {
            c["rope_scaling"] = json!({
                "type": "yarn", "factor": y.factor, "original_max_position_embeddings": y.original_max_position_embeddings,
                "beta_fast": y.beta_fast, "beta_slow": y.beta_slow, "mscale": y.mscale, "mscale_all_dim": y.mscale_all_dim,
            });
        }
        let quantization = self.int4_experts.then(|| {
            // Kimi K2's own quantization_config (K2.5 and K2.6 ship the same, at the root).
            json!({
                "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "output_activations": null,
                    "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": GROUP,
                                "dynamic": false, "actorder": null, "observer": "minmax"}}},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
                "kv_cache_scheme": null,
            })
        });
        match self.layout {
            Layout::CausalLm => {
                if let Some(q) = quantization {
                    c["quantization_config"] = q;
                }
                c
            }
            Layout::KimiK25 => {
                c["model_type"] = json!("deepseek_v3");
                let mut root = json!({
                    "architectures": ["KimiK25ForConditionalGeneration"],
                    "model_type": "kimi_k25",
                    "text_config": c,
                    "vision_config": plan::vision_config(),
                    "tie_word_embeddings": false,
                });
                if let Some(q) = quantization {
                    root["quantization_config"] = q;
                }
                root
            }
        }
    }

    /// The most tensors a spec may make: five times an INT4 Kimi K2 (61 layers of 384 experts, about
    /// 212 000 tensors). The plan of every tensor is held in memory (a few hundred bytes each)
    /// before anything is written, so its size is bounded before it is made.
    pub(crate) const MAX_TENSORS: u64 = 1 << 20;

    /// Refuses specs the engine could not load, before anything is planned or written: the config
    /// goes through the engine's own parser and its checks, and the tensors are counted.
    pub fn check(&self) -> Result<()> {
        let config = Config::parse("config.json (of the spec)", &self.config_json())?;
        let sizes = [
            ("num_hidden_layers", self.num_hidden_layers),
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
        ];
        if let Some((key, _)) = sizes.into_iter().find(|&(_, size)| size == 0) {
            return Err(EngineError::ArgumentOutOfRange {
                what: format!("the model spec's {key}"),
                value: 0,
                limit: "layers, vocabulary and hidden size must be positive".into(),
            });
        }
        if plan::tensor_count(self).is_none_or(|n| n > Self::MAX_TENSORS) {
            return Err(EngineError::SpecTooLarge {
                spec: "model spec",
                sizes: format!("{} layers with {} routed experts each", self.num_hidden_layers, self.n_routed_experts),
                max: Self::MAX_TENSORS,
                unit: "tensors",
                real: "Kimi K2 has about 212 000",
                remedy: "fewer layers or experts",
            });
        }
        let moe = (0..self.num_hidden_layers).any(|i| config.is_moe_layer(i));
        for k in [self.hidden_size, self.moe_intermediate_size] {
            if moe && self.int4_experts {
                kdtree_quant::check_group("routed experts", k, GROUP).map_err(|source| EngineError::Quant {
                    file: "config.json (of the spec)".into(),
                    tensor: "routed experts".into(),
                    source: Box::new(source),
                })?;
            }
        }
        Ok(())
    }

    /// What [`write_model`] writes, without writing it.
    pub fn summary(&self) -> Result<Summary> {
        self.check()?;
        let units = plan::units(self);
        Ok(Summary::of(&units, &shards(&units, self.sharding)?))
    }
}

/// The shards of `units` (a checked spec's plan), split as `sharding` says.
fn shards(units: &[Unit], sharding: Sharding) -> Result<Vec<Shard<'_>>> {
    let (shard_of, count) = plan::shard_of(units, sharding)?;
    let mut members = vec![Vec::new(); count];
    for (unit, &s) in units.iter().zip(&shard_of) {
        members[s].push(unit);
    }
    members
        .into_iter()
        .enumerate()
        .map(|(i, units)| Shard::new(format!("model-{:05}-of-{count:05}.safetensors", i + 1), units))
        .collect()
}

/// The files of a generated model and their bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub shards: Vec<ShardSummary>,
    /// INT4 weights: packed nibbles, their bf16 scales and their shapes.
    pub int4_bytes: u64,
    /// Every other bf16 tensor.
    pub bf16_bytes: u64,
    /// The f32 tensors: router biases, and the dense weights and norms of a spec of f32 weights.
    pub f32_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShardSummary {
    pub name: String,
    pub tensors: usize,
    /// The whole file, header included.
    pub bytes: u64,
}

impl Summary {
    fn of(units: &[Unit], shards: &[Shard<'_>]) -> Self {
        let (mut int4_bytes, mut bf16_bytes, mut f32_bytes) = (0, 0, 0);
        for u in units {
            match (u.fill, u.tensors[0].dtype) {
                (plan::Fill::Int4 { .. }, _) => int4_bytes += u.bytes(),
                (_, StDtype::F32) => f32_bytes += u.bytes(),
                _ => bf16_bytes += u.bytes(),
            }
        }
        let shards = shards
            .iter()
            .map(|s| ShardSummary {
                name: s.name.clone(),
                tensors: s.units.iter().map(|u| u.tensors.len()).sum(),
                bytes: s.file_bytes(),
            })
            .collect();
        Self { shards, int4_bytes, bf16_bytes, f32_bytes }
    }

    /// Bytes of all shards, headers included.
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.bytes).sum()
    }

    /// Bytes of tensor data, headers excluded: what `progress` of [`write_model`] counts up to.
    pub fn tensor_bytes(&self) -> u64 {
        self.int4_bytes + self.bf16_bytes + self.f32_bytes
    }
}

/// Writes the model `spec` describes into `dir` (created if missing; files of the same names are
/// replaced), all or nothing: each file is written under a temporary name and renamed into place once
/// all are, and a failure removes what it wrote. `progress` is called, from any thread, with the
/// bytes of each piece of tensor data written.
pub fn write_model(dir: &Path, spec: &TinySpec, progress: &(dyn Fn(u64) + Sync)) -> Result<Summary> {
    spec.check()?;
    write_folder(dir, &spec.config_json(), &plan::units(spec), spec.sharding, spec.seed, progress)
}

/// Writes `config` as config.json and the tensors of `units` (drawn from `seed`'s stream) as shards
/// split by `sharding`, with their index, into `dir`: all or nothing, as [`write_model`] says.
fn write_folder(
    dir: &Path,
    config: &serde_json::Value,
    units: &[Unit],
    sharding: Sharding,
    seed: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Summary> {
    let shards = shards(units, sharding)?;
    let mut folder = Staging::create(dir)?;
    let config = serde_json::to_string_pretty(config).expect("JSON values serialize");
    folder.stage("config.json", |file, path| write_text(file, path, &config))?;
    let mut weight_map = BTreeMap::new();
    for shard in &shards {
        folder.stage(&shard.name, |file, path| shard.write(file, path, seed, progress))?;
        for t in shard.units.iter().flat_map(|u| &u.tensors) {
            weight_map.insert(t.name.clone(), shard.name.clone());
        }
    }
    let total_size: u64 = shards.iter().map(Shard::tensor_bytes).sum();
    let index = json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
    folder.stage("model.safetensors.index.json", |file, path| write_text(file, path, &index.to_string()))?;
    folder.commit()?;
    Ok(Summary::of(units, &shards))
}

/// Writes `text` into `file`; errors name `path`, where the file is going.
fn write_text(mut file: &File, path: &Path, text: &str) -> Result<()> {
    file.write_all(text.as_bytes()).map_err(|source| EngineError::Io { file: path.display().to_string(), source })
}

/// Writes the model `spec` describes into `dir`, quietly: [`write_model`] without progress.
pub fn write_tiny_model(dir: &Path, spec: &TinySpec) -> Result<()> {
    write_model(dir, spec, &|_| {}).map(drop)
}
