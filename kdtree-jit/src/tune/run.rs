//! A whole tuning run as one call, for `kdtree-jit tune` and for an engine that tunes at startup:
//! plan and prune every (problem, M), compile the candidates once, then gate and time them problem
//! by problem, saving the DB after each. Progress goes to a callback, never to the terminal; a deadline
//! stops new problems from being started. Generic over [`Tuner`]: [`Session`] on the GPU, a fake
//! in tests.
//!
//! An engine tuning its W4A16 weights at startup, within a minute:
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use kdtree_jit::tune::{db::TuningDb, flush::FlushMode, key::KIMI_K2_EXPERTS, session::Session};
//! use kdtree_jit::tune::run::{self, Progress, TuneRequest};
//! # fn main() -> kdtree_jit::tune::error::Result<()> {
//! kdtree_jit::probe::load_nvrtc(None)?;
//! let gpu = kdtree_jit::Gpu::open(0)?;
//! let path = TuningDb::default_path();
//! let mut db = TuningDb::open(&path)?;
//! let cache = kdtree_jit::Cache::open(&kdtree_jit::Cache::default_dir())?;
//! let request = TuneRequest {
//!     deadline: Some(Instant::now() + Duration::from_secs(60)),
//!     ..TuneRequest::preset(&KIMI_K2_EXPERTS)
//! };
//! let mut session = Session::open(&gpu, FlushMode::Read)?;
//! let outcome = run::tune(&mut session, &mut db, &path, Some(&cache), &request, &mut |p| {
//!     if let Progress::Tuned(t) = p {
//!         eprintln!("tuned {} M={}", t.key.shape(), t.key.m_bucket);
//!     }
//! })?;
//! eprintln!("{} tuned, {} left for next time", outcome.entries.len(), outcome.skipped.len());
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use kdtree_quant::Dtype;

use super::db::{Entry, TuningDb};
use super::env::Environment;
use super::error::Result;
use super::key::{MoePreset, MoeShape, Preset, ProblemKey, RoutingDist, Shape};
use super::prune::{self, Scope};
use super::report::{self, StaleRow};
use super::search::{Rejection, SearchConfig};
use super::session::{AtM, Session, Tuned};
use crate::w4a16::dense::{DenseKernel, DenseVariant};
use crate::{Arch, Cache, Variant};

/// A variant family a run can plan for: what its problems are and which of its variants are worth
/// timing on one. Dense W4A16 GEMMs of every family by weight shape ([`prune`]); grouped MoE steps
/// by layer ([`super::moe`]).
pub trait Family: Variant + Copy + PartialEq {
    /// A problem but for its M (or T).
    type Problem: Copy + PartialEq + std::fmt::Debug;
    /// The variants worth timing for `problem` at `m` on a device of `arch` with `sms` SMs; an
    /// error when the problem cannot be tuned at all.
    fn candidates(
        problem: &Self::Problem,
        m: u32,
        group_size: u32,
        dtype: Dtype,
        arch: Arch,
        sms: u32,
    ) -> Result<Vec<Self>>;
}

impl Family for DenseVariant {
    type Problem = Shape;

    /// Both families where the device runs both (wgmma on sm_90): the run picks between them.
    fn candidates(
        shape: &Shape,
        m: u32,
        group_size: u32,
        dtype: Dtype,
        arch: Arch,
        sms: u32,
    ) -> Result<Vec<DenseVariant>> {
        let scope = Scope { m, shape: *shape, group_size, dtype, sms };
        Ok(prune::prune(&DenseVariant::valid_on(arch), &scope))
    }
}

/// The problem type of a tuner's family.
pub type ProblemOf<T> = <<T as Tuner>::Variant as Family>::Problem;

/// What to tune. The problems share the group size and dtype; a problem listed at several M is
/// set up (uploaded) once.
#[derive(Clone, Debug)]
pub struct TuneRequest<P = Shape> {
    /// Problems with the M (rows of X; an MoE step's tokens) to tune each at, tuned in this order
    /// (grouped by problem).
    pub problems: Vec<(P, u32)>,
    pub group_size: u32,
    pub dtype: Dtype,
    /// Compile variants again even where the DB records that NVRTC refused them.
    pub retry_failed: bool,
    /// No problem is started after this; those left are reported in [`TuneOutcome::skipped`].
    /// Compiling is not cut short (the cubin cache makes it quick from the second run on), nor is
    /// a problem already started.
    pub deadline: Option<Instant>,
    pub search: SearchConfig,
}

impl<P: Copy> TuneRequest<P> {
    /// Every problem at every M, without a deadline.
    pub fn grid(problems: &[P], ms: &[u32], group_size: u32, dtype: Dtype) -> TuneRequest<P> {
        TuneRequest {
            problems: problems.iter().flat_map(|&p| ms.iter().map(move |&m| (p, m))).collect(),
            group_size,
            dtype,
            retry_failed: false,
            deadline: None,
            search: SearchConfig::default(),
        }
    }
}

impl TuneRequest {
    pub fn preset(p: &Preset) -> TuneRequest {
        TuneRequest::grid(p.shapes, p.ms, p.group_size, p.dtype)
    }
}

impl TuneRequest<MoeShape> {
    /// `p`'s layer routed each way of `routings`, at each of its T.
    pub fn moe(p: &MoePreset, routings: &[RoutingDist]) -> TuneRequest<MoeShape> {
        let layers: Vec<MoeShape> = routings.iter().map(|&routing| MoeShape { routing, ..p.layer }).collect();
        TuneRequest::grid(&layers, p.ts, p.group_size, p.dtype)
    }
}

/// A problem no candidate was correct for, and why each was rejected.
#[derive(Clone, Debug)]
pub struct Failure {
    pub key: ProblemKey,
    pub rejected: Vec<Rejection>,
}

#[derive(Clone, Debug)]
pub struct TuneOutcome<P = Shape> {
    /// The winners, in the order tuned; each is in the DB too.
    pub entries: Vec<Entry>,
    pub failed: Vec<Failure>,
    /// The problems not started because the deadline had passed, as requested.
    pub skipped: Vec<(P, u32)>,
    /// How many variants did not compile (their logs are in the DB).
    pub refused: usize,
    /// The DB's entries from other environments: kept, but never used here.
    pub stale: Vec<StaleRow>,
}

// By hand: a derive would ask `P: Default` for an empty list of them.
impl<P> Default for TuneOutcome<P> {
    fn default() -> Self {
        TuneOutcome { entries: Vec::new(), failed: Vec::new(), skipped: Vec::new(), refused: 0, stale: Vec::new() }
    }
}

/// Where a run is, as told to the caller's callback.
#[derive(Debug)]
pub enum Progress<'a> {
    /// `done` of `total` variants compiled; told from the compiling threads, starting at 0.
    Compiling { done: usize, total: usize },
    /// Compiling is over; `refused` variants did not compile.
    Compiled { total: usize, refused: usize },
    /// Gating starts: `candidates` (problem, M, variant) runs in all, counting the variants that did
    /// not compile (which are not gated) and those a deadline leaves out.
    Tuning { candidates: usize },
    /// One candidate was gated.
    Gated,
    /// One (problem, M) is done, with a winner or not; told per problem, once the problem is saved.
    Tuned(&'a Tuned),
}

/// What a run needs of the device. `tune_shape` returns one result per M of `work`, in order,
/// for the M it started: it asks `proceed` before each and stops at the first `false`.
pub trait Tuner {
    type Variant: Family;
    /// A loaded kernel.
    type Kernel;
    fn env(&self) -> &Environment;
    fn arch(&self) -> Arch;
    fn sms(&self) -> u32;
    /// Compiles and loads `variants`, recording failures in `db` (see [`Session::compile`]).
    fn compile(
        &self,
        variants: &[Self::Variant],
        db: &mut TuningDb,
        cache: Option<&Cache>,
        retry_failed: bool,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<HashMap<String, Self::Kernel>>;
    /// See [`Session::tune_shape`].
    fn tune_shape(
        &mut self,
        problem: (ProblemOf<Self>, u32, Dtype),
        work: &[AtM<Self::Variant>],
        kernels: &HashMap<String, Self::Kernel>,
        cfg: &SearchConfig,
        proceed: &mut dyn FnMut() -> bool,
        progress: &mut dyn FnMut(),
    ) -> Result<Vec<Tuned>>;
}

impl Tuner for Session<'_> {
    type Variant = DenseVariant;
    type Kernel = DenseKernel;

    fn env(&self) -> &Environment {
        &self.env
    }

    fn arch(&self) -> Arch {
        self.gpu.arch
    }

    fn sms(&self) -> u32 {
        self.sms
    }

    fn compile(
        &self,
        variants: &[DenseVariant],
        db: &mut TuningDb,
        cache: Option<&Cache>,
        retry_failed: bool,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<HashMap<String, Self::Kernel>> {
        Session::compile(self, variants, db, cache, retry_failed, progress)
    }

    fn tune_shape(
        &mut self,
        problem: (Shape, u32, Dtype),
        work: &[AtM],
        kernels: &HashMap<String, Self::Kernel>,
        cfg: &SearchConfig,
        proceed: &mut dyn FnMut() -> bool,
        progress: &mut dyn FnMut(),
    ) -> Result<Vec<Tuned>> {
        Session::tune_shape(self, problem, work, kernels, cfg, proceed, progress)
    }
}

/// Tunes `request` on `tuner`, inserting the winners into `db` and saving it to `db_path` after
/// compiling and after each problem, so a run cut short keeps what it measured. `progress` is also
/// called from the compiling threads (one at a time), hence `Send`. A problem without a correct
/// variant is not an error: it is in [`TuneOutcome::failed`].
pub fn tune<T: Tuner>(
    tuner: &mut T,
    db: &mut TuningDb,
    db_path: &Path,
    cache: Option<&Cache>,
    request: &TuneRequest<ProblemOf<T>>,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<TuneOutcome<ProblemOf<T>>> {
    let past = || request.deadline.is_some_and(|d| Instant::now() >= d);
    let mut outcome = TuneOutcome::default();
    if past() {
        outcome.skipped = request.problems.clone();
        outcome.stale = report::stale_rows(db, tuner.env());
        return Ok(outcome);
    }
    let plan = plan::<T::Variant>(request, tuner.arch(), tuner.sms())?;
    let mut all: Vec<T::Variant> =
        plan.iter().flat_map(|(_, w)| w.iter().flat_map(|(_, vs)| vs.iter().copied())).collect();
    all.sort_by_key(|v| v.name());
    all.dedup();

    let total = all.len();
    progress(Progress::Compiling { done: 0, total });
    // The compiling threads take turns at the caller's callback.
    let shared = Mutex::new(&mut *progress);
    let tell = |done| {
        let mut progress = shared.lock().unwrap_or_else(PoisonError::into_inner);
        (**progress)(Progress::Compiling { done, total })
    };
    let kernels = tuner.compile(&all, db, cache, request.retry_failed, &tell)?;
    db.save(db_path)?;
    outcome.refused = all.iter().filter(|v| !kernels.contains_key(&v.name())).count();
    progress(Progress::Compiled { total, refused: outcome.refused });

    let candidates = plan.iter().flat_map(|(_, w)| w.iter().map(|(_, vs)| vs.len())).sum();
    progress(Progress::Tuning { candidates });
    let (group, dtype) = (request.group_size, request.dtype);
    for (shape, work) in &plan {
        let done = if past() {
            Vec::new()
        } else {
            // The shape's first M was decided on here: its setup (the problem, the upload) is not wasted.
            let mut first = true;
            let mut proceed = || std::mem::take(&mut first) || !past();
            let mut gated = || progress(Progress::Gated);
            tuner.tune_shape((*shape, group, dtype), work, &kernels, &request.search, &mut proceed, &mut gated)?
        };
        outcome.skipped.extend(work[done.len()..].iter().map(|(m, _)| (*shape, *m)));
        if done.is_empty() {
            continue;
        }
        for tuned in &done {
            if let Some(entry) = &tuned.entry {
                db.insert(entry.clone());
            }
        }
        db.save(db_path)?;
        for tuned in done {
            progress(Progress::Tuned(&tuned));
            match tuned.entry {
                Some(entry) => outcome.entries.push(entry),
                None => outcome.failed.push(Failure { key: tuned.key, rejected: tuned.rejected }),
            }
        }
    }
    outcome.stale = report::stale_rows(db, tuner.env());
    Ok(outcome)
}

/// Each problem with its M and the candidates at each.
type Plan<V> = Vec<(<V as Family>::Problem, Vec<AtM<V>>)>;

/// The request's problems grouped by problem (in order of first appearance), each M with the
/// variants worth timing there.
fn plan<V: Family>(request: &TuneRequest<V::Problem>, arch: Arch, sms: u32) -> Result<Plan<V>> {
    let mut plan: Plan<V> = Vec::new();
    for &(problem, m) in &request.problems {
        let at = (m, V::candidates(&problem, m, request.group_size, request.dtype, arch, sms)?);
        match plan.iter_mut().find(|(p, _)| *p == problem) {
            Some((_, work)) => work.push(at),
            None => plan.push((problem, vec![at])),
        }
    }
    Ok(plan)
}
