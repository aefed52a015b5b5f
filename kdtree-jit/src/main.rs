//! `kdtree-jit`: list, render and compile the W4A16 GEMM variants (and tune them, with a GPU).

// Results reach stdout through `kdtree_jit::stdout::emit` only: `println!` panics on a closed or full
// stdout (`| head -c1`, `> /dev/full`).
#![deny(clippy::print_stdout)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> anyhow::Result<ExitCode> {
    match cli::run(cli::Cli::parse()) {
        // The reader went away (`kdtree-jit list | head`): nothing left to say.
        Err(e) if kdtree_jit::stdout::is_closed_pipe(&*e) => Ok(ExitCode::SUCCESS),
        result => result,
    }
}
