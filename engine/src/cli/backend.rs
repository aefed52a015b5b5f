//! `--backend` and its options, shared by the subcommands that run a model.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kdtree_engine::Model;
use kdtree_engine::cuda::{
    CudaBackend, CudaOptions, KvBudget, MAX_STREAMED_ROWS, Mode, MoeKernels, Plan, Source, StartupProgress,
};
use kdtree_engine::model::DEFAULT_PREFILL_CHUNK;
use kdtree_engine::registry::{Backend, BackendKind, ComputeDtype, KvDtype, Selection, select};
use kdtree_engine::table::table;
use kdtree_jit::Variant;
use kdtree_jit::mla::MlaDecode;
use kdtree_jit::tune::db::TuningDb;
use kdtree_jit::tune::run::Progress;
use kdtree_jit::w4a16::grouped::W4a16Grouped;

/// Where ops run. On CUDA every op of the forward runs on the GPU: W4A16 linears with tuned kernels
/// (one variant per weight shape, from the tuning DB), dense linears with cuBLAS, the rest with
/// kdtree-kernels' JIT-compiled kernels.
#[derive(Debug, Args)]
pub struct BackendArgs {
    /// `auto`: CUDA when a GPU, its driver and NVRTC are found, else the CPU (with a one-line note).
    /// `cuda` without a GPU is an error.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
    /// Tuning DB that picks each W4A16 shape's kernel variant [default: $KDTREE_TUNING_DB, else
    /// <user cache dir>/kdtree/tuning.json]. A shape without a fresh entry runs the default variant
    /// (mma 16x64x128, 4 warps, 4 stages, no split-K, f32 sums), with a note.
    #[arg(long, value_name = "PATH")]
    pub tuning_db: Option<PathBuf>,
    /// Exact mode (the default): one variant per weight shape for every M, the DB's best for the
    /// bucket of this M [default: the tree size, budget + 1, with --spec ddtree; else 1], so that tree
    /// and one-token forwards agree bit for bit and DDTree's output equals greedy decoding's.
    #[arg(long, value_name = "M")]
    pub exact_variant_m: Option<usize>,
    /// The DB's best variant per M bucket: faster, but gives up bitwise equality of tree and
    /// sequential forwards, so DDTree may no longer reproduce greedy decoding token for token.
    #[arg(long, conflicts_with = "exact_variant_m")]
    pub fast: bool,
    /// Run routed INT4 experts one launch chain per expert, with the routing read back to the host
    /// each MoE layer, instead of the grouped kernel: for comparing the two.
    #[arg(long, conflicts_with = "grouped_variant")]
    pub per_expert_moe: bool,
    /// The grouped MoE kernel's variant, e.g. w4a16_grouped_bf16_g32_m8n64k128_w4_s4_f32acc
    /// [default: bm 8, 4 warps, bk 128, 4 stages (2 where shared memory is short)].
    #[arg(long, value_name = "NAME", value_parser = grouped_variant)]
    pub grouped_variant: Option<W4a16Grouped>,
    /// The MLA attention kernel's variant, e.g. mla_decode_mma_h64n32_s2_x64 (`kdtree-jit list --family
    /// mla` lists them) [default: the tuning DB's, else on sm_90 mla_decode_wgmma_h64n64_s2_x64; elsewhere
    /// 64 heads a block, 32-entry tiles, 2 stages, up to 64 splits (16-entry tiles in 1 stage where
    /// shared memory is short)]. Every variant gives a row the same bits however many rows run with it.
    #[arg(long, value_name = "NAME", value_parser = mla_variant)]
    pub mla_variant: Option<MlaDecode>,
    /// Run every forward op by op. By default a forward of up to 256 tokens is recorded as a CUDA
    /// graph the second time its size runs, and replayed after that: one launch a step instead of
    /// one per op. Forwards whose MoE layers read their routing back (--per-expert-moe) and
    /// profiled forwards always run op by op.
    #[arg(long)]
    pub no_graphs: bool,
    /// With --kv-dtype fp8 on CUDA: forwards of 8 rows or more (trees, prompt chunks) read the FP8
    /// entries through a bf16 copy of one layer at a time, widened once for all their rows (the
    /// same bits as the FP8 kernels, faster), for which every page keeps bf16 room for one layer
    /// (1152 bytes a token at Kimi K2's sizes). This flag runs every forward on the FP8 kernels and
    /// gives that room to tokens.
    #[arg(long)]
    pub no_fp8_widen: bool,
    /// Which GPU (0 is the first).
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Seconds to spend at startup tuning what this model runs that the tuning DB has no fresh entry
    /// for: the W4A16 problems (shape, M bucket), the grouped MoE step of INT4 routed experts
    /// (unless --grouped-variant is given), then the dense bf16/f16 linears on the streamed family
    /// (against cuBLAS, at the M the plan asks for); the results are saved to the DB, so the
    /// budget is spent only on what it lacks, once. A problem started within the budget is
    /// finished. 0: no tuning, the DB's entries, the default variant and cuBLAS for the rest.
    /// Ignored on the CPU.
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = seconds, allow_negative_numbers = true)]
    pub tune_budget: Duration,
    /// What the KV cache's pages may take on the GPU: a fraction of the memory free after the
    /// weights (0.9) or bytes with a unit (40GiB, 512MiB). The most tokens that fit is printed at
    /// startup; a longer context is an error naming this bound. Ignored on the CPU.
    #[arg(long, value_name = "FRACTION|BYTES", default_value = "0.9", value_parser = kv_budget)]
    pub kv_memory: KvBudget,
    /// The dtype dense weights are computed in [default: the checkpoint's, its embedding table's
    /// dtype]: an f32 checkpoint computes in f32 (on CUDA: f32 GEMMs with no TF32, f32 attention and
    /// KV cache), a bf16 one in bf16. Another dtype converts each dense weight as it loads (bf16 and
    /// f16 round to nearest even). INT4 weights, norms and the router are not converted. CUDA
    /// computes in bf16 or f32 only. The choice is printed with the KV cache's line.
    #[arg(long, value_enum)]
    pub dtype: Option<ComputeDtype>,
    /// How the KV cache stores MLA's latent entries [default: f32 when the compute dtype (--dtype) is
    /// f32, else bf16]. fp8: the latent in e4m3 with a power-of-two scale per 32 values, the rope key
    /// in bf16 (656 bytes a token a layer at Kimi K2's sizes against bf16's 1152; its numerics differ
    /// from bf16's: greedy tokens may part). On the CPU any; on CUDA f32 for an f32 compute dtype,
    /// bf16 or fp8 (sm_89 and later) for bf16.
    #[arg(long, value_enum)]
    pub kv_dtype: Option<KvDtype>,
    /// Prompt tokens per forward of the prefill: a prompt of any length runs in causal chunks of
    /// this many tokens, which changes no bits of the result, only the memory a forward needs.
    #[arg(long, value_name = "TOKENS", default_value_t = DEFAULT_PREFILL_CHUNK, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub prefill_chunk: usize,
}

impl BackendArgs {
    /// Loads the model in `dir` on `backend` in --dtype (default: the checkpoint's dtype).
    pub fn load<B: Backend>(&self, dir: &Path, backend: Arc<B>) -> anyhow::Result<Model<B>> {
        let model = Model::load_as(dir, backend, self.dtype).with_context(|| format!("loading {}", dir.display()));
        if self.dtype.is_some() { model.context("--dtype") } else { model }
    }

    /// Applies the model options (--kv-dtype, --prefill-chunk) to a loaded model, and describes its
    /// compute dtype and KV cache in one line for people (after a line of the tensors the load
    /// skipped, if any).
    pub fn configure<B: Backend>(&self, model: &mut Model<B>) -> anyhow::Result<String> {
        if let Some(kv) = self.kv_dtype {
            model.set_kv_dtype(kv).context("--kv-dtype")?;
        }
        if let (Some(v), Some(kv)) = (self.mla_variant, model.heads().kv.latent())
            && v.kv != kv
        {
            anyhow::bail!(
                "--mla-variant {} reads a{} cache, the model's is {} (--kv-dtype)",
                kdtree_jit::Variant::name(&v),
                if v.kv == kdtree_jit::mla::MlaKv::Fp8 { "n fp8" } else { " bf16" },
                kv.name()
            );
        }
        model.set_prefill_chunk(self.prefill_chunk)?;
        let h = model.heads();
        let skipped = model.skipped();
        let skipped = if skipped.tensors > 0 { format!("{skipped}\n") } else { String::new() };
        Ok(format!(
            "{skipped}compute dtype: {}; KV cache: MLA latent in {}, {} bytes a token a layer, {} bytes a token over {} layers; prefill in chunks of {} tokens",
            model.dtypes(),
            h.kv.name(),
            h.kv_bytes_per_token(1),
            h.kv_bytes_per_token(model.config.num_hidden_layers),
            model.config.num_hidden_layers,
            self.prefill_chunk
        ))
    }
}

/// `--kv-memory`: a fraction in (0, 1], or a whole number of bytes with an optional KiB/MiB/GiB unit.
fn kv_budget(s: &str) -> Result<KvBudget, String> {
    let bad = || format!("`{s}` is neither a fraction in (0, 1] nor bytes such as 40GiB");
    if let Ok(f) = s.parse::<f64>()
        && s.contains('.')
    {
        return if f > 0.0 && f <= 1.0 { Ok(KvBudget::FreeFraction(f)) } else { Err(bad()) };
    }
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let scale: usize = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(bad()),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&b| b > 0)
        .map(KvBudget::Bytes)
        .ok_or_else(bad)
}

impl BackendArgs {
    /// Opens the backend for the model in `model` and, on a GPU, tunes what it lacks within
    /// --tune-budget; `default_m` is the M exact mode tunes for when --exact-variant-m is absent.
    /// Prints a one-line note to stderr when `auto` falls back to the CPU. `None` is the CPU.
    pub fn open(&self, model: &Path, default_m: usize) -> anyhow::Result<Option<CudaBackend>> {
        let mode = if self.fast { Mode::Fast } else { Mode::Exact { m: self.exact_variant_m.unwrap_or(default_m) } };
        let tuning_db = self.tuning_db.clone().unwrap_or_else(TuningDb::default_path);
        let moe = if self.per_expert_moe { MoeKernels::PerExpert } else { MoeKernels::Grouped(self.grouped_variant) };
        let options = CudaOptions {
            ordinal: self.gpu,
            tuning_db,
            mode,
            moe,
            graphs: !self.no_graphs,
            kv_budget: self.kv_memory,
            mla: self.mla_variant,
            fp8_widen: !self.no_fp8_widen,
        };
        // Only `cuda` is an error here (`auto` falls back to the CPU with a note): the flag that asked for it.
        Ok(match select(self.backend, || CudaBackend::open(&options)).context("--backend cuda")? {
            Selection::Cpu { note } => {
                if let Some(note) = note {
                    eprintln!("{note}");
                }
                None
            }
            Selection::Gpu(mut gpu) => {
                tune_at_startup(&mut gpu, model, self.dtype, self.tune_budget)?;
                Some(gpu)
            }
        })
    }
}

/// Tunes what the model lacks, with progress bars on stderr and a one-line summary.
fn tune_at_startup(
    cuda: &mut CudaBackend,
    model: &Path,
    dtype: Option<ComputeDtype>,
    budget: Duration,
) -> anyhow::Result<()> {
    let bar = |len: usize, what: &str| {
        let style =
            ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {elapsed}").expect("a valid template");
        ProgressBar::new(len as u64).with_style(style.progress_chars("=> ")).with_message(what.to_owned())
    };
    let (mut compiling, mut tuning, mut dense) = (None::<ProgressBar>, None::<ProgressBar>, None::<ProgressBar>);
    let summary = cuda
        .tune_at_startup(model, dtype, budget, &mut |p| match p {
            StartupProgress::W4a16(Progress::Compiling { done, total }) => {
                compiling.get_or_insert_with(|| bar(total, "compile")).set_position(done as u64)
            }
            StartupProgress::W4a16(Progress::Compiled { .. }) => {
                compiling.take().into_iter().for_each(|b| b.finish_and_clear())
            }
            // One run per group size and dtype, each with its own bar.
            StartupProgress::W4a16(Progress::Tuning { candidates }) => {
                tuning.replace(bar(candidates, "tune")).into_iter().for_each(|b| b.finish_and_clear())
            }
            StartupProgress::W4a16(Progress::Gated) => tuning.iter().for_each(|b| b.inc(1)),
            StartupProgress::W4a16(Progress::Tuned(_)) => {}
            // After the W4A16 problems, one bar for the dense shapes.
            StartupProgress::Dense16 { done, total } => {
                tuning.take().into_iter().for_each(|b| b.finish_and_clear());
                dense.get_or_insert_with(|| bar(total, "dense16")).set_position(done as u64)
            }
        })
        .with_context(|| format!("tuning {} at startup (--tune-budget 0 skips it)", model.display()))?;
    tuning.into_iter().chain(dense).for_each(|b| b.finish_and_clear());
    if let Some(summary) = summary {
        eprintln!("{summary}");
    }
    Ok(())
}

/// A duration in seconds, as --tune-budget takes it.
fn seconds(text: &str) -> Result<Duration, String> {
    let s: f64 = text.parse().map_err(|_| format!("`{text}` is not a number of seconds"))?;
    Duration::try_from_secs_f64(s).map_err(|_| format!("{text} seconds: a budget is 0 or more, and finite"))
}

/// One row per weight shape a kdtree-jit kernel can run: each W4A16 shape's variant and where it
/// came from, and each dense 16-bit shape's streamed variant or cuBLAS; as a table and as JSON.
pub fn variant_table(cuda: &CudaBackend) -> (String, serde_json::Value) {
    let (plans, streamed) = (cuda.plans(), cuda.streamed_plans());
    if plans.is_empty() && streamed.is_empty() {
        return (String::new(), serde_json::Value::Array(Vec::new()));
    }
    let mut t = table(&["weight shape", "M", "variant", "source"], &[1]);
    let mut rows = Vec::new();
    // The table's cells (shape, M, variant, source), and the JSON's shape and source.
    let mut row = |cells: [String; 4], shape: serde_json::Value, source: serde_json::Value| {
        let [_, m, variant, _] = &cells;
        rows.push(serde_json::json!({ "shape": shape, "m": m, "variant": variant, "source": source }));
        t.add_row(cells.to_vec());
    };
    for (shape, plan) in plans {
        for (m, choice) in rows_of(&plan) {
            let source = match &choice.source {
                Source::Tuned { bucket, nearest: false } => format!("tuned at M bucket {bucket}"),
                Source::Tuned { bucket, nearest: true } => format!("tuned at M bucket {bucket} (nearest)"),
                Source::Default { reason } => format!("default: {reason}"),
            };
            let cells = [format!("W4A16 {shape}"), m, choice.variant.name(), source];
            row(cells, serde_json::json!(shape), serde_json::json!(choice.source));
        }
    }
    for (shape, variant) in streamed {
        let (m, variant, source) = match variant {
            Some(v) => (format!("1-{MAX_STREAMED_ROWS}"), v.name(), "tuned, faster than cuBLAS"),
            None => ("all".to_owned(), "cuBLAS".to_owned(), "no tuned streamed variant faster than cuBLAS"),
        };
        row(
            [format!("dense {shape}"), m, variant, source.to_owned()],
            serde_json::json!(shape),
            serde_json::json!(source),
        );
    }
    (format!("{t}\n"), serde_json::Value::Array(rows))
}

/// The (M range, choice) rows of a plan: per bucket in fast mode, then the variant for all other M.
fn rows_of(plan: &Plan) -> Vec<(String, &kdtree_engine::cuda::VariantChoice)> {
    let range = |b: u32| if b == 1 { "1".to_owned() } else { format!("{}-{b}", b / 2 + 1) };
    let mut rows: Vec<(String, _)> = plan.by_bucket.iter().map(|(b, c)| (range(*b), c)).collect();
    rows.push((if rows.is_empty() { "all".into() } else { "other".into() }, &plan.general));
    rows
}

/// A grouped variant by name.
fn mla_variant(name: &str) -> Result<MlaDecode, String> {
    MlaDecode::from_name(name)
        .ok_or_else(|| format!("`{name}` is not an MLA decode variant (mla_decode_mma_... or mla_decode_wgmma_...)"))
}

fn grouped_variant(name: &str) -> Result<W4a16Grouped, String> {
    W4a16Grouped::from_name(name).ok_or_else(|| format!("`{name}` is not a grouped W4A16 variant (w4a16_grouped_...)"))
}
