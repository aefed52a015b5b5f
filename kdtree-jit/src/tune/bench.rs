//! Timing one operation: warm-up, the cache flushed before every rep so that each reads its
//! weights from memory as a decode step does, the median of many reps and its spread.

use serde::{Deserialize, Serialize};

use super::clock::Clock;
use super::error::Result;

/// The summary of one operation's reps, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub median_us: f64,
    /// 10th and 90th percentiles: the spread a reader should trust the median within.
    pub p10_us: f64,
    pub p90_us: f64,
    pub reps: u32,
}

impl Timing {
    /// The summary of `samples` (NaN times for none).
    pub fn from_samples(mut samples: Vec<f64>) -> Timing {
        samples.sort_by(f64::total_cmp);
        let at =
            |q: f64| samples.get(((samples.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(f64::NAN);
        Timing { median_us: at(0.5), p10_us: at(0.1), p90_us: at(0.9), reps: samples.len() as u32 }
    }
}

/// How long to measure.
#[derive(Clone, Copy, Debug)]
pub struct BenchConfig {
    /// Untimed runs first: module loading, clocks ramping up, instruction cache.
    pub warmup: u32,
    pub reps: u32,
    /// Reps enqueued between two looks at the results (one host synchronisation per batch).
    pub batch: u32,
    /// Stop early once the median so far exceeds this multiple of the best time known (tinygrad's
    /// BEAM does the same): a candidate 2x slower than the best needs no precise number.
    pub give_up: f64,
}

impl BenchConfig {
    /// A first look at every candidate.
    pub const SCREEN: BenchConfig = BenchConfig { warmup: 3, reps: 15, batch: 5, give_up: 1.5 };
    /// The finalists, and what `bench` reports.
    pub const FINAL: BenchConfig = BenchConfig { warmup: 5, reps: 100, batch: 25, give_up: f64::INFINITY };
}

/// Times `run`, calling `flush` (untimed) before each rep. `best_us` is the best median known so far,
/// for the early stop.
pub fn measure<C: Clock>(
    clock: &mut C,
    cfg: &BenchConfig,
    best_us: Option<f64>,
    mut flush: impl FnMut() -> Result<()>,
    mut run: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    for _ in 0..cfg.warmup {
        run()?;
    }
    let reps = cfg.reps.max(1) as usize;
    let mut samples = Vec::with_capacity(reps);
    while samples.len() < reps {
        let batch = (reps - samples.len()).min(cfg.batch.max(1) as usize);
        let mut marks = Vec::with_capacity(batch);
        for _ in 0..batch {
            flush()?;
            let start = clock.mark()?;
            run()?;
            marks.push((start, clock.mark()?));
        }
        for (start, end) in &marks {
            samples.push(clock.elapsed_us(start, end)?);
        }
        if best_us.is_some_and(|best| Timing::from_samples(samples.clone()).median_us > cfg.give_up * best) {
            break;
        }
    }
    Ok(Timing::from_samples(samples))
}
