//! `kdtree-jit list`: the points of the variant space, valid or (with --all) not, and why.

use std::process::ExitCode;

use kdtree_jit::Arch;

use super::family::Family;

/// List the variant space: the variants valid on an arch, or all of them with the reason each
/// invalid one is rejected.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Arch to check validity against, as sm_90 or 90 [default: GPU 0's].
    #[arg(long)]
    arch: Option<Arch>,
    /// Also list the invalid variants, with their reasons.
    #[arg(long)]
    all: bool,
    /// Print JSON (one object per variant, with its axes) instead of a table.
    #[arg(long)]
    json: bool,
    /// Which kernel family.
    #[arg(long, value_enum, default_value = "tiles")]
    family: Family,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let arch = super::arch_or_device(args.arch)?;
    let all = args.family.points(arch)?;
    let total = all.len();
    let listed: Vec<_> = all.into_iter().filter(|l| args.all || l.valid).collect();
    if args.json {
        super::emit(&(serde_json::to_string_pretty(&listed)? + "\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> =
        listed.iter().map(|l| vec![l.name.clone(), l.reason.clone().unwrap_or_else(|| "valid".into())]).collect();
    let valid = listed.iter().filter(|l| l.valid).count();
    let mut out = super::table(&["variant", &format!("on {arch}")], &rows);
    out += &format!("{valid} of {total} {} variants are valid on {arch}\n", args.family.space());
    super::emit(&out)?;
    Ok(ExitCode::SUCCESS)
}
