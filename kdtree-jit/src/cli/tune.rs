//! `kdtree-jit tune`: the fastest correct W4A16 variant per shape and M (or grouped variant per MoE
//! layer, routing and T) on this GPU, into the tuning DB.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kdtree_quant::Dtype;

use kdtree_jit::mla::{MlaKv, MlaShape};
use kdtree_jit::tune::db::{self, TuningDb};
use kdtree_jit::tune::dense16::{self, Dense16Request, tune_dense16};
use kdtree_jit::tune::flush::FlushMode;
use kdtree_jit::tune::key::{self, M_BUCKETS, MoePreset, RoutingDist, Shape};
use kdtree_jit::tune::mla::{self, tune_mla};
use kdtree_jit::tune::moe_gpu::MoeSession;
use kdtree_jit::tune::report::{self, Report, Row, StaleRow};
use kdtree_jit::tune::run::{self, ProblemOf, Progress, TuneOutcome, TuneRequest, Tuner};
use kdtree_jit::tune::session::Session;
use kdtree_jit::{Cache, Gpu, probe};

const HOW: &str = "\
How it works: for each shape and M, every variant left after pruning runs once on random data and is
compared with the CPU reference; a wrong one is reported with its error and never chosen. The correct
ones are timed with CUDA events, the L2 flushed before every rep (a 256 MiB read; see --flush): a
15-rep screen that gives up on any variant 1.5x slower than the best so far, then 100 reps of the 4
fastest, one of which wins; the median and the p10..p90 spread are reported. cuBLAS bf16 and f16
GEMM on the dequantized weight and the device's copy bandwidth are measured in the same run.

Pruning, per shape and M: only the requested dtype and group size; only what the device's arch
accepts and what can compute the shape (gemv and stream only up to their rows); no block with many
more rows than M (mma tiles above max(16, M), stream and gemv blocks above 4 M, M rounded up to a
power of two); no split-K once the grid alone is four waves of the SMs deep; no variant whose
compilation failed before with the same arch, NVRTC and templates (--retry-failed tries again). For
the kimi-k2 preset on an H200 this leaves 51 to 120 of the 288 valid bf16 group-32 variants (135
tiles, 153 wgmma for sm_90a) per (shape, M), 2584 in all; the whole preset, compiling them on 16
cores included, takes about 25 s.

kimi-k2-moe tunes grouped MoE steps instead: per routing and T (tokens of a forward: 1, 2, 4, ...,
256), the router's top-8 of 384 experts is drawn from a fixed seed (distinct experts per token;
uniform, or skewed with Zipf weights 1/(e+1)) and aligned; each candidate runs the gate-up grouped
product then the down one, as the engine does with one variant, both gated against the CPU
reference, then the pair is timed as one step as above (no cuBLAS peer). The experts cycle through
4 distinct random weights per projection, each at its own address, so the time is that of 384.
Pruning, per step: bf16 group 32 (25 of the 150 valid sm_90 grouped variants), then no tile taller
than 4x the rows of the busiest expert (rounded up to a power of two), the stream rule above. On
sm_90 this leaves 14 to 25 variants per step, 401 for both routings (uniform: 14 at T <= 2, 21 at
T = 4..16, 25 from T = 32; skewed: 25 from T = 4). Timing them takes seconds; the CPU reference
(about 180 G multiply-adds per routing over all T) takes most of the run.

kimi-k2-mla tunes absorbed MLA attention over a paged latent cache of --kv entries (pages of 64
entries, as the engine's): every valid decode variant is gated against the CPU reference on a causal block and a
tree, then screened at every (--rows, --context) point of a causal chain (L2 flushed); the variant
with the smallest mean of (its time / the point's best) wins, one for every forward, since a tree
row equals greedy decoding's only under the same variant. The engine reads it from the DB at load
(--mla-variant overrides).

kimi-k2-bf16 tunes the streamed 16-bit family (dense16: W as the checkpoint stores it, Y in f32) on
K2's bf16 decode weights, per shape and --m: the variants whose rows are M's bucket within 8..32 are
gated against the CPU reference (exact products, summed in f64) and timed as above, and cuBLAS (bf16
in, f32 out, the engine's other path) is timed on the same data, at M and at the 128 padded rows
that the engine's exact mode calls it with. The engine uses a shape's variant
for forwards of up to 128 rows where it beat cuBLAS at the M exact mode asks for.";

/// Tune W4A16 GEMM variants on this GPU and store the winners in the tuning DB.
#[derive(Debug, clap::Args)]
#[command(after_long_help = HOW)]
pub struct TuneArgs {
    /// A model's decode GEMMs, group 32, bf16, M = 1, 2, 4, ..., 128. kimi-k2-experts: N x K =
    /// 4096x7168 (an expert's gate and up, stacked into one weight by the engine's loader) and
    /// 7168x2048 (expert down), the W4A16 GEMMs the engine runs per shape for Kimi K2 (its experts
    /// with --per-expert-moe; its default grouped MoE kernel is tuned apart). kimi-k2: those and
    /// 18432x7168, 7168x18432 (one dense MLP projection, gate or up, and down), which K2's
    /// checkpoints hold in bf16 and the engine runs on cuBLAS: tuned for comparison.
    /// kimi-k2-moe: K2's routed experts as the engine runs them, grouped: 384 experts of those two
    /// shapes, top-8, one grouped variant for both projections, per T = 1, 2, 4, ..., 256 tokens and
    /// routing (--routing). kimi-k2-mla: K2's absorbed MLA attention (64 heads, latent 512, rope 64):
    /// one decode variant for every row count and context (exact decoding runs one), the one
    /// nearest the best over --rows x --context. kimi-k2-bf16: K2's bf16 decode weights (attention
    /// projections, shared and dense MLPs) on the streamed 16-bit family, beside cuBLAS, at --m.
    #[arg(long, required_unless_present = "shape", conflicts_with = "shape")]
    pub preset: Option<String>,
    /// kimi-k2-mla: the new rows per launch the grid times [default: 1,8,64].
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<usize>,
    /// kimi-k2-mla: the contexts (cached entries) the grid times [default: 4096,32768,131072].
    #[arg(long, value_delimiter = ',')]
    pub context: Vec<usize>,
    /// kimi-k2-mla: the cache's entries: bf16, or fp8 (e4m3 latent with a power-of-two scale per 32
    /// values, bf16 rope key: 656 bytes an entry against 1152; sm_89 and later).
    #[arg(long, default_value = "bf16")]
    pub kv: MlaKv,
    /// How an MoE preset's tokens are routed: uniform (a balanced router; what the engine looks
    /// up), skewed (Zipf-like, a few hot experts), or both. Default: both.
    #[arg(long, value_enum)]
    pub routing: Option<Routings>,
    /// A weight's N,K (repeat for several shapes).
    #[arg(long)]
    pub shape: Vec<Shape>,
    /// The M values (rows of X) to tune, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = M_BUCKETS)]
    pub m: Vec<u32>,
    /// K elements per scale: 32, 64 or 128.
    #[arg(long, default_value_t = 32)]
    pub group: u32,
    /// Activation (and scale) dtype: bf16 or f16.
    #[arg(long, default_value_t = Dtype::Bf16)]
    pub dtype: Dtype,
    #[command(flatten)]
    pub out: Output,
    /// Compile variants again even where the DB records that NVRTC refused them.
    #[arg(long)]
    pub retry_failed: bool,
}

/// Where results go; shared with `bench`.
#[derive(Debug, clap::Args)]
pub struct Output {
    /// The tuning DB. Default: the user's cache directory, kdtree/tuning.json.
    #[arg(long, env = db::ENV_VAR, value_parser = super::non_empty_path(db::ENV_VAR))]
    pub db: Option<PathBuf>,
    /// Print the results as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also draw time against M per shape (best variant, cuBLAS bf16, bandwidth floor) into this SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// The GPU to use, by CUDA ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// How the L2 is evicted before each timed rep: `read` leaves it clean; `write` (triton's
    /// do_bench) leaves it dirty, so every rep also pays for writing up to an L2's worth back.
    #[arg(long, value_enum, default_value_t = FlushMode::Read)]
    pub flush: FlushMode,
}

impl Output {
    /// The GPU first, so that a machine without one is told so before anything else; then NVRTC.
    pub fn open_gpu(&self, nvrtc: Option<&Path>, command: &str) -> anyhow::Result<Gpu> {
        let gpu = Gpu::open(self.gpu).with_context(|| format!("`{command}` measures on a GPU"))?;
        probe::load_nvrtc(nvrtc)?;
        Ok(gpu)
    }

    pub fn db_path(&self) -> PathBuf {
        self.db.clone().unwrap_or_else(TuningDb::default_path)
    }

    /// The DB's path and the DB. A file that is not a tuning DB is left as it is, and the error
    /// names the flag that picks another.
    pub fn open_db(&self) -> anyhow::Result<(PathBuf, TuningDb)> {
        let path = self.db_path();
        let db = TuningDb::open(&path).with_context(|| format!("--db {}", path.display()))?;
        Ok((path, db))
    }

    /// The table or the JSON on stdout, and the plot if asked for.
    pub fn emit(&self, session: &Session<'_>, rows: Vec<Row>, stale: Vec<StaleRow>) -> anyhow::Result<()> {
        if let Some(path) = &self.plot {
            kdtree_jit::tune::plot::write_svg(path, &rows)?;
        }
        if self.json {
            let (device, copy_gbps, flush) = (session.env.device.clone(), session.copy_gbps, session.flush_mode());
            let report = Report { device, copy_gbps, flush, rows, stale };
            return super::emit(&(serde_json::to_string_pretty(&report)? + "\n"));
        }
        let mut text = format!(
            "{} ({} SMs), copy bandwidth {:.0} GB/s, L2 flushed by a {} before each rep\n",
            session.env.device,
            session.sms,
            session.copy_gbps,
            session.flush_mode()
        )
        .into_bytes();
        report::write_table(&mut text, &rows)?;
        super::emit(&String::from_utf8(text)?)
    }
}

pub fn bar(len: u64, what: &str) -> ProgressBar {
    let style = ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {elapsed}").expect("a valid template");
    ProgressBar::new(len).with_style(style.progress_chars("=> ")).with_message(what.to_owned())
}

/// `--routing`'s values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Routings {
    Uniform,
    Skewed,
    Both,
}

impl Routings {
    fn list(self) -> &'static [RoutingDist] {
        match self {
            Routings::Uniform => &[RoutingDist::Uniform],
            Routings::Skewed => &[RoutingDist::Skewed],
            Routings::Both => &[RoutingDist::Uniform, RoutingDist::Skewed],
        }
    }
}

/// The MLA preset's name and head sizes (Kimi K2's; the scale does not change the time).
const MLA_PRESET: &str = "kimi-k2-mla";
const K2_MLA: MlaShape = MlaShape { heads: 64, nope: 128, rope: 64, v: 128, latent: 512, scale: 0.1352 };
/// The streamed 16-bit preset's name.
const DENSE16_PRESET: &str = "kimi-k2-bf16";

pub fn run(args: &TuneArgs, nvrtc: Option<&Path>) -> anyhow::Result<()> {
    if args.preset.as_deref() == Some(MLA_PRESET) {
        return run_mla(args, nvrtc);
    }
    if !args.rows.is_empty() || !args.context.is_empty() {
        bail!("--rows and --context are for --preset {MLA_PRESET} only");
    }
    if let Some(p) = args.preset.as_deref().and_then(key::moe_preset) {
        return run_moe(args, p, nvrtc);
    }
    if args.routing.is_some() {
        bail!("--routing is for the MoE presets ({}) only", moe_names());
    }
    if args.preset.as_deref() == Some(DENSE16_PRESET) {
        return run_dense16(args, nvrtc);
    }
    let mut request = match &args.preset {
        Some(name) => {
            let names: Vec<&str> = key::PRESETS.iter().map(|p| p.name).collect();
            let p = key::preset(name).with_context(|| {
                format!(
                    "unknown preset `{name}`: the presets are {}, {}, {MLA_PRESET}, {DENSE16_PRESET}",
                    names.join(", "),
                    moe_names()
                )
            })?;
            TuneRequest::preset(p)
        }
        None => TuneRequest::grid(&args.shape, &args.m, args.group, args.dtype),
    };
    request.retry_failed = args.retry_failed;
    let gpu = args.out.open_gpu(nvrtc, "tune")?;
    let mut session = Session::open(&gpu, args.out.flush)?;
    let (db_path, mut db, cache) = open_stores(&args.out)?;
    let outcome = tune_with_bars(&mut session, &mut db, &db_path, &cache, &request)?;
    finish(&args.out, &session, outcome)
}

/// `--preset` of an MoE layer: grouped steps per routing and T.
fn run_moe(args: &TuneArgs, preset: &MoePreset, nvrtc: Option<&Path>) -> anyhow::Result<()> {
    if args.out.plot.is_some() {
        bail!("--plot draws GEMM shapes against M; `{}` tunes MoE steps: leave it out", preset.name);
    }
    let mut request = TuneRequest::moe(preset, args.routing.unwrap_or(Routings::Both).list());
    request.retry_failed = args.retry_failed;
    let gpu = args.out.open_gpu(nvrtc, "tune")?;
    let mut session = Session::open(&gpu, args.out.flush)?;
    let (db_path, mut db, cache) = open_stores(&args.out)?;
    let outcome = tune_with_bars(&mut MoeSession(&mut session), &mut db, &db_path, &cache, &request)?;
    finish(&args.out, &session, outcome)
}

fn moe_names() -> String {
    key::MOE_PRESETS.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}

/// `--preset kimi-k2-mla`: the MLA decode variant of K2's heads, saved in the DB; a table of the
/// grid (or JSON) on stdout.
fn run_mla(args: &TuneArgs, nvrtc: Option<&Path>) -> anyhow::Result<()> {
    let or = |given: &[usize], default: &[usize]| if given.is_empty() { default.to_vec() } else { given.to_vec() };
    let (rows, contexts) = (or(&args.rows, &mla::ROWS), or(&args.context, &mla::CONTEXTS));
    if rows.iter().chain(&contexts).any(|&x| x == 0) || rows.iter().any(|&r| r > 1024) {
        bail!("--rows must be in 1..=1024 and --context at least 1");
    }
    let gpu = args.out.open_gpu(nvrtc, "tune")?;
    let mut session = Session::open(&gpu, args.out.flush)?;
    let (db_path, mut db, cache) = open_stores(&args.out)?;
    let mut progress: Option<ProgressBar> = None;
    let tuned =
        tune_mla(&mut session, &mut db, Some(&cache), &K2_MLA, args.kv, &rows, &contexts, &mut |done, total| {
            progress.get_or_insert_with(|| bar(total as u64, "tune")).set_position(done as u64)
        })?;
    progress.inspect(ProgressBar::finish_and_clear);
    db.save(&db_path).with_context(|| format!("--db {}", db_path.display()))?;
    for r in &tuned.rejected {
        eprintln!("{}: {} rejected: {}", tuned.key, r.variant, r.reason);
    }
    if args.out.json {
        return super::emit(&(serde_json::to_string_pretty(&tuned)? + "\n"));
    }
    let head = format!(
        "{} on {}: {} (mean {:.3}x the best over the grid), copy bandwidth {:.0} GB/s, saved to {}\n",
        tuned.key,
        session.env.device,
        tuned.variant,
        tuned.mean_slowdown,
        tuned.copy_gbps,
        db_path.display()
    );
    let rows: Vec<Vec<String>> = tuned
        .points
        .iter()
        .map(|p| {
            vec![
                p.rows.to_string(),
                p.context.to_string(),
                format!("{:.1}", p.chosen.median_us),
                format!("{:.0}", p.gbps),
                format!("{:.0}%", 100.0 * p.gbps / tuned.copy_gbps),
                format!("{:.0}", p.tflops),
                format!("{:.1} {}", p.best_us, p.best_variant),
            ]
        })
        .collect();
    let header = ["rows", "context", "µs", "latent GB/s", "% of copy", "TFLOP/s", "best here (screen µs)"];
    super::emit(&(head + &super::table(&header, &rows)))
}

/// `--preset kimi-k2-bf16`: the streamed 16-bit variant per K2 bf16 shape and M, beside cuBLAS,
/// saved in the DB; a table (or JSON) on stdout.
fn run_dense16(args: &TuneArgs, nvrtc: Option<&Path>) -> anyhow::Result<()> {
    if args.m.iter().any(|&m| m == 0 || m > 1024) {
        bail!("--m must be in 1..=1024 for {DENSE16_PRESET}");
    }
    let gpu = args.out.open_gpu(nvrtc, "tune")?;
    let mut session = Session::open(&gpu, args.out.flush)?;
    let (db_path, mut db, cache) = open_stores(&args.out)?;
    let mut progress: Option<ProgressBar> = None;
    let request = Dense16Request { shapes: &dense16::KIMI_K2_BF16, ms: &args.m, dtype: args.dtype, deadline: None };
    let tuned = tune_dense16(&mut session, &mut db, Some(&cache), &request, &mut |done, total| {
        progress.get_or_insert_with(|| bar(total as u64, "tune")).set_position(done as u64)
    })?;
    progress.inspect(ProgressBar::finish_and_clear);
    db.save(&db_path).with_context(|| format!("--db {}", db_path.display()))?;
    for t in &tuned {
        for r in &t.rejected {
            eprintln!("{}: {} rejected: {}", t.key, r.variant, r.reason);
        }
    }
    if args.out.json {
        let report = serde_json::json!({
            "device": session.env.device,
            "copy_gbps": session.copy_gbps,
            "flush": session.flush_mode(),
            "rows": tuned,
        });
        return super::emit(&(serde_json::to_string_pretty(&report)? + "\n"));
    }
    let head = format!(
        "{} ({} SMs), copy bandwidth {:.0} GB/s, saved to {}\n",
        session.env.device,
        session.sms,
        session.copy_gbps,
        db_path.display()
    );
    let us = |t: Option<kdtree_jit::tune::bench::Timing>| t.map_or("-".to_owned(), |t| format!("{:.1}", t.median_us));
    let rows: Vec<Vec<String>> = tuned
        .iter()
        .map(|t| {
            let ratio = match (t.timing, t.cublas) {
                (Some(ours), Some(blas)) => format!("{:.2}x", blas.median_us / ours.median_us),
                _ => "-".to_owned(),
            };
            vec![
                t.key.shape().to_string(),
                t.key.m_bucket.to_string(),
                t.variant.clone().unwrap_or_else(|| "none correct".to_owned()),
                us(t.timing),
                t.gbps.map_or("-".to_owned(), |g| format!("{g:.0}")),
                t.gbps.map_or("-".to_owned(), |g| format!("{:.0}%", 100.0 * g / session.copy_gbps)),
                us(t.cublas),
                ratio,
                us(t.cublas_padded),
            ]
        })
        .collect();
    let header = ["N x K", "M", "variant", "µs", "GB/s", "% of copy", "cuBLAS µs", "speedup", "cuBLAS 128 rows µs"];
    super::emit(&(head + &super::table(&header, &rows)))?;
    let failed: Vec<String> = tuned.iter().filter(|t| t.variant.is_none()).map(|t| t.key.to_string()).collect();
    if !failed.is_empty() {
        bail!("no correct variant for {}", failed.join(", "));
    }
    Ok(())
}

/// The DB's path, the DB, and the cubin cache.
fn open_stores(out: &Output) -> anyhow::Result<(PathBuf, TuningDb, Cache)> {
    let (db_path, db) = out.open_db()?;
    Ok((db_path, db, Cache::open(&Cache::default_dir())?))
}

/// [`run::tune`] with progress bars for compiling and tuning, rejections said on stderr as they
/// come, and the stale entries after.
fn tune_with_bars<T: Tuner>(
    tuner: &mut T,
    db: &mut TuningDb,
    db_path: &Path,
    cache: &Cache,
    request: &TuneRequest<ProblemOf<T>>,
) -> anyhow::Result<TuneOutcome<ProblemOf<T>>> {
    let (mut compiling, mut tuning) = (None::<ProgressBar>, None::<ProgressBar>);
    let outcome = run::tune(tuner, db, db_path, Some(cache), request, &mut |p| match p {
        Progress::Compiling { done, total } => {
            compiling.get_or_insert_with(|| bar(total as u64, "compile")).set_position(done as u64)
        }
        Progress::Compiled { refused, .. } => {
            compiling.take().inspect(ProgressBar::finish_and_clear);
            if refused > 0 {
                eprintln!("{refused} variants did not compile (logs in {}); the others are tuned", db_path.display());
            }
        }
        Progress::Tuning { candidates } => tuning = Some(bar(candidates as u64, "tune")),
        Progress::Gated => tuning.iter().for_each(|b| b.inc(1)),
        Progress::Tuned(tuned) => {
            for r in &tuned.rejected {
                let line = format!("{}: {} rejected: {}", tuned.key, r.variant, r.reason);
                match &tuning {
                    Some(b) => b.suspend(|| eprintln!("{line}")),
                    None => eprintln!("{line}"),
                }
            }
        }
    })?;
    tuning.inspect(ProgressBar::finish_and_clear);
    print_stale(&outcome.stale, db_path);
    Ok(outcome)
}

/// The table or JSON of `outcome`; an error naming the problems no variant was correct for.
fn finish<P>(out: &Output, session: &Session<'_>, outcome: TuneOutcome<P>) -> anyhow::Result<()> {
    let rows = outcome.entries.iter().map(Row::from_entry).collect();
    out.emit(session, rows, outcome.stale)?;
    if !outcome.failed.is_empty() {
        let failed: Vec<String> = outcome.failed.iter().map(|f| f.key.to_string()).collect();
        bail!("no correct variant for {}", failed.join(", "));
    }
    Ok(())
}

/// The DB's entries from other environments, also said on stderr: they are kept but never used here.
pub fn stale_rows(db: &TuningDb, session: &Session<'_>, path: &Path) -> Vec<StaleRow> {
    let rows = report::stale_rows(db, &session.env);
    print_stale(&rows, path);
    rows
}

fn print_stale(rows: &[StaleRow], path: &Path) {
    if !rows.is_empty() {
        eprintln!("{} entries of {} are stale here and not used:", rows.len(), path.display());
        for r in rows {
            eprintln!("  {} M={} {}: {}", r.shape, r.m_bucket, r.variant, r.differences.join("; "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_db_file_that_is_not_a_tuning_db_is_an_error_naming_the_flag_that_picks_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tuning.json");
        std::fs::write(&path, "not json").unwrap();
        let out = Output { db: Some(path.clone()), json: false, plot: None, gpu: 0, flush: FlushMode::Read };
        let message = format!("{:#}", out.open_db().unwrap_err());
        assert!(message.starts_with(&format!("--db {}: ", path.display())), "{message}");
        assert!(message.contains("not JSON") && message.contains("left as it is"), "{message}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not json", "the file was changed");
    }
}
