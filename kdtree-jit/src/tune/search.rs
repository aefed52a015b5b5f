//! The tuner's core, which knows nothing of GPUs: every candidate runs once and is compared with
//! the reference (a wrong one is rejected with its error, whatever its speed), the correct ones are
//! screened with a few reps, and the finalists timed precisely. Generic over [`Runner`] and
//! [`Clock`], so CI exercises it with fakes.

use serde::{Deserialize, Serialize};

use super::bench::{BenchConfig, Timing, measure};
use super::clock::Clock;
use super::error::Result;
use super::gate;

/// Runs candidates on one fixed problem.
pub trait Runner {
    type Candidate: Clone;
    fn name(&self, c: &Self::Candidate) -> String;
    /// Runs `c` once on the problem's inputs and returns its output in f32, laid out as the reference.
    fn output(&mut self, c: &Self::Candidate) -> Result<Vec<f32>>;
    /// The largest error (`gate::MEASURE`) that `c` may show and still be correct.
    fn tolerance(&self, c: &Self::Candidate) -> f64;
    /// Readies the state `c` keeps between runs (split-K counters) before it is timed: the
    /// candidate timed before may have left it dirty. Not timed.
    fn prepare(&mut self, c: &Self::Candidate) -> Result<()>;
    /// Enqueues one run of `c`: the operation that is timed.
    fn launch(&mut self, c: &Self::Candidate) -> Result<()>;
    /// Evicts what the previous run left in caches; not timed.
    fn flush(&mut self) -> Result<()>;
}

/// A candidate that may not win, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    pub variant: String,
    pub reason: String,
}

#[derive(Clone, Debug)]
pub struct Measured<C> {
    pub candidate: C,
    pub name: String,
    pub error: f64,
    pub timing: Timing,
}

#[derive(Clone, Debug)]
pub struct Outcome<C> {
    /// The fastest correct candidate; `None` when none was correct.
    pub best: Option<Measured<C>>,
    /// Every correct candidate with its timing: the finalists first, fastest first by their precise
    /// timing, then the others by their screen.
    pub timed: Vec<Measured<C>>,
    pub rejected: Vec<Rejection>,
}

#[derive(Clone, Copy, Debug)]
pub struct SearchConfig {
    pub screen: BenchConfig,
    /// How many of the fastest screened candidates are timed again with `fin`.
    pub finalists: usize,
    pub fin: BenchConfig,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig { screen: BenchConfig::SCREEN, finalists: 4, fin: BenchConfig::FINAL }
    }
}

/// Gates, screens and times `candidates`; `progress` is called once per candidate gated.
pub fn search<R: Runner, K: Clock>(
    runner: &mut R,
    clock: &mut K,
    candidates: &[R::Candidate],
    reference: &[f32],
    cfg: &SearchConfig,
    mut progress: impl FnMut(),
) -> Result<Outcome<R::Candidate>> {
    let mut rejected = Vec::new();
    let mut correct = Vec::new();
    for c in candidates {
        let name = runner.name(c);
        let reject = |reason: String| Rejection { variant: name.clone(), reason };
        match runner.output(c) {
            Err(e) => rejected.push(reject(format!("failed to run: {e}"))),
            Ok(out) => match gate::pass(&out, reference, runner.tolerance(c)) {
                Ok(error) => correct.push((c.clone(), name.clone(), error)),
                Err(mismatch) => rejected.push(reject(mismatch.to_string())),
            },
        }
        progress();
    }

    let mut timed = Vec::new();
    let mut best_us: Option<f64> = None;
    for (candidate, name, error) in correct {
        match time(runner, clock, &candidate, &cfg.screen, best_us) {
            Ok(timing) => {
                best_us = Some(best_us.map_or(timing.median_us, |b| b.min(timing.median_us)));
                timed.push(Measured { candidate, name, error, timing });
            }
            Err(e) => rejected.push(Rejection { variant: name, reason: format!("failed while timed: {e}") }),
        }
    }
    sort_fastest_first(&mut timed);
    let finalists = cfg.finalists.min(timed.len());
    for finalist in &mut timed[..finalists] {
        finalist.timing = time(runner, clock, &finalist.candidate, &cfg.fin, None)?;
    }
    // With finalists, only they can win: a screen's few reps must not beat a precise median by luck.
    sort_fastest_first(&mut timed[..finalists]);
    Ok(Outcome { best: timed.first().cloned(), timed, rejected })
}

/// Times one candidate with the cache flushed before every rep.
pub(crate) fn time<R: Runner, K: Clock>(
    runner: &mut R,
    clock: &mut K,
    c: &R::Candidate,
    cfg: &BenchConfig,
    best_us: Option<f64>,
) -> Result<Timing> {
    runner.prepare(c)?;
    let runner = std::cell::RefCell::new(runner);
    measure(clock, cfg, best_us, || runner.borrow_mut().flush(), || runner.borrow_mut().launch(c))
}

fn sort_fastest_first<C>(timed: &mut [Measured<C>]) {
    timed.sort_by(|a, b| a.timing.median_us.total_cmp(&b.timing.median_us));
}
