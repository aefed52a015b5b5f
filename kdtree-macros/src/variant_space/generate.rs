//! The code `variant_space!` expands to: the struct and its `::kdtree_jit::Variant` impl.

use std::collections::HashSet;

use heck::ToSnakeCase;
use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::LitStr;
use syn::spanned::Spanned;

use super::parse::{Axis, Part, Pattern, Space, Values};

pub fn structure(space: &Space) -> TokenStream {
    let Space { attrs, vis, ident, axes, .. } = space;
    // A repeated axis was reported by `Space::validate`: declaring its field once avoids follow-on errors.
    let mut seen = HashSet::new();
    let fields = axes
        .iter()
        .filter(|axis| seen.insert(axis.ident.to_string()))
        .map(|Axis { attrs, ident, ty, .. }| quote!(#(#attrs)* pub #ident: #ty));
    quote! {
        #(#attrs)*
        #[derive(
            ::core::clone::Clone, ::core::marker::Copy, ::core::fmt::Debug, ::core::cmp::PartialEq, ::core::cmp::Eq,
            ::core::hash::Hash, ::kdtree_jit::serde::Serialize, ::kdtree_jit::serde::Deserialize,
        )]
        #[serde(crate = "::kdtree_jit::serde")]
        #vis struct #ident { #(#fields,)* }
    }
}

pub fn variant_impl(space: &Space) -> TokenStream {
    let ident = &space.ident;
    // `W4a16` -> `w4a16`, `MyKernel` -> `my_kernel`.
    let space_name = ident.to_string().to_snake_case();
    let template = format(space, &space.template);
    let name = format(space, &space.name);
    let context = space.axes.iter().map(|axis| {
        let (key, value) = (axis.ident.to_string(), text_value(axis));
        quote!(context.insert(#key, &#value);)
    });
    let check = match &space.check {
        // Bound to a typed pointer first, so a wrong signature is reported at the user's path.
        Some(rule) => quote_spanned! {rule.span()=>
            let rule: fn(&Self, &::kdtree_jit::Target) -> ::core::result::Result<(), ::kdtree_jit::Invalid> = #rule;
            rule(self, target)
        },
        None => quote!(::core::result::Result::Ok(())),
    };
    let loops = all_loops(space);
    quote! {
        impl ::kdtree_jit::Variant for #ident {
            const SPACE: &'static str = #space_name;

            fn template(&self) -> ::std::string::String {
                #template
            }

            fn name(&self) -> ::std::string::String {
                #name
            }

            fn context(&self) -> ::kdtree_jit::tera::Context {
                let mut context = ::kdtree_jit::tera::Context::new();
                #(#context)*
                context.insert("name", &::kdtree_jit::Variant::name(self));
                context
            }

            fn all() -> ::std::vec::Vec<Self> {
                let mut all = ::std::vec::Vec::new();
                #loops
                all
            }

            fn check(
                &self,
                target: &::kdtree_jit::Target,
            ) -> ::core::result::Result<(), ::kdtree_jit::Invalid> {
                #check
            }

            fn from_name(name: &str) -> ::core::option::Option<Self> {
                <Self as ::kdtree_jit::Variant>::all()
                    .into_iter()
                    .find(|variant| ::kdtree_jit::Variant::name(variant) == name)
            }
        }
    }
}

/// Nested `for` loops over every axis's values, first axis outermost, pushing each point.
fn all_loops(space: &Space) -> TokenStream {
    let fields: Vec<_> = space.axes.iter().map(|axis| &axis.ident).collect();
    let mut body = quote!(all.push(Self { #(#fields),* }););
    for axis in space.axes.iter().rev() {
        let (field, ty) = (&axis.ident, &axis.ty);
        let values = match &axis.values {
            Values::Variants(variants) => quote!(#(<#ty>::#variants),*),
            Values::Ints(ints) => quote!(#(#ints),*),
        };
        let values_ident = format_ident!("{}_values", field);
        body = quote! {
            let #values_ident: &[#ty] = &[#values];
            for &#field in #values_ident { #body }
        };
    }
    body
}

/// How an axis value reads in names and in the template context: an enum by its `AxisValue` string,
/// an integer as itself.
fn text_value(axis: &Axis) -> TokenStream {
    let field = &axis.ident;
    match axis.values {
        Values::Variants(_) => quote!(::kdtree_jit::AxisValue::as_str(&self.#field)),
        Values::Ints(_) => quote!(self.#field),
    }
}

/// `format!` of a pattern, its literal spanned at the user's string so errors point there.
fn format(space: &Space, pattern: &Pattern) -> TokenStream {
    let mut literal = String::new();
    let mut args = Vec::new();
    for part in &pattern.parts {
        match part {
            Part::Text(text) => literal.push_str(text),
            Part::Axis(name) => {
                literal.push_str("{}");
                // Placeholders that name no axis were rejected by `Space::validate`.
                args.extend(space.axes.iter().find(|axis| axis.ident == name).map(text_value));
            }
        }
    }
    let literal = LitStr::new(&literal, pattern.lit.span());
    quote!(::std::format!(#literal #(, #args)*))
}
