//! `variant_space!`: a Rust-declared space of kernel variants (see [`parse`] for the syntax).

mod generate;
mod parse;

use proc_macro2::TokenStream;

pub fn expand(input: TokenStream) -> TokenStream {
    let space = match syn::parse2::<parse::Space>(input) {
        Ok(space) => space,
        Err(error) => return error.to_compile_error(),
    };
    match space.validate() {
        Ok(()) => {
            let (structure, variant) = (generate::structure(&space), generate::variant_impl(&space));
            quote::quote!(#structure #variant)
        }
        // Still define the struct, so that code using it reports no follow-on errors.
        Err(error) => {
            let (error, structure) = (error.to_compile_error(), generate::structure(&space));
            quote::quote!(#error #structure)
        }
    }
}
