//! Autotuning: the fastest *correct* variant per problem shape on the device at hand.
//!
//! | step | where |
//! |---|---|
//! | the problem key, M buckets, model presets | [`key`] |
//! | which variants are worth timing for a shape | [`prune`] |
//! | the random problem and its CPU reference | [`problem`] |
//! | the L2 flush between reps (a read: a write would tax the timed kernel) | [`flush`] |
//! | run once, compare with the reference | [`gate`] |
//! | time: warm-up, flush, median and spread | [`clock`], [`bench`](mod@bench) |
//! | gate, screen, time the finalists (GPU-free core) | [`search`] |
//! | the W4A16 candidates on the GPU | `gpu` |
//! | grouped MoE steps: routing draws, pruning, data and reference, the engine's lookup | [`moe`] |
//! | grouped MoE steps on the GPU | [`moe_gpu`] |
//! | streamed 16-bit weights per shape and M, beside cuBLAS | [`dense16`] |
//! | MLA attention: one decode variant per head shape over a grid of rows and contexts | [`mla`] |
//! | the device side of a run: compile once, then every M of a shape | [`session`] |
//! | a whole run as one call: plan, compile, tune, save; a deadline | [`run`] |
//! | cuBLAS and copy bandwidth in the same run | [`peers`] |
//! | results by problem and environment; stale ones refused | [`db`], [`env`](mod@env) |
//! | table, JSON, roofline picture (the last with the `cli` feature) | [`report`], `plot` |
//!
//! The engine asks the DB (which it may fill first at startup, within a time budget, with
//! [`run::tune`]):
//!
//! ```no_run
//! use kdtree_jit::Arch;
//! use kdtree_jit::tune::{db::TuningDb, env::Environment, key::{ProblemKey, Shape}};
//! # fn main() -> kdtree_jit::tune::error::Result<()> {
//! let gpu = kdtree_jit::Gpu::open(0)?;
//! let env = Environment::detect(&gpu)?;
//! let db = TuningDb::open(&TuningDb::default_path())?;
//! let key = ProblemKey::w4a16(3, Shape { n: 4096, k: 7168 }, 32, kdtree_quant::Dtype::Bf16, gpu.arch);
//! if let Some(entry) = db.best_variant(&key, &env) {
//!     println!("{} at {:.1} us", entry.variant, entry.timing.median_us);
//! }
//! # Ok(()) }
//! ```

pub mod bench;
pub mod clock;
pub mod db;
pub mod dense16;
pub mod env;
pub mod error;
pub mod flush;
pub mod gate;
mod gpu;
pub mod key;
pub mod mla;
pub mod moe;
pub mod moe_gpu;
pub mod peers;
#[cfg(feature = "cli")]
pub mod plot;
pub mod problem;
pub mod prune;
pub mod report;
pub mod run;
pub mod search;
pub mod session;

/// Whether libcublas can be loaded: probe before any cuBLAS call, which panics when it cannot.
pub use crate::cublas::present as cublas_present;
