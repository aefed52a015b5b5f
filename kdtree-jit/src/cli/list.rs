//! `kdtree-jit list`: the points of the variant space, valid or (with --all) not, and why.

use std::process::ExitCode;

use kdtree_jit::w4a16::W4a16;
use kdtree_jit::{Arch, Target, Variant};
use serde::Serialize;

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
}

#[derive(Serialize)]
struct Listed<V> {
    name: String,
    template: String,
    valid: bool,
    reason: Option<String>,
    axes: V,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let arch = super::arch_or_device(args.arch)?;
    let target = Target { arch };
    let all = W4a16::all();
    let listed: Vec<Listed<W4a16>> = all
        .iter()
        .map(|v| {
            let reason = v.check(&target).err().map(|invalid| invalid.to_string());
            Listed { name: v.name(), template: v.template(), valid: reason.is_none(), reason, axes: *v }
        })
        .filter(|l| args.all || l.valid)
        .collect();
    if args.json {
        super::emit(&(serde_json::to_string_pretty(&listed)? + "\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> =
        listed.iter().map(|l| vec![l.name.clone(), l.reason.clone().unwrap_or_else(|| "valid".into())]).collect();
    let valid = listed.iter().filter(|l| l.valid).count();
    let mut out = super::table(&["variant", &format!("on {arch}")], &rows);
    out += &format!("{valid} of {} {} variants are valid on {arch}\n", all.len(), W4a16::SPACE);
    super::emit(&out)?;
    Ok(ExitCode::SUCCESS)
}
