//! kdtree-jit's integration tests, in one binary (each test binary links the crate and every
//! dependency, so one is much cheaper to build than one a file). NVRTC compiles run here (no GPU
//! needed); tests that need a GPU are `#[ignore]`d with a reason: `cargo test --release -p kdtree-jit
//! --test all -- --ignored --test-threads 1` on a GPU machine (a module's name, such as `gpu_wgmma::`,
//! narrows it). Test data lives in `tests/data`.

mod cache;
// The binary's command line and its report need the `cli` feature (on by default).
#[cfg(feature = "cli")]
mod cli;
mod compile;
mod compile_dense16;
mod compile_grouped;
mod compile_mla;
mod compile_wgmma;
mod gpu_dense16;
mod gpu_grouped;
mod gpu_mla;
mod gpu_mla_f32;
mod gpu_w4a16;
mod gpu_wgmma;
mod render;
mod tune_db;
mod tune_gate;
mod tune_gpu;
mod tune_moe;
mod tune_moe_gpu;
mod tune_prune;
#[cfg(feature = "cli")]
mod tune_report;
mod tune_run;
mod tune_search;
