//! Tuning at startup, as the design has it: before the weights are uploaded, the problems the model
//! will run that the tuning DB has no fresh entry for are tuned through kdtree-jit's tuner
//! ([`run::tune`]) within a time budget and saved to the DB, so the load plans them from it.
//!
//! Three kinds of problem, one field of [`Missing`] each, tuned in this order under one deadline:
//! per-shape W4A16 GEMMs (the model's INT4 weights outside the grouped routed experts, the experts
//! too when they run one chain per expert); the grouped MoE step of the routed experts, at the
//! tokens its lookup asks for ([`moe_problem`]); the dense 16-bit linears of a few rows on the
//! streamed family ([`streamed`](super::streamed)) at the M its plan asks for.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kdtree_jit::tune::db::{Match, TuningDb};
use kdtree_jit::tune::dense16::{self, Dense16Request, Dense16Tuned};
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::flush::FlushMode;
use kdtree_jit::tune::key::{M_BUCKETS, MoeShape, Shape, m_bucket};
use kdtree_jit::tune::moe::best_grouped;
use kdtree_jit::tune::moe_gpu::MoeSession;
use kdtree_jit::tune::run::{self, Progress, TuneOutcome, TuneRequest, Tuner};
use kdtree_jit::tune::search::SearchConfig;
use kdtree_jit::tune::session::Session;
use kdtree_jit::w4a16::dense::DenseVariant;
use kdtree_jit::{Arch, Cache, Target};
use kdtree_quant::Dtype;

use super::moe::{self, moe_problem};
use super::select::{Mode, Plan, Source, WeightShape, plan};
use super::streamed::planned_m;
use super::{CudaBackend, MoeKernels};
use crate::error::{EngineError, Result};
use crate::model::{DenseShape, PlannedWeights};
use crate::registry::ComputeDtype;

/// What the model runs that the DB lacks, by kind of kernel.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Missing {
    /// W4A16 weight shapes, each with the M buckets it lacks.
    pub w4a16: Vec<(WeightShape, Vec<u32>)>,
    /// The grouped MoE step of the routed experts (uniform routing), at the tokens it lacks.
    pub moe: Vec<(MoeProblem, u32)>,
    /// Dense 16-bit weight shapes the streamed family has no entry for at the M they are planned at.
    pub dense16: Vec<(DenseShape, u32)>,
}

/// A grouped MoE step as the tuning DB keys it (tokens aside).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeProblem {
    pub layer: MoeShape,
    pub group_size: u32,
    pub dtype: Dtype,
}

impl Missing {
    /// How many (problem, M bucket) pairs.
    pub(crate) fn len(&self) -> usize {
        self.w4a16.iter().map(|(_, buckets)| buckets.len()).sum::<usize>() + self.moe.len() + self.dense16.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What tuning at startup did, in (problem, M bucket) pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TuneSummary {
    pub tuned: usize,
    /// Tuned, but no variant was correct: the default runs.
    pub failed: usize,
    /// Not started within the budget: the default (or a nearest bucket's entry) runs.
    pub skipped: usize,
    pub seconds: f64,
}

impl TuneSummary {
    /// Counts a run's winners, failures and problems left for the budget.
    fn add<P>(&mut self, outcome: &TuneOutcome<P>) {
        self.tuned += outcome.entries.len();
        self.failed += outcome.failed.len();
        self.skipped += outcome.skipped.len();
    }
}

impl std::fmt::Display for TuneSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "startup tuning: tuned {}, skipped {} for the budget", self.tuned, self.skipped)?;
        if self.failed > 0 {
            write!(f, ", {} without a correct variant", self.failed)?;
        }
        write!(f, ", in {:.1} s", self.seconds)
    }
}

/// What of `planned` the backend will run that `db` has no fresh entry of its own for (none, a
/// stale one, or only another bucket's), read as the load reads the DB: the W4A16 (shape, M bucket)
/// pairs [`plan`] plans (exact mode's one bucket of `m`, or every bucket in fast mode; with grouped
/// MoE, routed experts are left out: they do not run per-shape kernels), the grouped MoE step
/// unless a variant is given, and the dense shapes at the M their plan asks for (exact mode's M,
/// none past [`MAX_STREAMED_ROWS`](super::MAX_STREAMED_ROWS); fast mode's 1).
pub fn missing(
    planned: &PlannedWeights,
    moe: MoeKernels,
    mode: Mode,
    db: &TuningDb,
    env: &Environment,
    arch: Arch,
) -> Missing {
    let wanted: Vec<u32> = match mode {
        Mode::Exact { m } => vec![m_bucket(u32::try_from(m).unwrap_or(u32::MAX))],
        Mode::Fast => M_BUCKETS.to_vec(),
    };
    let per_shape = planned.int4.iter().filter(|w| !w.routed_expert || moe == MoeKernels::PerExpert);
    let mut shapes: Vec<WeightShape> =
        per_shape.map(|w| WeightShape { n: w.n, k: w.k, group_size: w.group_size, dtype: w.dtype }).collect();
    shapes.sort();
    shapes.dedup();
    let w4a16 = shapes
        .into_iter()
        .map(|shape| {
            let tuned = own_buckets(&plan(db, env, arch, &shape, mode));
            (shape, wanted.iter().copied().filter(|b| !tuned.contains(b)).collect::<Vec<_>>())
        })
        .filter(|(_, buckets)| !buckets.is_empty())
        .collect();
    let dense16 = match planned_m(mode) {
        Some(m) => {
            let m = m as u32;
            // Shapes no variant computes are left to cuBLAS rather than asked for at every startup.
            let lacks = |s: &&DenseShape| match (u32::try_from(s.n), u32::try_from(s.k)) {
                (Ok(n), Ok(k)) => {
                    let shape = Shape { n, k };
                    dense16::can_tune(arch, shape, s.dtype, m) && !dense16::is_tuned(db, env, arch, shape, s.dtype, m)
                }
                _ => false,
            };
            planned.dense16.iter().filter(lacks).map(|&s| (s, m)).collect()
        }
        None => Vec::new(),
    };
    let grouped =
        planned.experts.filter(|e| moe == MoeKernels::Grouped(None) && moe::grouped_limits(e.experts, e.dtype).is_ok());
    let moe = grouped.and_then(|e| moe_problem(&e, mode)).and_then(|(layer, (group_size, dtype), tokens)| {
        let tokens = m_bucket(tokens);
        let found = best_grouped(db, env, &Target { arch }, &layer, (group_size, dtype), tokens);
        let own = found.is_some_and(|(_, matched)| matches!(matched, Match::Exact));
        (!own).then_some((MoeProblem { layer, group_size, dtype }, tokens))
    });
    Missing { w4a16, moe: moe.into_iter().collect(), dense16 }
}

/// The buckets whose own DB entry `plan` runs.
fn own_buckets(plan: &Plan) -> Vec<u32> {
    let choices = plan.by_bucket.iter().map(|(_, c)| c).chain([&plan.general]);
    choices
        .filter_map(|c| if let Source::Tuned { bucket, nearest: false } = c.source { Some(bucket) } else { None })
        .collect()
}

/// What tuning at startup tells as it goes.
pub enum StartupProgress<'a> {
    /// The W4A16 problems and the grouped MoE step, as [`run::tune`] tells them.
    W4a16(Progress<'a>),
    /// The streamed family: `done` of `total` dense (shape, M) pairs tuned.
    Dense16 { done: usize, total: usize },
}

/// What tuning at startup runs on: W4A16's [`Tuner`], the grouped MoE step's and the streamed
/// 16-bit family's tuners.
pub(crate) trait StartupTuner: Tuner<Variant = DenseVariant> {
    /// [`run::tune`] of grouped MoE steps, saving to `db_path` as it goes.
    fn tune_moe(
        &mut self,
        db: &mut TuningDb,
        db_path: &Path,
        cache: Option<&Cache>,
        request: &TuneRequest<MoeShape>,
        progress: &mut (dyn FnMut(Progress<'_>) + Send),
    ) -> kdtree_jit::tune::error::Result<TuneOutcome<MoeShape>>;

    /// [`dense16::tune_dense16`] of `request`, into `db` (not to disk).
    fn tune_dense16(
        &mut self,
        db: &mut TuningDb,
        cache: Option<&Cache>,
        request: &Dense16Request,
        progress: &mut dyn FnMut(usize, usize),
    ) -> kdtree_jit::tune::error::Result<Vec<Dense16Tuned>>;
}

impl StartupTuner for Session<'_> {
    fn tune_moe(
        &mut self,
        db: &mut TuningDb,
        db_path: &Path,
        cache: Option<&Cache>,
        request: &TuneRequest<MoeShape>,
        progress: &mut (dyn FnMut(Progress<'_>) + Send),
    ) -> kdtree_jit::tune::error::Result<TuneOutcome<MoeShape>> {
        run::tune(&mut MoeSession(self), db, db_path, cache, request, progress)
    }

    fn tune_dense16(
        &mut self,
        db: &mut TuningDb,
        cache: Option<&Cache>,
        request: &Dense16Request,
        progress: &mut dyn FnMut(usize, usize),
    ) -> kdtree_jit::tune::error::Result<Vec<Dense16Tuned>> {
        dense16::tune_dense16(self, db, cache, request, progress)
    }
}

/// `value`, a size of `what`, as the tuning DB keys it.
fn key_size(value: usize, what: &dyn std::fmt::Display) -> Result<u32> {
    u32::try_from(value).map_err(|_| EngineError::ArgumentOutOfRange {
        what: what.to_string(),
        value: value as u64,
        limit: "a tuning key holds sizes up to 2^32 - 1".into(),
    })
}

/// A shape's dimensions as the tuning DB keys them.
fn db_shape(n: usize, k: usize, what: &dyn std::fmt::Display) -> Result<Shape> {
    Ok(Shape { n: key_size(n, &format_args!("{what}'s N"))?, k: key_size(k, &format_args!("{what}'s K"))? })
}

/// A request of tuning at startup: compile failures not retried, the one deadline.
fn request<P>(problems: Vec<(P, u32)>, (group_size, dtype): (u32, Dtype), deadline: Instant) -> TuneRequest<P> {
    TuneRequest {
        problems,
        group_size,
        dtype,
        retry_failed: false,
        deadline: Some(deadline),
        search: SearchConfig::default(),
    }
}

/// Tunes `missing` within `budget` on the tuner `open` makes, adding the winners to `db` and saving
/// it to `db_path` as it goes. `None`, without opening a tuner, when nothing is missing or the
/// budget is 0. The budget counts from the call, opening the tuner included; a problem already
/// started when it runs out is finished.
fn tune<T: StartupTuner>(
    open: impl FnOnce() -> kdtree_jit::tune::error::Result<T>,
    db: &mut TuningDb,
    db_path: &Path,
    cache: Option<&Cache>,
    missing: &Missing,
    budget: Duration,
    progress: &mut (dyn FnMut(StartupProgress<'_>) + Send),
) -> Result<Option<TuneSummary>> {
    if missing.is_empty() || budget.is_zero() {
        return Ok(None);
    }
    let started = Instant::now();
    let deadline = started + budget;
    let mut tuner = open()?;
    let mut summary = TuneSummary::default();
    // One request per group size and dtype, which a request shares.
    let mut requests: BTreeMap<_, Vec<(Shape, u32)>> = BTreeMap::new();
    for (s, buckets) in &missing.w4a16 {
        let shape = db_shape(s.n, s.k, &format_args!("W4A16 shape {s}"))?;
        let group = key_size(s.group_size, &format_args!("W4A16 shape {s}'s group size"))?;
        requests.entry((group, s.dtype)).or_default().extend(buckets.iter().map(|&b| (shape, b)));
    }
    for (group_dtype, problems) in requests {
        let request = request(problems, group_dtype, deadline);
        let outcome =
            run::tune(&mut tuner, db, db_path, cache, &request, &mut |p| progress(StartupProgress::W4a16(p)))?;
        summary.add(&outcome);
    }
    // The grouped MoE step: a request per layer kind (one for a model whose MoE layers are alike).
    for &(MoeProblem { layer, group_size, dtype }, tokens) in &missing.moe {
        let request = request(vec![(layer, tokens)], (group_size, dtype), deadline);
        let outcome = tuner.tune_moe(db, db_path, cache, &request, &mut |p| progress(StartupProgress::W4a16(p)))?;
        summary.add(&outcome);
    }
    // The streamed family: one request per dtype and M (exact mode plans one M, fast mode M = 1).
    let mut dense: BTreeMap<_, Vec<Shape>> = BTreeMap::new();
    for (s, m) in &missing.dense16 {
        dense.entry((s.dtype, *m)).or_default().push(db_shape(s.n, s.k, &format_args!("dense shape {s}"))?);
    }
    let (mut done, total) = (0, missing.dense16.len());
    for ((dtype, m), shapes) in dense {
        let request = Dense16Request { shapes: &shapes, ms: &[m], dtype, deadline: Some(deadline) };
        let tuned = tuner.tune_dense16(db, cache, &request, &mut |d, _| {
            progress(StartupProgress::Dense16 { done: done + d, total })
        })?;
        db.save(db_path)?;
        done += shapes.len();
        let won = tuned.iter().filter(|t| t.variant.is_some()).count();
        summary.tuned += won;
        summary.failed += tuned.len() - won;
        summary.skipped += shapes.len() - tuned.len();
    }
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(Some(summary))
}

impl CudaBackend {
    /// Tunes what the model in `dir`, loaded in `dtype` ([`Model::load_as`](crate::model::Model::load_as)),
    /// will run that the tuning DB lacks ([`missing`]), within
    /// `budget`, and saves it to the DB file, so that loading the model next plans from the new
    /// entries. `None` when nothing is missing or the budget is 0. `progress` hears of compiling and
    /// tuning as it goes ([`StartupProgress`]).
    pub fn tune_at_startup(
        &mut self,
        dir: &Path,
        dtype: Option<ComputeDtype>,
        budget: Duration,
        progress: &mut (dyn FnMut(StartupProgress<'_>) + Send),
    ) -> Result<Option<TuneSummary>> {
        // No budget, no tuning: the checkpoint's headers are not read for nothing at every startup.
        if budget.is_zero() {
            return Ok(None);
        }
        let planned = PlannedWeights::read(dir, dtype)?;
        let (tuning, arch) = (&self.tuning, self.gpu.arch);
        let missing = missing(&planned, self.weights.moe, tuning.mode, &tuning.db, &tuning.env, arch);
        let gpu = &self.gpu;
        let open = || Session::open(gpu, FlushMode::Read);
        tune(open, &mut self.tuning.db, &self.tuning.db_path, self.tuning.cubins.as_ref(), &missing, budget, progress)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use kdtree_jit::Variant;
    use kdtree_jit::dense16::Dense16;
    use kdtree_jit::tune::bench::Timing;
    use kdtree_jit::tune::db::Entry;
    use kdtree_jit::tune::key::ProblemKey;
    use kdtree_jit::tune::peers::Peers;
    use kdtree_jit::tune::session::{AtM, Tuned};
    use kdtree_jit::w4a16::grouped::W4a16Grouped;

    use super::*;
    use crate::cuda::default_variant;
    use crate::model::{Int4Experts, Int4Weight};

    const ARCH: Arch = Arch(90);
    /// A weight outside the experts (an INT4 attention or dense projection) and a routed expert's.
    const DENSE: Int4Weight = Int4Weight { n: 4096, k: 7168, group_size: 32, dtype: Dtype::Bf16, routed_expert: false };
    const EXPERT: Int4Weight = Int4Weight { n: 7168, k: 2048, group_size: 32, dtype: Dtype::Bf16, routed_expert: true };
    /// A dense bf16 weight the streamed family computes (K2's `[q_a_proj; kv_a_proj_with_mqa]`), and
    /// one it does not (K not a multiple of 32).
    const STREAMED: DenseShape = DenseShape { n: 2112, k: 7168, dtype: Dtype::Bf16 };
    const ODD: DenseShape = DenseShape { n: 64, k: 48, dtype: Dtype::Bf16 };
    const TIMING: Timing = Timing { median_us: 10.0, p10_us: 9.0, p90_us: 11.0, reps: 100 };

    fn shape(w: &Int4Weight) -> WeightShape {
        WeightShape { n: w.n, k: w.k, group_size: w.group_size, dtype: w.dtype }
    }

    /// An entry of `key` at `m` won by `variant` in `env`, in [`TIMING`] with cuBLAS beside.
    fn won(key: ProblemKey, variant: String, m: u32, env: Environment) -> Entry {
        Entry {
            key,
            env,
            variant,
            m,
            timing: TIMING,
            error: 0.0,
            peers: Peers { cublas_bf16: Some(TIMING), cublas_f16: None, copy_gbps: 4000.0 },
            bytes: 1,
            timed: 1,
            rejected: Vec::new(),
            tuned_at_unix: 0,
        }
    }

    /// A DB entry of `w` at `bucket` measured in `env`, won by the default variant.
    fn entry(w: &Int4Weight, bucket: u32, env: Environment) -> Entry {
        let s = shape(w);
        let key = ProblemKey::w4a16(bucket, Shape { n: s.n as u32, k: s.k as u32 }, 32, s.dtype, ARCH);
        won(key, default_variant(&s).name(), bucket, env)
    }

    fn db(entries: Vec<Entry>) -> TuningDb {
        TuningDb { entries, ..TuningDb::default() }
    }

    /// The streamed variant's entry of `s` at `m`, measured in `env`.
    fn dense_entry(s: DenseShape, m: u32, env: Environment) -> Entry {
        let key = dense16::key(m, Shape { n: s.n as u32, k: s.k as u32 }, s.dtype, ARCH);
        won(key, Dense16::default_for(s.dtype).name(), m, env)
    }

    /// K2's routed experts: 384 of them, top-8, INT4 g32 with bf16 scales.
    const EXPERTS: Int4Experts = Int4Experts {
        gate_up: (4096, 7168),
        down: (7168, 2048),
        group_size: 32,
        dtype: Dtype::Bf16,
        experts: 384,
        top_k: 8,
    };

    fn planned() -> PlannedWeights {
        PlannedWeights { int4: vec![DENSE, EXPERT], dense16: vec![STREAMED, ODD], experts: Some(EXPERTS) }
    }

    fn missing_in(db: &TuningDb, moe: MoeKernels, mode: Mode) -> Missing {
        missing(&planned(), moe, mode, db, &Environment::sample_h200(), ARCH)
    }

    /// The grouped default's entry of the K2 layer at `tokens`, measured in `env`.
    fn moe_entry(tokens: u32, env: Environment) -> Entry {
        let (layer, (group, dtype), _) = moe_problem(&EXPERTS, Mode::Fast).unwrap();
        let variant = W4a16Grouped::default_for(dtype, group, &Target { arch: ARCH }).name();
        won(ProblemKey::moe(tokens, &layer, group, dtype, ARCH), variant, tokens, env)
    }

    #[test]
    fn exact_mode_lacks_the_bucket_of_m_and_fast_mode_every_bucket() {
        let empty = db(Vec::new());
        let grouped = MoeKernels::default();
        assert_eq!(missing_in(&empty, grouped, Mode::Exact { m: 3 }).w4a16, [(shape(&DENSE), vec![4])]);
        assert_eq!(missing_in(&empty, grouped, Mode::Fast).w4a16, [(shape(&DENSE), M_BUCKETS.to_vec())]);
        // Routed experts run per shape only with --per-expert-moe.
        let per_expert = missing_in(&empty, MoeKernels::PerExpert, Mode::Exact { m: 129 });
        assert_eq!(per_expert.w4a16, [(shape(&DENSE), vec![256]), (shape(&EXPERT), vec![256])]);
        assert_eq!(per_expert.len(), 2);
    }

    #[test]
    fn only_a_fresh_entry_of_the_bucket_itself_counts() {
        let grouped = MoeKernels::default();
        let fresh = db(vec![entry(&DENSE, 4, Environment::sample_h200())]);
        assert!(missing_in(&fresh, grouped, Mode::Exact { m: 3 }).w4a16.is_empty());
        // The nearest bucket's entry would run at M = 16, but 16 is still worth tuning.
        assert_eq!(missing_in(&fresh, grouped, Mode::Exact { m: 16 }).w4a16, [(shape(&DENSE), vec![16])]);
        let fast = missing_in(&fresh, grouped, Mode::Fast);
        assert_eq!(fast.w4a16, [(shape(&DENSE), M_BUCKETS.iter().copied().filter(|&b| b != 4).collect())]);
        let stale = db(vec![entry(&DENSE, 4, Environment { driver: 12080, ..Environment::sample_h200() })]);
        assert_eq!(missing_in(&stale, grouped, Mode::Exact { m: 3 }).w4a16, [(shape(&DENSE), vec![4])]);
    }

    #[test]
    fn the_grouped_step_lacks_the_tokens_its_lookup_asks_for_unless_a_variant_is_given() {
        let grouped = MoeKernels::default();
        let empty = db(Vec::new());
        let (layer, (group_size, dtype), _) = moe_problem(&EXPERTS, Mode::Fast).unwrap();
        let k2 = MoeProblem { layer, group_size, dtype };
        assert_eq!(missing_in(&empty, grouped, Mode::Exact { m: 3 }).moe, [(k2, 4)]);
        assert_eq!(missing_in(&empty, grouped, Mode::Fast).moe, [(k2, 256)]);
        // A variant given, or one chain per expert: no grouped step to tune.
        let given = MoeKernels::Grouped(Some(W4a16Grouped::default_for(dtype, group_size, &Target { arch: ARCH })));
        assert_eq!(missing_in(&empty, given, Mode::Fast).moe, []);
        assert_eq!(missing_in(&empty, MoeKernels::PerExpert, Mode::Fast).moe, []);
        // The bucket's own fresh entry counts; another bucket's or a stale one does not.
        let fresh = db(vec![moe_entry(4, Environment::sample_h200())]);
        assert_eq!(missing_in(&fresh, grouped, Mode::Exact { m: 3 }).moe, []);
        assert_eq!(missing_in(&fresh, grouped, Mode::Exact { m: 8 }).moe, [(k2, 8)]);
        let stale = db(vec![moe_entry(4, Environment { driver: 12080, ..Environment::sample_h200() })]);
        assert_eq!(missing_in(&stale, grouped, Mode::Exact { m: 3 }).moe, [(k2, 4)]);
        // Past the grouped kernel's limits the experts run per expert.
        let many = PlannedWeights { experts: Some(Int4Experts { experts: 100_000, ..EXPERTS }), ..planned() };
        assert_eq!(missing(&many, grouped, Mode::Fast, &empty, &Environment::sample_h200(), ARCH).moe, []);
    }

    #[test]
    fn dense_shapes_lack_the_m_their_plan_asks_for_and_odd_ones_are_left_to_cublas() {
        let grouped = MoeKernels::default();
        let empty = db(Vec::new());
        assert_eq!(missing_in(&empty, grouped, Mode::Exact { m: 3 }).dense16, [(STREAMED, 3)]);
        assert_eq!(missing_in(&empty, grouped, Mode::Fast).dense16, [(STREAMED, 1)]);
        // Past the streamed family's rows, cuBLAS runs every dense shape: nothing to tune.
        assert_eq!(missing_in(&empty, grouped, Mode::Exact { m: 129 }).dense16, []);
        // An entry of M's own bucket counts, whichever won; a stale one does not.
        let fresh = db(vec![dense_entry(STREAMED, 4, Environment::sample_h200())]);
        assert!(missing_in(&fresh, grouped, Mode::Exact { m: 3 }).dense16.is_empty());
        assert_eq!(missing_in(&fresh, grouped, Mode::Exact { m: 16 }).dense16, [(STREAMED, 16)]);
        let stale = db(vec![dense_entry(STREAMED, 4, Environment { driver: 12080, ..Environment::sample_h200() })]);
        assert_eq!(missing_in(&stale, grouped, Mode::Exact { m: 3 }).dense16, [(STREAMED, 3)]);
    }

    /// Wins every problem with the default variant; sleeps `pause` in each shape.
    struct FakeTuner {
        env: Environment,
        pause: Duration,
    }

    impl Tuner for FakeTuner {
        type Variant = DenseVariant;
        type Kernel = ();

        fn env(&self) -> &Environment {
            &self.env
        }

        fn arch(&self) -> Arch {
            ARCH
        }

        fn sms(&self) -> u32 {
            132
        }

        fn compile(
            &self,
            variants: &[DenseVariant],
            _: &mut TuningDb,
            _: Option<&Cache>,
            _: bool,
            _: &(dyn Fn(usize) + Sync),
        ) -> kdtree_jit::tune::error::Result<HashMap<String, ()>> {
            Ok(variants.iter().map(|v| (v.name(), ())).collect())
        }

        fn tune_shape(
            &mut self,
            (s, group_size, dtype): (Shape, u32, Dtype),
            work: &[AtM],
            _: &HashMap<String, ()>,
            _: &SearchConfig,
            proceed: &mut dyn FnMut() -> bool,
            _: &mut dyn FnMut(),
        ) -> kdtree_jit::tune::error::Result<Vec<Tuned>> {
            std::thread::sleep(self.pause);
            let w = Int4Weight {
                n: s.n as usize,
                k: s.k as usize,
                group_size: group_size as usize,
                dtype,
                routed_expert: false,
            };
            let mut done = Vec::new();
            for (m, _) in work {
                if !proceed() {
                    break;
                }
                let e = entry(&w, *m, self.env.clone());
                done.push(Tuned { key: e.key.clone(), entry: Some(e), rejected: Vec::new() });
            }
            Ok(done)
        }
    }

    impl StartupTuner for FakeTuner {
        fn tune_moe(
            &mut self,
            db: &mut TuningDb,
            db_path: &Path,
            _: Option<&Cache>,
            request: &TuneRequest<MoeShape>,
            _: &mut (dyn FnMut(Progress<'_>) + Send),
        ) -> kdtree_jit::tune::error::Result<TuneOutcome<MoeShape>> {
            let mut outcome = TuneOutcome::default();
            for &(layer, tokens) in &request.problems {
                if request.deadline.is_some_and(|d| Instant::now() >= d) {
                    outcome.skipped.push((layer, tokens));
                    continue;
                }
                std::thread::sleep(self.pause);
                let e = moe_entry(tokens, self.env.clone());
                db.insert(e.clone());
                outcome.entries.push(e);
            }
            db.save(db_path)?;
            Ok(outcome)
        }

        fn tune_dense16(
            &mut self,
            db: &mut TuningDb,
            _: Option<&Cache>,
            request: &Dense16Request,
            progress: &mut dyn FnMut(usize, usize),
        ) -> kdtree_jit::tune::error::Result<Vec<Dense16Tuned>> {
            let mut done = Vec::new();
            for &s in request.shapes {
                if request.deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                std::thread::sleep(self.pause);
                for &m in request.ms {
                    let e = dense_entry(
                        DenseShape { n: s.n as usize, k: s.k as usize, dtype: request.dtype },
                        m,
                        self.env.clone(),
                    );
                    let winner = (e.key.clone(), e.variant.clone());
                    db.insert(e);
                    done.push(Dense16Tuned {
                        key: winner.0,
                        variant: Some(winner.1),
                        timing: Some(TIMING),
                        cublas: Some(TIMING),
                        cublas_padded: None,
                        gbps: None,
                        rejected: Vec::new(),
                    });
                    progress(done.len(), request.shapes.len() * request.ms.len());
                }
            }
            Ok(done)
        }
    }

    fn fake(pause: Duration) -> impl FnOnce() -> kdtree_jit::tune::error::Result<FakeTuner> {
        move || Ok(FakeTuner { env: Environment::sample_h200(), pause })
    }

    #[test]
    fn a_budget_of_0_or_nothing_missing_opens_no_tuner() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tuning.json");
        let mut empty = db(Vec::new());
        let todo = missing_in(&empty, MoeKernels::default(), Mode::Fast);
        let never = || -> kdtree_jit::tune::error::Result<FakeTuner> { panic!("no tuner is opened") };
        assert_eq!(tune(never, &mut empty, &path, None, &todo, Duration::ZERO, &mut |_| {}).unwrap(), None);
        let never = || -> kdtree_jit::tune::error::Result<FakeTuner> { panic!("no tuner is opened") };
        let nothing = Missing::default();
        assert_eq!(tune(never, &mut empty, &path, None, &nothing, Duration::from_secs(60), &mut |_| {}).unwrap(), None);
        assert!(empty.entries.is_empty() && !path.exists());
    }

    #[test]
    fn what_is_tuned_is_saved_and_no_longer_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tuning.json");
        let mut tuning = db(Vec::new());
        let (moe, mode) = (MoeKernels::PerExpert, Mode::Fast);
        let todo = missing_in(&tuning, moe, mode);
        let summary = tune(fake(Duration::ZERO), &mut tuning, &path, None, &todo, Duration::from_secs(60), &mut |_| {})
            .unwrap()
            .unwrap();
        assert_eq!((summary.tuned, summary.skipped, summary.failed), (todo.len(), 0, 0));
        assert!(missing_in(&tuning, moe, mode).is_empty());
        assert_eq!(TuningDb::open(&path).unwrap().entries, tuning.entries);
        assert!(
            summary.to_string().starts_with("startup tuning: tuned 17, skipped 0 for the budget, in "),
            "{summary}"
        );
    }

    #[test]
    fn the_budget_stops_new_shapes_from_starting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tuning.json");
        let mut tuning = db(Vec::new());
        let todo = missing_in(&tuning, MoeKernels::PerExpert, Mode::Exact { m: 1 });
        let budget = Duration::from_millis(200);
        let summary = tune(fake(2 * budget), &mut tuning, &path, None, &todo, budget, &mut |_| {}).unwrap().unwrap();
        // The first shape was started in time and finished; the second and the dense one were not
        // started.
        assert_eq!((summary.tuned, summary.skipped), (1, 2));
        assert_eq!(missing_in(&tuning, MoeKernels::PerExpert, Mode::Exact { m: 1 }).len(), 2);
        // Grouped: the W4A16 shape, then the MoE step, each started in time; the dense one not.
        let todo = missing_in(&tuning, MoeKernels::default(), Mode::Exact { m: 1 });
        assert_eq!((todo.w4a16.len(), todo.moe.len(), todo.dense16.len()), (0, 1, 1));
        let summary = tune(fake(2 * budget), &mut tuning, &path, None, &todo, budget, &mut |_| {}).unwrap().unwrap();
        assert_eq!((summary.tuned, summary.skipped), (1, 1));
        assert_eq!(missing_in(&tuning, MoeKernels::default(), Mode::Exact { m: 1 }).moe, []);
        assert!(summary.seconds >= budget.as_secs_f64());
    }
}
