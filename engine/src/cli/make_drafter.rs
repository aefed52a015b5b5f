use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kdtree_engine::Config;
use kdtree_engine::table::table;
use kdtree_engine::tiny::{DrafterSpec, Sharding, Summary, write_drafter};

use super::emit;
use super::make_model::{at_least, gb, parse_bytes};

/// Write a random DFlash drafter for a target folder, by default of Kimi-K2.5-DFlash's dimensions.
///
/// The published layout (`config.json`, a Qwen3 config with `dflash_config`; bf16 `layers.N.*`,
/// `fc`, `hidden_norm`, `norm`), loadable with `--drafter dflash --draft-model DIR` for the target
/// of --target, whose hidden size and vocabulary it takes. The defaults are the published
/// z-lab/Kimi-K2.5-DFlash drafter's, as its config states them (read from public copies of it;
/// this machine could not fetch it): 6 layers, 64 query and 8 key/value heads of 128, MLP
/// intermediate 18432, block size 8, rope_theta 50000, mask token 163838, target layers
/// [1, 12, 24, 35, 47, 58] for K2's 61 (the reference's build_target_layer_ids; for a target with
/// fewer layers the same formula, clamped into its layers). That is 3.48 G parameters, 6.96 GB,
/// beside hidden 7168, rope scaled by YaRN (factor 64 over 4096 positions, max_position_embeddings
/// 262144, as published).
///
/// Weights are seeded uniform draws of variance 1/fan-in, norms near 1: the drafter proposes noise,
/// so it is for timing a round, not for acceptance. --dry-run prints the sizes without writing.
#[derive(Debug, Args)]
pub struct MakeDrafterArgs {
    /// Folder to write (created if missing; existing files of the same names are replaced once every
    /// file is written: a run that fails leaves the folder as it was).
    #[arg(long)]
    out: PathBuf,
    /// The target model folder the drafter is for (its config.json is read: hidden size, vocabulary,
    /// layers).
    #[arg(long)]
    target: PathBuf,
    /// Drafter decoder layers.
    #[arg(long, default_value_t = 6, value_parser = at_least(1, "a drafter needs a layer"))]
    layers: usize,
    /// Query heads.
    #[arg(long, default_value_t = 64, value_parser = at_least(1, "attention needs a head"))]
    heads: usize,
    /// Key/value heads (grouped-query attention); must divide --heads.
    #[arg(long, default_value_t = 8, value_parser = at_least(1, "attention needs a key/value head"))]
    kv_heads: usize,
    /// Width of a head (even: rotary embedding rotates pairs).
    #[arg(long, default_value_t = 128, value_parser = at_least(2, "rotary embedding needs a pair"))]
    head_dim: usize,
    /// The SwiGLU MLP's intermediate size.
    #[arg(long, default_value_t = 18432, value_parser = at_least(1, "an MLP needs a unit"))]
    intermediate: usize,
    /// Positions a round drafts, the bonus token included (the published drafter was trained with 16
    /// and runs with 8).
    #[arg(long, default_value_t = 8, value_parser = at_least(2, "a block holds the bonus token and a mask"))]
    block_size: usize,
    /// The target layers whose hidden states the drafter reads, comma-separated [default: the
    /// reference's spread over the target's layers, one per drafter layer].
    #[arg(long, value_delimiter = ',')]
    target_layer_ids: Option<Vec<usize>>,
    /// The MASK token id [default: 163838, or the target's last id if its vocabulary is smaller].
    #[arg(long)]
    mask_token: Option<u32>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Most bytes of tensors per safetensors shard: a number with an optional unit (B, KB, MB, GB,
    /// KiB, MiB, GiB).
    #[arg(long, value_parser = parse_bytes, default_value = "4GiB")]
    shard_size: u64,
    /// Print the files and sizes without writing anything.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: MakeDrafterArgs) -> anyhow::Result<()> {
    let target = Config::load(&args.target.join("config.json"))
        .with_context(|| format!("--target {}: reading the target's config", args.target.display()))?;
    let spec = DrafterSpec {
        seed: args.seed,
        num_hidden_layers: args.layers,
        num_attention_heads: args.heads,
        num_key_value_heads: args.kv_heads,
        head_dim: args.head_dim,
        intermediate_size: args.intermediate,
        block_size: args.block_size,
        mask_token_id: args.mask_token,
        target_layer_ids: args.target_layer_ids.clone(),
        sharding: Sharding::MaxBytes(args.shard_size),
        ..DrafterSpec::k2_5()
    };
    let planned = spec.summary(&target).with_context(|| {
        format!("make-drafter for the target {} ({} layers)", args.target.display(), target.num_hidden_layers)
    })?;
    if args.dry_run {
        return print(&args, &spec, &target, &planned, None);
    }
    let bar = ProgressBar::new(planned.tensor_bytes());
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}")
            .expect("a valid template"),
    );
    let start = Instant::now();
    let written = write_drafter(&args.out, &spec, &target, &|n| bar.inc(n))
        .with_context(|| format!("--out {}: writing the drafter", args.out.display()))?;
    bar.finish_and_clear();
    print(&args, &spec, &target, &written, Some(start.elapsed().as_secs_f64()))
}

fn print(
    args: &MakeDrafterArgs,
    spec: &DrafterSpec,
    target: &Config,
    s: &Summary,
    seconds: Option<f64>,
) -> anyhow::Result<()> {
    let layer_ids = spec.layer_ids(target);
    let mask = spec.mask_token(target);
    if args.json {
        let out = serde_json::json!({
            "out": args.out, "target": args.target, "written": seconds.is_some(), "seed": args.seed,
            "layers": args.layers, "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
            "intermediate": args.intermediate, "hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
            "block_size": args.block_size, "target_layer_ids": layer_ids, "mask_token_id": mask,
            "shards": s.shards, "total_bytes": s.total_bytes(), "bf16_bytes": s.bf16_bytes, "seconds": seconds,
        });
        return emit(&format!("{out}\n"));
    }
    let verb = if seconds.is_some() { "wrote" } else { "would write" };
    let mut text = format!(
        "{verb} a DFlash drafter to {}: {} layers, {} query / {} key-value heads of {}, MLP {}, hidden {}, block {}, \
         target layers {layer_ids:?} of {}, mask token {mask}, seed {}\n",
        args.out.display(),
        args.layers,
        args.heads,
        args.kv_heads,
        args.head_dim,
        args.intermediate,
        target.hidden_size,
        args.block_size,
        target.num_hidden_layers,
        args.seed
    );
    let mut t = table(&["file", "tensors", "bytes", "size"], &[1, 2, 3]);
    for shard in &s.shards {
        t.add_row(vec![shard.name.clone(), shard.tensors.to_string(), shard.bytes.to_string(), gb(shard.bytes)]);
    }
    t.add_row(vec!["total".into(), String::new(), s.total_bytes().to_string(), gb(s.total_bytes())]);
    text += &format!("{t}\n");
    if let Some(t) = seconds {
        text += &format!("in {t:.1} s, plus config.json and model.safetensors.index.json\n");
    }
    emit(&text)
}
