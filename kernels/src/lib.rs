//! The engine's small kernels, each a CUDA source under `cuda/` declared with `#[kernel]` and checked
//! against the engine's CPU op by the GPU tests.
//!
//! | op | CUDA source | launch |
//! |---|---|---|
//! | [`rmsnorm`] | `cuda/rmsnorm.cu` | a block of 256 per row, float4 loads |
//! | [`silu_mul`] | `cuda/silu_mul.cu` | a thread per element |
//! | [`rope_interleaved`] | `cuda/rope_interleaved.cu` | a thread per rotated pair |
//! | [`softmax`] | `cuda/softmax.cu.tera` (`BLOCK = 1024`) | a block per row |
//! | [`argmax`] | `cuda/argmax.cu.tera` (`BLOCK = 1024`) | a block per (row, chunk), then a warp per row |
//! | [`embedding`] | `cuda/embedding.cu` | a block per id |
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kdtree_jit::{Gpu, kernel::Kernels};
//!
//! let gpu = Gpu::open(0)?;
//! let kernels = Kernels::load(&gpu, None)?; // compiles every #[kernel] of the program, this crate's too
//! let x = kernels.stream().clone_htod(&[1.0f32, 5.0, 3.0, 9.0, 2.0, 0.0])?;
//! let mut best = kernels.stream().alloc_zeros::<u32>(2)?;
//! kdtree_kernels::argmax(&kernels, &x, 3, &mut best)?;
//! assert_eq!(kernels.stream().clone_dtoh(&best)?, [1, 0]);
//! # Ok(()) }
//! ```

pub mod error;
pub mod launch;
pub mod ops;
pub mod shape;

pub use error::{Error, Result};
pub use ops::{argmax, embedding, rmsnorm, rope_interleaved, silu_mul, softmax};
