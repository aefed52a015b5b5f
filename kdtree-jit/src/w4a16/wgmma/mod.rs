//! The wgmma W4A16 family (sm_90a): Hopper's warpgroup MMA, `wgmma.mma_async` m64nNk16, for
//! M = 16..256, where `mma.sync` tiles are issue-bound on dequantize -> mma.
//!
//! The product is computed as Yᵀ = W · Xᵀ: each consumer warpgroup dequantizes 64 features of the
//! weight straight into registers as the instruction's A operand (its 64 rows), and a tile of up to
//! 256 tokens of X is the B operand (the instruction's N), read from shared memory through a matrix
//! descriptor (K-major, 128-byte swizzle). So a weight is dequantized once per `bm` tokens, not per
//! 16-64 rows as in `mma`. The tuner times it beside the other families ([`crate::w4a16::dense`]).
//!
//! | concept | where |
//! |---|---|
//! | the declared space | [`W4a16Wgmma`] in [`space`] |
//! | which points are valid (sm_90a only), and why not | `rules::check` |
//! | its weight layout and CPU repack | `layout` |
//! | how a variant launches: grid, block, shared memory, split-K workspace | `launch` |
//!
//! ```no_run
//! use kdtree_jit::{Gpu, Variant, compile_variant};
//! use kdtree_jit::w4a16::dense::{DenseFamily, DenseKernel};
//! use kdtree_jit::w4a16::wgmma::W4a16Wgmma;
//! use kdtree_quant::{Dtype, QuantizedWeight};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let v = W4a16Wgmma::from_name("w4a16_wgmma_bf16_g32_m128n128k128_s4_sk1_f32acc").expect("in the space");
//! let gpu = Gpu::open(0)?;
//! let compiled = compile_variant(&v, v.compile_arch(gpu.arch), None)?; // for sm_90a
//! let kernel = DenseKernel::load(&gpu, v, &compiled)?;
//! let (m, n, k) = (100, 256, 512);
//! let w: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 - 6.0).collect();
//! let qw = QuantizedWeight::quantize(&w, n, k, 32, Dtype::Bf16)?;
//! let y = kernel.gemm_host(&gpu, &vec![0x3f80u16; m * k], m, &qw)?; // bf16 ones
//! assert_eq!(y.len(), m * n);
//! # Ok(()) }
//! ```

pub(crate) mod launch;
pub(crate) mod layout;
pub mod rules;
pub mod space;

pub use space::W4a16Wgmma;
