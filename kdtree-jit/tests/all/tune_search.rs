//! The tuner's core with a fake clock and fake candidates: no GPU needed.

use std::cell::Cell;
use std::rc::Rc;

use kdtree_jit::tune::bench::BenchConfig;
use kdtree_jit::tune::clock::Clock;
use kdtree_jit::tune::error::{Result, TuneError};
use kdtree_jit::tune::search::{Runner, SearchConfig, search};

/// A clock that reads a shared counter of microseconds; fake work advances it with [`FakeClock::advance`].
#[derive(Clone, Default)]
struct FakeClock {
    now: Rc<Cell<f64>>,
}

impl FakeClock {
    fn advance(&self, us: f64) {
        self.now.set(self.now.get() + us);
    }
}

impl Clock for FakeClock {
    type Mark = f64;

    fn mark(&mut self) -> Result<f64> {
        Ok(self.now.get())
    }

    fn elapsed_us(&mut self, from: &f64, to: &f64) -> Result<f64> {
        Ok(to - from)
    }
}

/// A fake kernel: how long it takes, and whether its output is right.
#[derive(Clone, Debug)]
struct Fake {
    name: &'static str,
    us: f64,
    output: Output,
}

#[derive(Clone, Copy, Debug)]
enum Output {
    Right,
    /// Off by this much relative to the reference.
    Off(f32),
    Nan,
    Fails,
}

/// Runs fakes against a fixed reference; each launch advances the fake clock by the fake's time,
/// each flush by a millisecond that must never be counted.
struct FakeRunner {
    clock: FakeClock,
    reference: Vec<f32>,
    launches: Vec<&'static str>,
    /// Candidates readied for timing, in order.
    prepared: Vec<&'static str>,
    /// After this many launches every launch takes twice as long (clocks dropping, a neighbour's load).
    slower_after: usize,
}

impl Runner for FakeRunner {
    type Candidate = Fake;

    fn name(&self, c: &Fake) -> String {
        c.name.into()
    }

    fn output(&mut self, c: &Fake) -> Result<Vec<f32>> {
        let r = &self.reference;
        match c.output {
            Output::Right => Ok(r.clone()),
            Output::Off(by) => Ok(r.iter().map(|v| v * (1.0 + by)).collect()),
            Output::Nan => Ok(r.iter().map(|_| f32::NAN).collect()),
            Output::Fails => Err(TuneError::Problem("launch failed: invalid argument".into())),
        }
    }

    fn tolerance(&self, _: &Fake) -> f64 {
        0.01
    }

    fn prepare(&mut self, c: &Fake) -> Result<()> {
        self.prepared.push(c.name);
        Ok(())
    }

    fn launch(&mut self, c: &Fake) -> Result<()> {
        self.launches.push(c.name);
        self.clock.advance(if self.launches.len() > self.slower_after { 2.0 * c.us } else { c.us });
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.clock.advance(1000.0);
        Ok(())
    }
}

fn run(candidates: &[Fake]) -> (kdtree_jit::tune::search::Outcome<Fake>, FakeRunner) {
    run_slowing(candidates, usize::MAX)
}

fn run_slowing(candidates: &[Fake], slower_after: usize) -> (kdtree_jit::tune::search::Outcome<Fake>, FakeRunner) {
    let clock = FakeClock::default();
    let reference: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 8.0).collect();
    let mut runner = FakeRunner {
        clock: clock.clone(),
        reference: reference.clone(),
        launches: Vec::new(),
        prepared: Vec::new(),
        slower_after,
    };
    let mut gated = 0;
    let outcome =
        search(&mut runner, &mut clock.clone(), candidates, &reference, &SearchConfig::default(), || gated += 1)
            .unwrap();
    assert_eq!(gated, candidates.len(), "progress is reported once per candidate");
    (outcome, runner)
}

const fn fake(name: &'static str, us: f64, output: Output) -> Fake {
    Fake { name, us, output }
}

#[test]
fn a_wrong_candidate_never_wins_even_when_fastest() {
    let candidates = [
        fake("wrong_fastest", 1.0, Output::Off(0.05)),
        fake("nan", 0.5, Output::Nan),
        fake("fails", 0.1, Output::Fails),
        fake("slow", 5.0, Output::Right),
        fake("fast", 3.0, Output::Right),
        fake("barely_right", 4.0, Output::Off(0.001)),
    ];
    let (outcome, runner) = run(&candidates);
    let best = outcome.best.expect("two correct candidates");
    assert_eq!(best.name, "fast");
    // The flush before every rep is not part of the time.
    assert_eq!(best.timing.median_us, 3.0);
    assert_eq!(best.timing.reps, BenchConfig::FINAL.reps);

    let rejected: Vec<&str> = outcome.rejected.iter().map(|r| r.variant.as_str()).collect();
    assert_eq!(rejected, ["wrong_fastest", "nan", "fails"]);
    assert!(outcome.rejected[0].reason.contains("wrong result"), "{}", outcome.rejected[0].reason);
    assert!(outcome.rejected[2].reason.contains("invalid argument"));
    for bad in rejected {
        assert!(!runner.launches.contains(&bad), "{bad} was timed");
    }
    let timed: Vec<&str> = outcome.timed.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(timed, ["fast", "barely_right", "slow"]);
    // Readied before each timing: the screen, then the finalists' precise timing.
    assert_eq!(runner.prepared, ["slow", "fast", "barely_right", "fast", "barely_right", "slow"]);
}

#[test]
fn no_correct_candidate_means_no_winner() {
    let (outcome, runner) = run(&[fake("a", 1.0, Output::Off(0.5)), fake("b", 2.0, Output::Fails)]);
    assert!(outcome.best.is_none());
    assert_eq!(outcome.rejected.len(), 2);
    assert!(runner.launches.is_empty());
}

#[test]
fn a_candidate_far_slower_than_the_best_is_cut_short() {
    let (outcome, runner) = run(&[fake("fast", 1.0, Output::Right), fake("slow", 10.0, Output::Right)]);
    let count = |name| runner.launches.iter().filter(|&&n| n == name).count() as u32;
    let screen = BenchConfig::SCREEN;
    // The slow one is screened with one batch only, then (as a finalist) timed in full.
    assert_eq!(count("slow"), screen.warmup + screen.batch + BenchConfig::FINAL.warmup + BenchConfig::FINAL.reps);
    assert_eq!(count("fast"), screen.warmup + screen.reps + BenchConfig::FINAL.warmup + BenchConfig::FINAL.reps);
    assert_eq!(outcome.best.unwrap().name, "fast");
}

#[test]
fn only_a_finalist_wins_even_when_a_screened_time_is_lower() {
    // The device slows down after the screen: the finalists' precise medians (2.0..2.6) all
    // exceed the screen median of the fifth (1.4), which was never timed precisely.
    let candidates: Vec<Fake> = ["a", "b", "c", "d", "e"]
        .iter()
        .enumerate()
        .map(|(i, &n)| fake(n, 1.0 + 0.1 * i as f64, Output::Right))
        .collect();
    let screen = BenchConfig::SCREEN;
    let (outcome, _) = run_slowing(&candidates, candidates.len() * (screen.warmup + screen.reps) as usize);
    let best = outcome.best.unwrap();
    assert_eq!((best.name.as_str(), best.timing.median_us, best.timing.reps), ("a", 2.0, BenchConfig::FINAL.reps));
    let timed: Vec<&str> = outcome.timed.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(timed, ["a", "b", "c", "d", "e"], "finalists first, then the screened rest");
}
