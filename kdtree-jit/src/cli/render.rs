//! `kdtree-jit render`: one variant's CUDA source, as NVRTC would compile it.

use std::process::ExitCode;

use anyhow::anyhow;
use kdtree_jit::w4a16::dense::DenseVariant;
use kdtree_jit::{Variant, render};

/// Print a variant's rendered CUDA source.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The variant's name, as `kdtree-jit list` or `compile` prints it: a tile or a wgmma variant.
    variant: String,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let v = DenseVariant::from_name(&args.variant).ok_or_else(|| {
        anyhow!("`{}` is not a {} variant; `kdtree-jit list` lists them", args.variant, DenseVariant::SPACE)
    })?;
    super::emit(&render(&v)?)?;
    Ok(ExitCode::SUCCESS)
}
