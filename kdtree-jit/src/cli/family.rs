//! The variant families `list`, `render` and `compile` serve: every kernel family the toolkit and the
//! engine run, each a declared space.

use kdtree_jit::dense16::Dense16;
use kdtree_jit::mla::{MlaAux, MlaDecode};
use kdtree_jit::mla_f32::MlaF32;
use kdtree_jit::w4a16::W4a16;
use kdtree_jit::w4a16::grouped::W4a16Grouped;
use kdtree_jit::w4a16::wgmma::W4a16Wgmma;
use kdtree_jit::{Arch, Cache, Compiled, Target, Variant, compile_all_for, render};
use serde::Serialize;

/// A family of variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    /// Dense W4A16 GEMM on mma.sync tiles (every arch).
    Tiles,
    /// Dense W4A16 GEMM on wgmma (sm_90a).
    Wgmma,
    /// Grouped W4A16 GEMM: every routed expert of an MoE layer in one launch.
    Grouped,
    /// Absorbed MLA attention over a paged latent cache, and its split combine.
    Mla,
    /// MLA's absorb, unabsorb, cache append and gather.
    MlaAux,
    /// Absorbed MLA in f32 on the CUDA cores (an f32 model's attention, cache and projections).
    MlaF32,
    /// 16-bit weights streamed at a few rows: the bf16 projections of a decode step.
    Dense16,
}

/// One point of a family's space as `list` reports it.
#[derive(Serialize)]
pub struct Point {
    /// The family's space, as its names begin.
    pub family: &'static str,
    pub name: String,
    pub template: String,
    pub valid: bool,
    pub reason: Option<String>,
    pub axes: serde_json::Value,
}

fn points_of<V: Variant + Serialize>(target: &Target) -> anyhow::Result<Vec<Point>> {
    let point = |v: &V| -> anyhow::Result<Point> {
        let reason = v.check(target).err().map(|invalid| invalid.to_string());
        let axes = serde_json::to_value(v)?;
        let (family, name, template) = (V::SPACE, v.name(), v.template());
        Ok(Point { family, name, template, valid: reason.is_none(), reason, axes })
    };
    V::all().iter().map(point).collect()
}

type Results = Vec<(String, kdtree_jit::Result<Compiled>)>;

/// Compiles the variants valid on `target` whose names contain `filter`, each for `arch_of` it.
fn compile_of<V: Variant>(
    target: &Target,
    arch_of: impl Fn(&V) -> Arch + Sync,
    filter: &str,
    cache: Option<&Cache>,
    progress: &(dyn Fn(usize) + Sync),
) -> Results {
    let vs: Vec<V> = V::valid(target).into_iter().filter(|v| v.name().contains(filter)).collect();
    compile_all_for(&vs, arch_of, cache, progress).into_iter().map(|(v, r)| (v.name(), r)).collect()
}

impl Family {
    /// The space's name, as its variants' names begin.
    pub fn space(self) -> &'static str {
        match self {
            Family::Tiles => W4a16::SPACE,
            Family::Wgmma => W4a16Wgmma::SPACE,
            Family::Grouped => W4a16Grouped::SPACE,
            Family::Mla => MlaDecode::SPACE,
            Family::MlaAux => MlaAux::SPACE,
            Family::MlaF32 => MlaF32::SPACE,
            Family::Dense16 => Dense16::SPACE,
        }
    }

    /// The arch the family compiles for on a device of `device`: wgmma needs the arch-specific one.
    fn target(self, device: Arch) -> Arch {
        if self == Family::Wgmma { device.specific() } else { device }
    }

    /// Every point of the space, with whether it runs on `device` and why not.
    pub fn points(self, device: Arch) -> anyhow::Result<Vec<Point>> {
        let target = Target { arch: self.target(device) };
        match self {
            Family::Tiles => points_of::<W4a16>(&target),
            Family::Wgmma => points_of::<W4a16Wgmma>(&target),
            Family::Grouped => points_of::<W4a16Grouped>(&target),
            Family::Mla => points_of::<MlaDecode>(&target),
            Family::MlaAux => points_of::<MlaAux>(&target),
            Family::MlaF32 => points_of::<MlaF32>(&target),
            Family::Dense16 => points_of::<Dense16>(&target),
        }
    }

    /// Compiles the variants valid on `device` whose names contain `filter`, in parallel.
    pub fn compile(
        self,
        device: Arch,
        filter: &str,
        cache: Option<&Cache>,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Results {
        let arch = self.target(device);
        let target = Target { arch };
        match self {
            // The wgmma family exists on sm_90 alone: elsewhere it has no valid point.
            Family::Wgmma if device.capability() != 90 => Vec::new(),
            Family::Tiles => compile_of::<W4a16>(&target, |_| arch, filter, cache, progress),
            Family::Wgmma => compile_of::<W4a16Wgmma>(&target, |_| arch, filter, cache, progress),
            Family::Grouped => compile_of::<W4a16Grouped>(&target, |_| arch, filter, cache, progress),
            // Its wgmma form compiles for the arch-specific target, beside the mma form's.
            Family::Mla => compile_of::<MlaDecode>(&target, |v| v.compile_arch(arch), filter, cache, progress),
            Family::MlaAux => compile_of::<MlaAux>(&target, |_| arch, filter, cache, progress),
            Family::MlaF32 => compile_of::<MlaF32>(&target, |_| arch, filter, cache, progress),
            Family::Dense16 => compile_of::<Dense16>(&target, |_| arch, filter, cache, progress),
        }
    }

    /// How many variants valid on `device` have `filter` in their names: sized before compiling.
    pub fn count(self, device: Arch, filter: &str) -> anyhow::Result<usize> {
        Ok(self.points(device)?.iter().filter(|p| p.valid && p.name.contains(filter)).count())
    }
}

/// The rendered source of the variant named `name`, of whichever family names it so.
pub fn render_named(name: &str) -> Option<kdtree_jit::Result<String>> {
    fn of<V: Variant>(name: &str) -> Option<kdtree_jit::Result<String>> {
        V::from_name(name).map(|v| render(&v))
    }
    of::<W4a16>(name)
        .or_else(|| of::<W4a16Wgmma>(name))
        .or_else(|| of::<W4a16Grouped>(name))
        .or_else(|| of::<MlaDecode>(name))
        .or_else(|| of::<MlaAux>(name))
        .or_else(|| of::<MlaF32>(name))
        .or_else(|| of::<Dense16>(name))
}
