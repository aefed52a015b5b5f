//! `kdtree-engine`: run a DeepSeek-V3 / Kimi K2-architecture checkpoint on the CPU reference backend.

mod cli;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    cli::Cli::parse().run()
}
