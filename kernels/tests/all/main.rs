//! kdtree-kernels' integration tests, in one binary (each test binary links the engine and every
//! dependency, so one is much cheaper to build than one a file). `compile` needs no GPU; every other
//! module checks kernels on the device against the engine's CPU ops and is `#[ignore]`d with a reason:
//! `cargo test --release -p kdtree-kernels --test all -- --ignored` on a GPU machine (a module's
//! name, such as `moe::`, narrows it).

mod common;
mod compile;
mod drafter;
mod elementwise;
mod finite;
mod moe;
mod moe_align;
mod ops;
mod report;
mod rows;
