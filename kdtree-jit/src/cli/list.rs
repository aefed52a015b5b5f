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
    /// Which kernel families (repeat the flag for several) [default: every family].
    #[arg(long, value_enum)]
    family: Vec<Family>,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let arch = super::arch_or_device(args.arch)?;
    let families: Vec<Family> =
        if args.family.is_empty() { clap::ValueEnum::value_variants().to_vec() } else { args.family.clone() };
    let (mut listed, mut counts) = (Vec::new(), Vec::new());
    for family in families {
        let all = family.points(arch)?;
        counts.push((family, all.iter().filter(|p| p.valid).count(), all.len()));
        listed.extend(all.into_iter().filter(|p| args.all || p.valid));
    }
    if args.json {
        super::emit(&(serde_json::to_string_pretty(&listed)? + "\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> =
        listed.iter().map(|l| vec![l.name.clone(), l.reason.clone().unwrap_or_else(|| "valid".into())]).collect();
    let mut out = super::table(&["variant", &format!("on {arch}")], &rows);
    for (family, valid, total) in counts {
        out += &format!("{valid} of {total} {} variants are valid on {arch}\n", family.space());
    }
    super::emit(&out)?;
    Ok(ExitCode::SUCCESS)
}
