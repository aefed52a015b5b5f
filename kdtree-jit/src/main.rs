//! `kdtree-jit`: list, render and compile the W4A16 GEMM variants (and tune them, with a GPU).

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> anyhow::Result<ExitCode> {
    match cli::run(cli::Cli::parse()) {
        // The reader went away (`kdtree-jit list | head`): nothing left to say.
        Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) => {
            Ok(ExitCode::SUCCESS)
        }
        result => result,
    }
}
