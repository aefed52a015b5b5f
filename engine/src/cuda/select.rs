//! Which W4A16 kernel variant computes each weight shape: the tuning DB's pick, or a documented
//! default when the DB has no fresh entry for the shape.
//!
//! The variants are of every dense family the device runs ([`DenseVariant`]: the tiles, and wgmma
//! on sm_90), whichever the tuner found fastest.
//!
//! Exactness: DDTree's output equals greedy decoding's only if a row's logits never depend on how
//! many rows run with it. A kernel variant fixes the order in which K is summed (its BK, its warps
//! along K, its split-K, wgmma's k16 steps), so the same variant computes a row identically whatever
//! M is (rows are independent inside the kernels of both families: partial tiles are zero-filled,
//! split-K partials are added in split order). Two variants do not. [`Mode::Exact`] therefore runs
//! one variant per weight shape for every M, a row-limited one (stream, gemv) in blocks of its `bm`
//! rows; [`Mode::Fast`] runs the DB's best per M bucket and gives that equality up.

use kdtree_jit::tune::db::{Entry, Match, TuningDb};
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::key::{M_BUCKETS, ProblemKey, Shape, m_bucket};
use kdtree_jit::w4a16::dense::{DenseFamily, DenseVariant};
use kdtree_jit::w4a16::{Acc, Algo, W4a16};
use kdtree_jit::{Arch, Variant};
use kdtree_quant::{Dtype, QuantizedWeight};
use serde::Serialize;

/// How variants are picked across M.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One variant per weight shape for every M: the DB's best for the M bucket of `m`. A variant
    /// with a row limit (stream, gemv: `bm` rows) runs more rows in blocks of `bm`, one launch each.
    /// Tree and one-token forwards then agree bit for bit. The default.
    Exact { m: usize },
    /// The DB's best per M bucket: faster at small M, but a tree forward and a one-token forward may
    /// run different kernels, so their logits may differ in the last bits and DDTree's tokens may
    /// then differ from greedy decoding's.
    Fast,
}

/// A W4A16 weight's problem, as the tuning DB keys it (M aside).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct WeightShape {
    pub n: usize,
    pub k: usize,
    pub group_size: usize,
    /// The scales' dtype, which is also the activations' on the GPU.
    pub dtype: Dtype,
}

impl WeightShape {
    pub fn of(w: &QuantizedWeight) -> WeightShape {
        WeightShape { n: w.n, k: w.k, group_size: w.group_size, dtype: w.scales.dtype }
    }
}

impl std::fmt::Display for WeightShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{} g{} {}", self.n, self.k, self.group_size, self.dtype)
    }
}

/// Where a variant came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The DB's entry tuned at M bucket `bucket`; `nearest` when the asked bucket had none usable.
    Tuned { bucket: u32, nearest: bool },
    /// [`default_variant`], and why the DB had nothing to offer.
    Default { reason: String },
}

#[derive(Clone, Debug, PartialEq)]
pub struct VariantChoice {
    pub variant: DenseVariant,
    pub source: Source,
}

/// The variants one weight shape runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Runs every M that `by_bucket` does not cover: in exact mode, every M.
    pub general: VariantChoice,
    /// Fast mode only: per M bucket, the variant tuned for it (it supports every M of the bucket).
    pub by_bucket: Vec<(u32, VariantChoice)>,
}

impl Plan {
    /// The variant that computes `m` rows.
    pub fn variant_for(&self, m: usize) -> &DenseVariant {
        let bucket = m_bucket(u32::try_from(m).unwrap_or(u32::MAX));
        self.by_bucket.iter().find(|(b, _)| *b == bucket).map_or(&self.general.variant, |(_, c)| &c.variant)
    }

    /// Every distinct variant of the plan.
    pub fn variants(&self) -> Vec<DenseVariant> {
        let mut all = vec![self.general.variant];
        for (_, c) in &self.by_bucket {
            if !all.contains(&c.variant) {
                all.push(c.variant);
            }
        }
        all
    }
}

/// More rows than any forward runs: a variant that supports this many has no row limit.
const EVERY_M: usize = 1 << 16;

/// The variant used when the DB has no fresh, usable entry: tensor-core tiles of 16 x 64 x 128,
/// four warps along K, a 4-stage pipeline, no split-K, f32 sums. It is valid for every group size
/// of the space on sm_80, sm_90 and sm_120 and serves any M, N and K that is a multiple of the group.
pub fn default_variant(shape: &WeightShape) -> W4a16 {
    W4a16 {
        algo: Algo::Mma,
        dtype: shape.dtype,
        group_size: shape.group_size as u32,
        acc: Acc::F32,
        bm: 16,
        bn: 64,
        bk: 128,
        warps: 4,
        stages: 4,
        split_k: 1,
    }
}

/// The plan of `shape` on a GPU of `arch` in environment `env`.
pub fn plan(db: &TuningDb, env: &Environment, arch: Arch, shape: &WeightShape, mode: Mode) -> Plan {
    let ask = |m: usize, rows: usize| choose(db, env, arch, shape, m, rows);
    match mode {
        Mode::Exact { m } => Plan { general: ask(m, 1), by_bucket: Vec::new() },
        Mode::Fast => {
            let largest = *M_BUCKETS.last().expect("buckets") as usize;
            let by_bucket = M_BUCKETS
                .iter()
                .map(|&b| (b, ask(b as usize, b as usize)))
                .filter(|(_, c)| matches!(c.source, Source::Tuned { .. }))
                .collect();
            Plan { general: ask(largest, EVERY_M), by_bucket }
        }
    }
}

/// The DB's best variant for `m` rows' bucket among those that can compute `rows` rows of `shape`
/// here, else the default with the reason.
fn choose(db: &TuningDb, env: &Environment, arch: Arch, shape: &WeightShape, m: usize, rows: usize) -> VariantChoice {
    let key = ProblemKey::w4a16(
        u32::try_from(m).unwrap_or(u32::MAX),
        Shape { n: shape.n as u32, k: shape.k as u32 },
        shape.group_size as u32,
        shape.dtype,
        arch,
    );
    let usable = |e: &Entry| {
        DenseVariant::from_name(&e.variant).filter(|v| v.check_on(arch).is_ok() && v.supports(rows, shape.n, shape.k))
    };
    let lookup = db.lookup(&key, env, |e| usable(e).is_some());
    if let Some((hit, variant)) = lookup.hit.as_ref().and_then(|hit| Some((hit, usable(hit.entry)?))) {
        let nearest = hit.matched != Match::Exact;
        return VariantChoice { variant, source: Source::Tuned { bucket: hit.entry.key.m_bucket, nearest } };
    }
    let reason = if let Some(stale) = lookup.stale.first() {
        let why: Vec<String> = stale.differences.iter().map(|d| d.to_string()).collect();
        format!("the DB's entry ({}) is stale: {}", stale.entry.variant, why.join(", "))
    } else if db.entries.iter().any(|e| key.same_but_m(&e.key)) {
        "no tuned variant of this shape can serve every M here (gemv variants stop at their bm rows)".to_owned()
    } else {
        "not in the tuning DB".to_owned()
    };
    VariantChoice { variant: DenseVariant::Tiles(default_variant(shape)), source: Source::Default { reason } }
}
