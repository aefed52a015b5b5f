//! `kdtree-jit render`: one variant's CUDA source, as NVRTC would compile it.

use std::process::ExitCode;

use anyhow::anyhow;

use super::family::render_named;

/// Print a variant's rendered CUDA source.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The variant's name, as `kdtree-jit list` or `compile` prints it, of any family.
    variant: String,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let source = render_named(&args.variant).ok_or_else(|| {
        anyhow!("`{}` is not a w4a16 or mla variant; `kdtree-jit list --family F` lists them", args.variant)
    })?;
    super::emit(&source?)?;
    Ok(ExitCode::SUCCESS)
}
