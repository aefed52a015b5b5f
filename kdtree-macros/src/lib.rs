//! Proc macros of kdtree.
//!
//! | macro | what it declares |
//! |---|---|
//! | [`variant_space!`] | a space of kernel variants: axes, their values, a name and template pattern, a validity rule |

use proc_macro::TokenStream;

mod variant_space;

/// Declares a space of kernel variants and implements `kdtree_jit::Variant` for it.
///
/// ```ignore
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
