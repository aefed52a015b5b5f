//! The engine's integration tests, in one binary (each test binary links the engine and every
//! dependency, so one is much cheaper to build than one a file). Tests that need a GPU are
//! `#[ignore]`d with a reason: `cargo test --release -p kdtree-engine --test all -- --ignored
//! --test-threads 1` on a GPU machine (a module's name, such as `cuda::`, narrows it). Fixtures live in
//! `tests/fixtures`, the NumPy reference in `tests/reference`.

mod arguments;
mod backend_choice;
mod cli;
mod config;
mod cuda;
mod cuda_finite;
mod cuda_graphs;
mod cuda_moe;
mod cuda_ops;
mod ddtree_bitwise;
mod ddtree_common;
mod ddtree_drafters;
mod ddtree_exact;
mod ddtree_tree;
mod dflash;
mod dflash_timing;
mod dtype;
mod errors;
mod gpu_common;
mod int4;
mod make_model;
mod memory;
mod model;
mod poison;
mod reference;
mod routing;
mod serve;
mod sharded;
mod spec_methods;
mod startup_tune;
mod text;
