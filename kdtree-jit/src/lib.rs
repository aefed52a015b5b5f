//! Render, compile, cache and load GPU kernel variants.
//!
//! | concept | where |
//! |---|---|
//! | a declared space of variants | [`variant_space!`], [`Variant`], [`AxisValue`] |
//! | which variants fit a GPU | [`Target`], [`Arch`], [`Invalid`] |
//! | CUDA source of a variant (tera over the embedded `templates/`) | [`render()`], [`templates_hash`] |
//! | finding NVRTC and the driver without cudarc's panic | [`probe`] |
//! | NVRTC to CUBIN, ptxas statistics, many at once | [`compile_variant`], [`compile_all`], [`compile_all_for`], [`KernelStats`] |
//! | the cubin cache on disk | [`Cache`] |
//! | loading a cubin on the GPU | [`Gpu`] |
//! | the W4A16 GEMM space, layout and launch | [`w4a16`] |
//! | 16-bit weights streamed at a few rows (decode's bf16 projections) | [`dense16`] |
//! | dense GEMMs by cuBLAS (the engine's, and the tuner's peers) | [`cublas`] |
//! | absorbed MLA in f32 (an f32 model's attention) | [`mla_f32`] |
//!
//! Declaring a space (the template is looked up only when rendering):
//!
//! ```
//! use kdtree_jit::{Arch, AxisValue, Invalid, Target, Variant};
//!
//! #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)] // serde: the generated struct derives it
//! pub enum Op { Add, Mul }
//! impl AxisValue for Op {
//!     fn as_str(&self) -> &'static str {
//!         match self { Op::Add => "add", Op::Mul => "mul" }
//!     }
//! }
//!
//! fn fits(v: &Elementwise, target: &Target) -> Result<(), Invalid> {
//!     let smem = v.block as usize * 4;
//!     let max = target.arch.smem_per_block_max();
//!     if smem > max { Err(Invalid::SharedMemory { requested: smem, max }) } else { Ok(()) }
//! }
//!
//! kdtree_jit::variant_space! {
//!     /// Element-wise binary ops.
//!     pub space Elementwise {
//!         template = "elementwise.cu.tera";
//!         name = "elementwise_{op}_b{block}";
//!         axes { op: Op = [Add, Mul], block: u32 = [128, 256] }
//!         check = fits;
//!     }
//! }
//!
//! assert_eq!(Elementwise::all().len(), 4);
//! let v = Elementwise { op: Op::Mul, block: 256 };
//! assert_eq!(v.name(), "elementwise_mul_b256");
//! assert_eq!(Elementwise::from_name("elementwise_mul_b256"), Some(v));
//! assert!(v.check(&Target { arch: Arch(90) }).is_ok());
//! ```

extern crate self as kdtree_jit;

pub mod arch;
pub mod cache;
pub mod compile;
pub mod cublas;
pub mod dense16;
mod elf;
pub mod error;
pub mod kernel;
mod launch;
pub mod mla;
pub mod mla_f32;
pub mod probe;
pub mod render;
mod runtime;
pub mod stdout;
mod sys;
pub mod tune;
pub mod variant;
pub mod w4a16;

pub use arch::Arch;
pub use cache::Cache;
pub use compile::{Compiled, KernelStats, compile_all, compile_all_for, compile_source, compile_variant};
pub use error::{Error, Result};
pub use kdtree_macros::variant_space;
pub use probe::nvrtc_version;
pub use render::{render, templates_hash};
pub use runtime::Gpu;
pub use variant::{AxisValue, DynVariant, Invalid, Target, Variant};

// serde is used by the code `variant_space!` expands to, so that callers need not depend on it;
// tera is in the signature of `Variant::context`.
#[doc(hidden)]
pub use serde;
pub use tera;
