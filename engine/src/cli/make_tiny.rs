use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use kdtree_engine::model::Layout;
use kdtree_engine::tiny::{TinySpec, write_tiny_model};

use super::emit;

/// Write a tiny random model folder (Kimi K2 architecture, real file layout) for tests and demos.
///
/// Hidden size 64, 3 layers (the first dense, then MoE with 8 experts, top-2 of 2 groups), vocabulary
/// 256, YaRN rope. Two shards plus model.safetensors.index.json. The same seed writes the same bytes.
#[derive(Debug, Args)]
pub struct MakeTinyArgs {
    /// Folder to write (created if missing; existing files of the same names are replaced).
    #[arg(long)]
    out: PathBuf,
    /// Store the routed experts INT4 (group 32) with Kimi K2's quantization_config; the rest stays bf16.
    #[arg(long)]
    int4: bool,
    /// Store the dense weights and norms in f32 (torch_dtype float32), as transformers saves a model
    /// made in f32: the engine then computes in f32 by default.
    #[arg(long)]
    f32: bool,
    /// One `q_proj` per layer instead of the low-rank `q_a_proj`/`q_b_proj` pair (`q_lora_rank: null`).
    #[arg(long)]
    q_proj: bool,
    /// Rotate half-split pairs (`rope_interleave: false`) instead of DeepSeek-V3's adjacent pairs.
    #[arg(long)]
    rope_half_split: bool,
    /// The checkpoint's layout: `causal-lm` (DeepseekV3ForCausalLM, model.* tensors) or `kimi-k25`
    /// (KimiK25ForConditionalGeneration: model_type kimi_k25, the text model's config under
    /// text_config and its tensors under language_model., a small vision tower and projector beside
    /// it). The text model's weights are the same in both.
    #[arg(long, value_enum, default_value_t = Layout::CausalLm)]
    layout: Layout,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(args: MakeTinyArgs) -> anyhow::Result<()> {
    let defaults = TinySpec::default();
    let spec = TinySpec {
        seed: args.seed,
        int4_experts: args.int4,
        f32_weights: args.f32,
        q_lora_rank: if args.q_proj { None } else { defaults.q_lora_rank },
        rope_interleave: !args.rope_half_split,
        layout: args.layout,
        ..defaults
    };
    write_tiny_model(&args.out, &spec).with_context(|| format!("writing {}", args.out.display()))?;
    let dense = if args.f32 { "f32" } else { "bf16" };
    let kind = if args.int4 { format!("INT4 routed experts, {dense} elsewhere") } else { dense.to_owned() };
    emit(&format!("wrote a tiny {kind} model (seed {}) to {}\n", args.seed, args.out.display()))
}
