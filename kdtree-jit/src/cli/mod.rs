//! The command line: one module per subcommand.

mod bench;
mod compile;
mod family;
mod list;
mod render;
mod tune;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kdtree_jit::{Arch, Gpu, probe};

const ENVIRONMENT: &str = "\
Environment:
  KDTREE_NVRTC_DIR   directory holding libnvrtc.so.13 (or a `pip install --target` root); same as --nvrtc
  KDTREE_CACHE_DIR   where compiled cubins are cached; same as --cache-dir
Without --nvrtc, NVRTC is looked for in the workspace's target/nvrtc, then on the system loader path.
The cubin cache is created private (0700); one that is not the user's, or that group or others may
write, is refused, since whoever writes it chooses the code the GPU runs.";

/// Declared kernel variants (W4A16 GEMMs, MLA attention): list them, render them to CUDA, compile
/// them with NVRTC; tune and benchmark the GEMMs.
#[derive(Debug, Parser)]
#[command(name = "kdtree-jit", version, after_help = ENVIRONMENT)]
pub struct Cli {
    /// Directory holding libnvrtc.so.13, or a `pip install --target` root.
    #[arg(long, global = true, env = probe::NVRTC_DIR_ENV, value_name = "DIR", value_parser = non_empty_path(probe::NVRTC_DIR_ENV))]
    nvrtc: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    List(list::Args),
    Render(render::Args),
    Compile(compile::Args),
    Tune(tune::TuneArgs),
    Bench(bench::BenchArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::List(args) => list::run(&args),
        Command::Render(args) => render::run(&args),
        Command::Compile(args) => compile::run(&args, cli.nvrtc.as_deref()),
        Command::Tune(args) => tune::run(&args, cli.nvrtc.as_deref()).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bench::run(&args, cli.nvrtc.as_deref()).map(|()| ExitCode::SUCCESS),
    }
}

/// [`kdtree_jit::stdout::emit`], a failure naming stdout.
fn emit(text: &str) -> anyhow::Result<()> {
    kdtree_jit::stdout::emit(text).context("writing to stdout")
}

/// The parser of a path flag that `env`, an environment variable, may also set: an empty path is
/// refused saying so. clap's own error for one reads as if the flag were missing ("a value is
/// required"), which misleads when the variable is set to nothing.
fn non_empty_path(env: &'static str) -> impl Fn(&str) -> Result<PathBuf, String> + Clone + Send + Sync {
    move |text| match text {
        "" => Err(format!("the path is empty (is {env} set to nothing?): give a path, or unset {env}")),
        path => Ok(PathBuf::from(path)),
    }
}

/// `--arch`, or else the arch of GPU 0.
fn arch_or_device(arch: Option<Arch>) -> anyhow::Result<Arch> {
    match arch {
        Some(arch) => Ok(arch),
        None => Ok(Gpu::open(0).context("no --arch given and no GPU to take it from")?.arch),
    }
}

/// Left-aligned columns, two spaces apart, with a header.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells.zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out += &line(&mut row.iter().map(String::as_str));
    }
    out
}
