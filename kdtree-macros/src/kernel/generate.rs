//! The launcher a `#[kernel]` signature expands to: same name, visibility and docs, a `&Kernels` first
//! argument and one typed `arg` push per parameter, next to a module of the same name that registers
//! the source.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Expr, ForeignItemFn};

use super::parse::{Kind, Options, Signature};
use super::source::Loaded;

/// How the launcher obtains its `LaunchConfig`.
pub enum Launch<'a> {
    Argument(&'a syn::Ident),
    Dims { grid: &'a Expr, block: &'a Expr, shared: Option<&'a Expr> },
}

pub fn launcher(sig: &Signature, options: &Options, launch: Launch, source: &Loaded) -> TokenStream {
    let name = sig.item.sig.ident.to_string();
    let (origin, embed) = (&source.origin, &source.embed);
    let params = options.params.iter().map(|(key, value)| {
        let (key, value) = (key.to_string(), quote!(#value).to_string());
        quote!((#key, #value))
    });
    let config = match launch {
        Launch::Argument(ident) => quote!(#ident),
        Launch::Dims { grid, block, shared } => {
            let shared = shared.map_or(quote!(0), |s| quote!(#s));
            quote!(::kdtree_jit::kernel::launch_config(#grid, #block, #shared))
        }
    };
    let pushes = sig.args.iter().filter_map(|arg| {
        let ident = &arg.ident;
        match arg.kind {
            Kind::Buffer { .. } => Some(quote!(::kdtree_jit::kernel::PushKernelArg::arg(&mut launch, #ident);)),
            Kind::Scalar(_) => Some(quote!(::kdtree_jit::kernel::PushKernelArg::arg(&mut launch, &#ident);)),
            Kind::Config => None,
        }
    });
    let (ident, vis) = (&sig.item.sig.ident, &sig.item.vis);
    let doc = format!("The registration of the `#[kernel]` [`{name}`](fn@{name}).");
    // A module of the launcher's name (modules and fns live in different namespaces) holds the
    // registration as a static: naming `name::KERNEL` links it into a program, which also keeps the
    // inventory entry that the linker would drop with an unreferenced object file.
    let registration = quote! {
        #[doc = #doc]
        #vis mod #ident {
            pub static KERNEL: ::kdtree_jit::kernel::KernelDef = ::kdtree_jit::kernel::KernelDef {
                name: #name,
                path: ::core::module_path!(),
                origin: #origin,
                source: #embed,
                params: &[#(#params),*],
            };
            ::kdtree_jit::kernel::inventory::submit!(::kdtree_jit::kernel::Registered(&KERNEL));
        }
    };
    let body = quote!({
        let config: ::kdtree_jit::kernel::LaunchConfig = #config;
        let mut launch = kernels.launcher(&#ident::KERNEL)?;
        #(#pushes)*
        // SAFETY: #[kernel] compared this argument list with the CUDA kernel's parameters at compile time;
        // the caller of this `unsafe fn` vouches that the buffers are as long as the kernel indexes them.
        unsafe { launch.launch(config) }?;
        ::core::result::Result::Ok(())
    });
    let launcher = signature_with(&sig.item, body);
    quote!(#registration #launcher)
}

/// The launcher's signature around `body`; with an `unreachable!` body it keeps callers compiling while
/// the macro reports an error.
pub fn signature_with(item: &ForeignItemFn, body: TokenStream) -> TokenStream {
    let (attrs, vis) = (&item.attrs, &item.vis);
    let (ident, inputs) = (&item.sig.ident, &item.sig.inputs);
    quote! {
        #(#attrs)*
        #[allow(clippy::too_many_arguments)]
        #vis unsafe fn #ident(kernels: &::kdtree_jit::kernel::Kernels, #inputs) -> ::kdtree_jit::Result<()> #body
    }
}
