//! The fuzz crate's property tests, in one binary (each test binary links the workspace and every
//! dependency, so one is much cheaper to build than one a file): every input file read, edited by a
//! hostile hand, and every W4A16/MLA variant against its CPU reference. The GPU passes are `#[ignore]`d
//! with a reason: `cargo test --release -p kdtree-fuzz --test all -- --ignored --test-threads 1` on a
//! GPU machine (a module's name, such as `gpu_mla::`, narrows it); `fuzz/README.md` says how to run a
//! long pass.

mod cache;
mod config;
mod gpu;
mod gpu_dense16;
mod gpu_grouped;
mod gpu_mla;
mod grouped;
mod layout;
mod mla;
mod safetensors;
mod tuning_db;
