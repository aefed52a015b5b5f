//! The INT4 weight format of kdtree, its CPU reference GEMM, and how outputs are compared with a
//! reference.
//!
//! | concept | where |
//! |---|---|
//! | symmetric int4, one scale per (row, group of K) | [`QuantizedWeight`] |
//! | compressed-tensors `pack-quantized` bit layout | [`int4`] |
//! | safetensors files of such weights | [`SafetensorsFile`], [`write_file`] |
//! | input files opened as regular files only (no FIFO, no device) | [`open_regular`] |
//! | the CPU oracle `Y = X · dequant(W)ᵀ` | [`reference`](mod@reference) |
//! | seeded sample data for tests and gates | [`sample`] |
//! | the error measure every output is checked with | [`compare`] |
//!
//! ```
//! use kdtree_quant::{Dtype, QuantizedWeight, reference};
//! use half::bf16;
//!
//! let (n, k) = (4, 64);
//! let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0).collect();
//! let qw = QuantizedWeight::quantize(&w, n, k, 32, Dtype::Bf16)?;
//! let x: Vec<bf16> = (0..k).map(|i| bf16::from_f32(i as f32 / 64.0)).collect();
//! let y = reference::w4a16_gemm(&x, 1, &qw)?; // [1, n]
//! assert_eq!(y.len(), n);
//! # Ok::<(), kdtree_quant::QuantError>(())
//! ```

pub mod checkpoint;
pub mod compare;
pub mod dtype;
pub mod error;
mod header;
mod input;
pub mod int4;
pub mod reference;
pub mod sample;
pub mod scales;
pub mod weight;

pub use checkpoint::{SafetensorsFile, Tensor, read_quantized, write_file};
pub use dtype::{Dtype, Half};
pub use error::{QuantError, Result};
pub use input::open_regular;
pub use scales::Scales;
pub use weight::{GROUP_SIZES, QuantizedWeight, check_group};
