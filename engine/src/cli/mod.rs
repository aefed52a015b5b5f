//! The command line: one module per subcommand.

mod backend;
mod bench;
mod generate;
mod make_model;
mod make_tiny;
mod prompt;
mod serve;

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Greedy (and speculative) decoding of DeepSeek-V3 / Kimi K2-architecture checkpoints.
///
/// Models are Hugging Face-style folders: config.json plus safetensors shards (optionally with
/// model.safetensors.index.json); routed experts may be INT4 (compressed-tensors pack-quantized).
/// Ops run on the deterministic CPU reference backend, or with `--backend cuda` (the default `auto`
/// when a GPU is found) every op runs on the GPU, the INT4 linears with tuned kernels chosen from
/// the tuning DB.
#[derive(Debug, Parser)]
#[command(name = "kdtree-engine", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Generate(generate::GenerateArgs),
    Bench(bench::BenchArgs),
    MakeModel(make_model::MakeModelArgs),
    MakeTiny(make_tiny::MakeTinyArgs),
    Serve(serve::ServeArgs),
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Generate(args) => generate::run(args),
            Command::Bench(args) => bench::run(args),
            Command::MakeModel(args) => make_model::run(args),
            Command::MakeTiny(args) => make_tiny::run(args),
            Command::Serve(args) => serve::run(args),
        }
    }
}

/// Writes `text` to stdout and flushes it, so that a failed write is an error here and not a panic
/// (`println!`) or lost at exit (a buffered tail): a full disk (`generate > /dev/full`) is an error
/// naming stdout, a closed pipe (`generate | head -c1`) one that `main` ends on quietly
/// ([`is_closed_pipe`]).
fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).context("writing to stdout")
}

/// Whether `e` is a write to a pipe whose reader went away: nothing is left to say to anyone.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}
