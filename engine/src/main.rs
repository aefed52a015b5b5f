//! `kdtree-engine`: greedy and DDTree decoding of a DeepSeek-V3 / Kimi K2-architecture checkpoint, on
//! the GPU (`--backend cuda`, or `auto` when one is found) or the CPU reference backend; also writes
//! the tiny and Kimi K2-shaped test checkpoints it runs on.

mod cli;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    cli::Cli::parse().run()
}
