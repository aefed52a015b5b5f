use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kdtree_engine::model::Layout;
use kdtree_engine::table::table;
use kdtree_engine::tiny::{Sharding, Summary, TinySpec, write_model};

use super::emit;

/// Write a random checkpoint with Kimi K2's real per-layer dimensions, for benchmarks.
///
/// Kimi K2's architecture and file layout, fewer layers and experts: hidden 7168; MLA attention
/// (q_lora_rank 1536, kv_lora_rank 512, 64 heads, query/key 128 + 64 rope dims, value 128); the
/// first --dense-layers layers with a dense MLP (intermediate 18432), the others MoE with --experts
/// routed experts of 2048 (top 8 of one group, sigmoid scores with noaux_tc, routed_scaling_factor
/// 2.827, normalised top-k, one shared expert); vocabulary 163840; rope_theta 50000 with YaRN factor
/// 32 over 4096 positions.
///
/// Routed experts are INT4 (symmetric, group 32, bf16 scales, compressed-tensors pack-quantized:
/// weight_packed, weight_scale, weight_shape) under K2's quantization_config; everything else is
/// bf16, the router biases f32. Weights are seeded uniform draws of variance 1/fan-in (INT4 ones
/// quantized from such draws), norms near 1, a router that spreads tokens over the experts; the same
/// seed and flags write the same bytes.
///
/// Sizes: the default (3 layers, 64 experts) is 9.45 GB; each further MoE layer adds 0.29 GB plus
/// 24.8 MB per expert (4 layers of 384 experts: 35 GB). --dry-run prints them without writing.
/// Tensors are made on all cores (about 0.3 GB/s per core) and written straight into the shards, so
/// memory stays at a few MB per core whatever the size; the disk is usually the limit. A progress
/// bar on stderr counts the bytes written.
#[derive(Debug, Args)]
pub struct MakeModelArgs {
    /// Folder to write (created if missing; existing files of the same names are replaced, once every
    /// file is written: a run that fails leaves the folder as it was).
    #[arg(long)]
    out: PathBuf,
    /// Decoder layers (K2 has 61), at least 1.
    #[arg(long, default_value_t = 3, value_parser = at_least(1, "a model needs a layer"))]
    layers: usize,
    /// Routed experts per MoE layer (K2 has 384; at least 8, the experts per token).
    #[arg(
        long,
        default_value_t = 64,
        value_parser = at_least(8, "each token is routed to 8 experts (num_experts_per_tok)")
    )]
    experts: usize,
    /// Leading layers with a dense MLP instead of MoE (first_k_dense_replace; K2 has 1).
    #[arg(long, default_value_t = 1)]
    dense_layers: usize,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Most bytes of tensors per safetensors shard: a number with an optional unit (B, KB, MB, GB,
    /// KiB, MiB, GiB). An INT4 weight's three tensors share a shard; a larger tensor gets its own.
    #[arg(long, value_parser = parse_bytes, default_value = "4GiB")]
    shard_size: u64,
    /// max_position_embeddings, the size of the engine's rope tables (K2 says 131072).
    #[arg(long, default_value_t = 4096)]
    max_position: usize,
    /// The checkpoint's layout: `causal-lm` (Kimi K2's) or `kimi-k25` (Kimi K2.5/K2.6's: model_type
    /// kimi_k25, text_config, language_model.* tensors, a small stand-in vision tower and projector).
    #[arg(long, value_enum, default_value_t = Layout::CausalLm)]
    layout: Layout,
    /// Print the files and sizes without writing anything.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: MakeModelArgs) -> anyhow::Result<()> {
    let spec = TinySpec {
        seed: args.seed,
        first_k_dense_replace: args.dense_layers,
        max_position_embeddings: args.max_position,
        sharding: Sharding::MaxBytes(args.shard_size),
        layout: args.layout,
        ..TinySpec::k2_slice(args.layers, args.experts)
    };
    let planned = spec.summary().with_context(|| {
        format!("make-model --layers {} --experts {} --dense-layers {}", args.layers, args.experts, args.dense_layers)
    })?;
    if args.dry_run {
        return print(&args, &planned, None);
    }
    let bar = ProgressBar::new(planned.tensor_bytes());
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}")
            .expect("a valid template"),
    );
    let start = Instant::now();
    let written = write_model(&args.out, &spec, &|n| bar.inc(n))
        .with_context(|| format!("--out {}: writing the model", args.out.display()))?;
    bar.finish_and_clear();
    print(&args, &written, Some(start.elapsed().as_secs_f64()))
}

fn print(args: &MakeModelArgs, s: &Summary, seconds: Option<f64>) -> anyhow::Result<()> {
    let rate = seconds.map(|t| s.total_bytes() as f64 / t.max(f64::MIN_POSITIVE));
    if args.json {
        let out = serde_json::json!({
            "out": args.out, "written": seconds.is_some(), "seed": args.seed, "layers": args.layers,
            "experts": args.experts, "dense_layers": args.dense_layers, "max_position": args.max_position,
            "shards": s.shards, "total_bytes": s.total_bytes(), "int4_bytes": s.int4_bytes,
            "bf16_bytes": s.bf16_bytes, "f32_bytes": s.f32_bytes, "seconds": seconds, "bytes_per_s": rate,
        });
        return emit(&format!("{out}\n"));
    }
    let verb = if seconds.is_some() { "wrote" } else { "would write" };
    let mut text = format!(
        "{verb} a Kimi K2 slice to {}: {} layers ({} dense), {} routed INT4 experts per MoE layer, seed {}\n",
        args.out.display(),
        args.layers,
        args.dense_layers.min(args.layers),
        args.experts,
        args.seed
    );
    let mut t = table(&["file", "tensors", "bytes", "size"], &[1, 2, 3]);
    for shard in &s.shards {
        t.add_row(vec![shard.name.clone(), shard.tensors.to_string(), shard.bytes.to_string(), String::new()]);
    }
    for (what, bytes) in [
        ("total", s.total_bytes()),
        ("of which INT4 experts (packed + scales)", s.int4_bytes),
        ("of which bf16", s.bf16_bytes),
        ("of which f32 router biases", s.f32_bytes),
    ] {
        t.add_row(vec![what.to_owned(), String::new(), bytes.to_string(), gb(bytes)]);
    }
    text += &format!("{t}\n");
    if let (Some(t), Some(r)) = (seconds, rate) {
        text += &format!("in {t:.1} s, {}/s, plus config.json and model.safetensors.index.json\n", gb(r as u64));
    }
    emit(&text)
}

pub(super) fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

/// A count of at least `min`; `why` says why fewer will not do.
pub(super) fn at_least(min: usize, why: &'static str) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |text| match text.parse::<usize>() {
        Ok(n) if n < min => Err(format!("{n} is too few: {why}, so at least {min}")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{text}` is not a count: {e}")),
    }
}

/// `4GiB`, `500MB`, `1048576`: bytes, with an optional decimal (KB, MB, GB) or binary (KiB, MiB,
/// GiB) unit.
pub(super) fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        other => return Err(format!("unknown unit `{other}`: expected B, KB, MB, GB, KiB, MiB or GiB")),
    };
    let n: u64 = number.parse().map_err(|_| format!("`{text}` is not a byte count such as 4GiB or 500MB"))?;
    match n.checked_mul(scale) {
        Some(0) => Err("a shard must hold at least one byte".into()),
        Some(bytes) => Ok(bytes),
        None => Err(format!("`{text}` is too large")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;
    use kdtree_engine::tiny::DEFAULT_SHARD_BYTES;

    #[test]
    fn byte_counts_take_decimal_and_binary_units() {
        assert_eq!(parse_bytes("4GiB"), Ok(DEFAULT_SHARD_BYTES));
        assert_eq!(parse_bytes("500 MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("123"), Ok(123));
        assert!(parse_bytes("0").is_err() && parse_bytes("4 GiBs").is_err() && parse_bytes("GiB").is_err());
    }
}
