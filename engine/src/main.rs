//! `kdtree-engine`: greedy and DDTree decoding of a DeepSeek-V3 / Kimi K2-architecture checkpoint, on
//! the GPU (`--backend cuda`, or `auto` when one is found) or the CPU reference backend; also writes
//! the tiny and Kimi K2-shaped test checkpoints it runs on.

// Results reach stdout through `kdtree_jit::stdout::emit` only: `println!` panics on a closed or full
// stdout (`| head -c1`, `> /dev/full`).
#![deny(clippy::print_stdout)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> anyhow::Result<ExitCode> {
    match cli::Cli::parse().run() {
        // The reader of stdout went away (`generate | head -c1`): nothing left to say.
        Err(e) if kdtree_jit::stdout::is_closed_pipe(&*e) => Ok(ExitCode::SUCCESS),
        result => result.map(|()| ExitCode::SUCCESS),
    }
}
