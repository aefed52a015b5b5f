//! `kdtree-jit compile`: every valid variant, in parallel, through the cubin cache.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use kdtree_jit::cache::CACHE_DIR_ENV;
use kdtree_jit::compile::CompileReport;
use kdtree_jit::{Arch, Cache, KernelStats, nvrtc_version, probe};
use serde::Serialize;

use super::family::Family;

/// Compile every variant of a family a device of an arch runs with NVRTC (no GPU needed): by default
/// every family (wgmma on sm_90 only, for sm_90a). Prints each one's registers,
/// spills, shared memory and compile time; exits non-zero if any variant fails, printing NVRTC's log.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Arch to compile for, as sm_120 or 120 [default: GPU 0's].
    #[arg(long)]
    arch: Option<Arch>,
    /// Only variants whose name contains this (at least one must).
    #[arg(long, value_name = "SUBSTR")]
    filter: Option<String>,
    /// Only these families (default: every one); repeat or comma-separate.
    #[arg(long, value_enum, value_delimiter = ',')]
    family: Vec<Family>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Cubin cache directory [default: the user's cache dir, kdtree/cubin].
    #[arg(long, env = CACHE_DIR_ENV, value_name = "DIR", value_parser = super::non_empty_path(CACHE_DIR_ENV))]
    cache_dir: Option<PathBuf>,
    /// Compile everything afresh, neither reading nor writing the cache.
    #[arg(long)]
    no_cache: bool,
}

#[derive(Serialize)]
struct Summary {
    arch: Arch,
    nvrtc: String,
    wall_ms: f64,
    compiled: Vec<CompileReport>,
    errors: Vec<Failure>,
}

#[derive(Serialize)]
struct Failure {
    variant: String,
    error: String,
}

/// Compiles; NVRTC is loaded from `nvrtc` (see [`probe::load_nvrtc`]) once there is something to compile.
pub fn run(args: &Args, nvrtc: Option<&Path>) -> anyhow::Result<ExitCode> {
    let arch = super::arch_or_device(args.arch)?;
    let filter = args.filter.as_deref().unwrap_or_default();
    let families =
        if args.family.is_empty() { clap::ValueEnum::value_variants().to_vec() } else { args.family.clone() };
    let mut total = 0;
    for f in &families {
        total += f.count(arch, filter)?;
    }
    if total == 0 {
        bail!("no variant valid on {arch} has `{filter}` in its name (`kdtree-jit list --arch {arch}` lists them)");
    }
    probe::load_nvrtc(nvrtc)?;
    let cache = match args.no_cache {
        true => None,
        false => Some(Cache::open(&args.cache_dir.clone().unwrap_or_else(Cache::default_dir))?),
    };

    let bar = ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("compiling {pos}/{len} {wide_bar} {elapsed} (eta {eta})")
            .expect("a valid template"),
    );
    let start = Instant::now();
    let mut results = Vec::new();
    for f in families {
        let before = results.len() as u64;
        results.extend(f.compile(arch, filter, cache.as_ref(), &|done| bar.set_position(before + done as u64)));
    }
    bar.finish_and_clear();
    let wall = start.elapsed();

    let (mut compiled, mut errors) = (Vec::new(), Vec::new());
    for (name, result) in results {
        match result {
            Ok(c) => compiled.push(CompileReport::from(&c)),
            Err(e) => errors.push(Failure { variant: name, error: e.to_string() }),
        }
    }
    let (major, minor) = nvrtc_version()?;
    let summary =
        Summary { arch, nvrtc: format!("{major}.{minor}"), wall_ms: wall.as_secs_f64() * 1e3, compiled, errors };
    if args.json {
        super::emit(&(serde_json::to_string_pretty(&summary)? + "\n"))?;
    } else {
        print_human(&summary)?;
    }
    Ok(if summary.errors.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// A ptxas figure, or "?" where NVRTC's log did not report it.
fn known(stats: &KernelStats, figure: String) -> String {
    if stats.reported { figure } else { "?".into() }
}

fn print_human(s: &Summary) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = s
        .compiled
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                known(&r.stats, r.stats.registers.to_string()),
                known(&r.stats, format!("{}/{}", r.stats.spill_stores, r.stats.spill_loads)),
                known(&r.stats, r.stats.shared_bytes.to_string()),
                format!("{:.0}", r.compile_ms),
                if r.cached { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    let header = ["variant", "registers", "spill st/ld B", "static smem B", "ms", "cached"];
    super::emit(&super::table(&header, &rows))?;
    for r in s.compiled.iter().filter(|r| r.cache_error.is_some()) {
        eprintln!("cache: {}", r.cache_error.as_deref().unwrap_or_default());
    }
    for f in &s.errors {
        eprintln!("\n{}: {}", f.variant, f.error);
    }
    let cached = s.compiled.iter().filter(|r| r.cached).count();
    super::emit(&format!(
        "{} variants for {} (NVRTC {}) in {:.1} s, {cached} from the cache, {} errors\n",
        s.compiled.len() + s.errors.len(),
        s.arch,
        s.nvrtc,
        s.wall_ms / 1e3,
        s.errors.len()
    ))
}
