//! `kdtree-jit render`: one variant's CUDA source, as NVRTC would compile it.

use std::process::ExitCode;

use anyhow::anyhow;
use kdtree_jit::w4a16::W4a16;
use kdtree_jit::{Variant, render};

/// Print a variant's rendered CUDA source.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The variant's name, as `kdtree-jit list` prints it.
    variant: String,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let v = W4a16::from_name(&args.variant)
        .ok_or_else(|| anyhow!("`{}` is not a {} variant; `kdtree-jit list` lists them", args.variant, W4a16::SPACE))?;
    super::emit(&render(&v)?)?;
    Ok(ExitCode::SUCCESS)
}
