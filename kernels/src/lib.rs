//! The engine's small kernels, each a CUDA source under `cuda/` declared with `#[kernel]` and checked
//! against the engine's CPU op by the GPU tests.
//!
//! | op | CUDA source | launch |
//! |---|---|---|
//! | [`rmsnorm`], [`add_rmsnorm`] (the residual add first; both may also write bf16 bits) | `cuda/rmsnorm.cu` | a block of 256 per row, float4 loads |
//! | [`silu_mul`] | `cuda/silu_mul.cu` | a thread per element |
//! | [`rope_interleaved`] | `cuda/rope_interleaved.cu` | a thread per rotated pair |
//! | [`softmax`] | `cuda/softmax.cu.tera` (`BLOCK = 1024`) | a block per row |
//! | [`argmax`] | `cuda/argmax.cu.tera` (`BLOCK = 1024`) | a block per (row, chunk), then a warp per row |
//! | [`embedding`] | `cuda/embedding.cu` | a block per id |
//!
//! The ops of a GPU-resident forward: activations in f32, GEMM inputs in bf16 bits (`u16`), ids,
//! positions and row indices as device `u32` buffers.
//!
//! | op | CUDA source | launch |
//! |---|---|---|
//! | [`f32_to_bf16`], [`f32_to_f16`], [`bf16_to_f32`], [`f16_to_f32`] | `cuda/cast.cu` | 4 elements per thread, vector loads |
//! | [`add_assign`] | `cuda/add_assign.cu` | 4 elements per thread, float4 |
//! | [`silu_mul_halves_f32`], [`silu_mul_halves_bf16`] | `cuda/silu_mul.cu` | 4 columns per thread |
//! | [`copy_cols`], [`place_cols`], [`gather_rows_u16`], [`gather_rows_f32`], [`scatter_rows_bf16_to_f32`] | `cuda/rows.cu` | a block per row, 16-byte accesses |
//! | [`embedding_bf16`] | `cuda/embedding.cu` | a block per id |
//! | [`rope_strided`] | `cuda/rope_strided.cu` | a thread per rotated pair |
//! | [`route_noaux_tc`] | `cuda/route.cu` | a warp per token |
//! | [`moe_combine`] | `cuda/moe_combine.cu` | a block per token, float4 |
//! | [`moe_combine_sorted_bf16`] | `cuda/moe_combine.cu` | a block per token, the slots' rows found through `positions` |
//! | [`moe_align`] | `cuda/moe_align.cu` | one block: counts, prefix sums, tiles, a one-warp stable scatter |
//! | [`count_nonfinite`] | `cuda/finite.cu` | up to 1024 blocks, grid-stride float4, an atomic per block |
//! | [`gqa_attention`] | `cuda/gqa_attention.cu` | a block per (kv head, row, key split), a warp per query head, key tiles through shared memory; then a block per (row, head) combines the splits |
//! | [`top_k_log_softmax`] | `cuda/top_k.cu` | chunks of 4096 tokens: a block per (row, chunk) for its max and sum, then for its k best (radix select over log-prob keys, scans that keep token order); a block per row merges |
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
pub use ops::attention::gqa_attention;
pub use ops::cast::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
pub use ops::elementwise::{add_assign, silu_mul_halves_bf16, silu_mul_halves_f32};
pub use ops::finite::count_nonfinite;
pub use ops::moe::{Routing, moe_combine, moe_combine_sorted_bf16, route_noaux_tc};
pub use ops::moe_align::{Alignment, moe_align};
pub use ops::rope::{RopeColumns, RopeLayout, rope_strided};
pub use ops::rows::{
    copy_cols, embedding_bf16, gather_rows_f32, gather_rows_u16, place_cols, scatter_rows_bf16_to_f32,
};
pub use ops::top_k::top_k_log_softmax;
pub use ops::{add_rmsnorm, argmax, embedding, rmsnorm, rope_interleaved, silu_mul, softmax};
