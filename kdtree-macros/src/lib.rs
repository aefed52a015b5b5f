//! Proc macros of kdtree.
//!
//! | macro | what it declares |
//! |---|---|
//! | [`variant_space!`] | a space of kernel variants: axes, their values, a name and template pattern, a validity rule |
//! | [`#[kernel]`](macro@kernel) | a typed launcher for one CUDA kernel (inline, a file or a template), its signature checked against the source and registered to be compiled at startup |

use proc_macro::TokenStream;

mod kernel;
mod variant_space;

/// Declares a space of kernel variants and implements `kdtree_jit::Variant` for it. The syntax (a
/// runnable example is in `kdtree_jit`'s crate docs, which re-exports this macro):
///
/// ```text
/// kdtree_jit::variant_space! {
///     /// Element-wise scaling.
///     pub space Scale {
///         template = "scale_{dtype}.cu.tera";           // the template file, under templates/
///         name = "scale_{dtype}_b{block}";              // every axis must appear: names are unique
///         axes {
///             dtype: Dtype = [F16, Bf16],               // enum axis: the type implements `AxisValue`
///             block: u32 = [128, 256],                  // integer axis
///         }
///         check = crate::scale_rule;                    // optional: fn(&Scale, &Target) -> Result<(), Invalid>
///     }
/// }
/// ```
///
/// generates `pub struct Scale { pub dtype: Dtype, pub block: u32 }` (Clone, Copy, Debug, PartialEq, Eq,
/// Hash, serde) whose `all()` is the cartesian product of the axes, first axis outermost.
#[proc_macro]
pub fn variant_space(input: TokenStream) -> TokenStream {
    variant_space::expand(input.into()).into()
}

/// Turns a Rust signature into a typed launcher for a CUDA kernel of the same name.
///
/// ```ignore
/// use cudarc::driver::CudaSlice;
/// use kdtree_jit::kernel::{kernel, Kernels};
///
/// /// out = k * x, element-wise.
/// #[kernel(file = "cuda/scale.cu", grid = n.div_ceil(256), block = 256)]
/// pub unsafe fn scale(x: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u32, k: f32);
///
/// // expands to a launcher, registered to be compiled with every other kernel at startup:
/// // pub unsafe fn scale(kernels: &Kernels, x: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u32, k: f32)
/// //     -> kdtree_jit::Result<()>
/// ```
///
/// The source is one of `source = "inline CUDA"`, `file = "path.cu"` (relative to the crate's directory,
/// embedded at build time) or `template = "path.cu.tera"`; `params(NAME = value, ..)` render a template
/// (or an inline source) with tera at compile time. The launch configuration is a `LaunchConfig`
/// argument, or `grid = expr, block = expr[, shared = bytes]` where the expressions may use the
/// arguments (a `u32` or a tuple of up to three).
///
/// Checked at compile time: argument types (`&CudaSlice<T>`, `&mut CudaSlice<T>`, `&CudaView<T>`,
/// `&mut CudaViewMut<T>`, scalars), that every param is used by the template, and that the CUDA source
/// has an `extern "C" __global__ void` of this name whose parameters agree in count, pointer or scalar,
/// builtin element type, and `const` pointee for `&` against writable for `&mut`. What cannot be checked
/// is whether the buffers are as long as the kernel indexes them: the signature must say `unsafe fn`,
/// and a safe wrapper that checks lengths is the API to offer.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel::expand(attr.into(), item.into()).into()
}
