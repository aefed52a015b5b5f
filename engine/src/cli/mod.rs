//! The command line: one module per subcommand.

mod backend;
mod bench;
mod generate;
mod make_drafter;
mod make_model;
mod make_tiny;
mod prompt;
mod serve;

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
    MakeDrafter(make_drafter::MakeDrafterArgs),
    MakeTiny(make_tiny::MakeTinyArgs),
    Serve(serve::ServeArgs),
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Generate(args) => generate::run(args),
            Command::Bench(args) => bench::run(args),
            Command::MakeModel(args) => make_model::run(args),
            Command::MakeDrafter(args) => make_drafter::run(args),
            Command::MakeTiny(args) => make_tiny::run(args),
            Command::Serve(args) => serve::run(args),
        }
    }
}

/// [`kdtree_jit::stdout::emit`], a failure naming stdout.
fn emit(text: &str) -> anyhow::Result<()> {
    kdtree_jit::stdout::emit(text).context("writing to stdout")
}
