//! Grouped W4A16: every routed expert of an MoE layer in one launch, the routing read on the GPU.
//!
//! | concept | where |
//! |---|---|
//! | the declared space, and its stream equivalent | [`W4a16Grouped`] in [`space`] |
//! | which points are valid (stream's rule) | `rules::check` |
//! | assignments sorted by expert, cut into tiles, and the grid's bound | [`align()`], [`tile_bound`] |
//! | the experts' stacked weights, the CPU reference product | [`repack_experts`], [`grouped_reference`] |
//! | the loaded kernel and its launch | [`GroupedKernel`] |
//! | the gate-up launch that stores SwiGLU's product, its weight layout and reference | [`Epilogue::Silu`], [`interleave_gate_up`], [`grouped_silu_reference`] |
//!
//! The kernel (`templates/w4a16_grouped.cu.tera`) is the stream algorithm over a tile table: block
//! (column tile, tile) computes the tile's rows (at most `bm` assignments of one expert, consecutive in
//! the sorted list) against that expert's weights, and writes those rows of Y, which is in sorted
//! order. Its grid is [`tile_bound`] tiles high, a bound the host knows without the routing; the
//! tile count lives on the device, so the routing never crosses to the host. A row's bits are those
//! the stream variant of the same axes ([`W4a16Grouped::stream`]) computes for it alone.
//!
//! ```no_run
//! use kdtree_jit::{Gpu, Target};
//! use kdtree_jit::w4a16::grouped::{Epilogue, GroupedKernel, W4a16Grouped, XRows, align, grouped_host};
//! use kdtree_quant::{Dtype, QuantizedWeight};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = Gpu::open(0)?;
//! let variant = W4a16Grouped::default_for(Dtype::Bf16, 32, &Target { arch: gpu.arch });
//! let kernel = GroupedKernel::compile(&gpu, variant, None)?;
//! let (n, k, top_k) = (128, 256, 2);
//! let experts: Vec<QuantizedWeight> = (0..4)
//!     .map(|e| QuantizedWeight::quantize(&vec![0.25 * e as f32; n * k], n, k, 32, Dtype::Bf16))
//!     .collect::<Result<_, _>>()?;
//! // Three tokens, each routed to two experts (ascending), as the router writes them.
//! let ids = [0, 3, 1, 3, 2, 3];
//! let a = align(&ids, experts.len(), kernel.variant().bm as usize);
//! let x = vec![0x3f80u16; 3 * k]; // bf16 ones
//! let rows = XRows::Gather { index: &a.sorted, div: top_k };
//! let y = grouped_host(&gpu, &kernel, Epilogue::Store, &x, k, rows, &experts, &a)?; // [6, n], rows in sorted order
//! # Ok(()) }
//! ```

pub mod align;
pub mod launch;
pub mod reference;
pub mod rules;
pub mod space;

pub use align::{Alignment, align, sample_routing, tile_bound};
pub use launch::{DeviceRows, Epilogue, GroupedBuffers, GroupedKernel, GroupedShape, grouped_host};
pub use reference::{XRows, grouped_reference, grouped_silu_reference, interleave_gate_up, repack_experts};
pub use space::W4a16Grouped;
