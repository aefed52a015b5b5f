//! `#[kernel]`: a Rust signature for a CUDA kernel (see [`parse`] for the syntax), checked against the
//! CUDA source ([`check`]) and expanded into a typed launcher that registers the source ([`generate`]).

mod check;
mod cuda;
mod generate;
mod parse;
mod source;

use proc_macro2::TokenStream;
use quote::quote;
use syn::ForeignItemFn;

use generate::Launch;
use parse::{Kind, Options, Signature};

pub fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let (decl, body) = match parse::declared(item) {
        Ok(declared) => declared,
        Err(error) => return error.to_compile_error(),
    };
    match expand_checked(attr, &decl, body) {
        Ok(tokens) => tokens,
        Err(error) => {
            let (error, stand_in) =
                (error.to_compile_error(), generate::signature_with(&decl, quote!({ ::core::unreachable!() })));
            quote!(#error #[allow(unused_variables)] #stand_in)
        }
    }
}

fn expand_checked(attr: TokenStream, decl: &ForeignItemFn, body: Option<syn::Block>) -> syn::Result<TokenStream> {
    let sig = Signature::new(decl.clone(), body)?;
    let options: Options = syn::parse2(attr)?;
    let launch = launch(&options, &sig)?;
    let source = source::load(&options)?;
    check::signature(&sig, &source.text)?;
    Ok(generate::launcher(&sig, &options, launch, &source))
}

fn launch<'a>(options: &'a Options, sig: &'a Signature) -> syn::Result<Launch<'a>> {
    let argument = sig.args.iter().find(|a| matches!(a.kind, Kind::Config));
    let ident = &sig.item.sig.ident;
    match (argument, &options.grid, &options.block) {
        (Some(arg), None, None) if options.shared.is_none() => Ok(Launch::Argument(&arg.ident)),
        (Some(arg), ..) => Err(syn::Error::new_spanned(
            &arg.ty,
            "the launch configuration is given twice: drop this `LaunchConfig` or the `grid`/`block`/`shared` options",
        )),
        (None, Some(grid), Some(block)) => Ok(Launch::Dims { grid, block, shared: options.shared.as_ref() }),
        (None, Some(_), None) => Err(syn::Error::new_spanned(ident, "`grid` needs a `block` too")),
        (None, None, Some(_)) => Err(syn::Error::new_spanned(ident, "`block` needs a `grid` too")),
        (None, None, None) => Err(syn::Error::new_spanned(
            ident,
            "a #[kernel] needs a launch configuration: a `LaunchConfig` argument, or `grid = ..., block = ...`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(attr: TokenStream, item: TokenStream) -> String {
        // Token streams print with spaces between tokens; drop them to compare against plain Rust.
        expand(attr, item).to_string().replace(' ', "")
    }

    #[test]
    fn a_file_kernel_embeds_the_file_and_pushes_arguments_in_order() {
        let out = expand_str(
            quote!(file = "tests/kernel/scale.cu", grid = n.div_ceil(256), block = 256),
            quote!(
                pub unsafe fn scale(x: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u32, k: f32);
            ),
        );
        for expected in [
            "pubunsafefnscale(kernels:&::kdtree_jit::kernel::Kernels,x:&CudaSlice<f32>,out:&mutCudaSlice<f32>,n:u32,k:f32)->::kdtree_jit::Result<()>",
            r#"::core::include_str!(::core::concat!(::core::env!("CARGO_MANIFEST_DIR"),"/","tests/kernel/scale.cu"))"#,
            r#"origin:"tests/kernel/scale.cu""#,
            "::kdtree_jit::kernel::inventory::submit!(::kdtree_jit::kernel::Registered(&KERNEL));",
            "kernels.launcher(&scale::KERNEL)?",
            "::kdtree_jit::kernel::launch_config(n.div_ceil(256),256,0)",
            "::kdtree_jit::kernel::PushKernelArg::arg(&mutlaunch,x);::kdtree_jit::kernel::PushKernelArg::arg(&mutlaunch,out);::kdtree_jit::kernel::PushKernelArg::arg(&mutlaunch,&n);::kdtree_jit::kernel::PushKernelArg::arg(&mutlaunch,&k);",
        ] {
            assert!(out.contains(expected), "missing {expected} in {out}");
        }
    }

    #[test]
    fn a_launch_config_argument_is_used_and_not_pushed() {
        let out = expand_str(
            quote!(source = "extern \"C\" __global__ void z(float* out) {}"),
            quote!(
                unsafe fn z(cfg: LaunchConfig, out: &mut CudaSlice<f32>);
            ),
        );
        assert!(out.contains("letconfig:::kdtree_jit::kernel::LaunchConfig=cfg;"), "{out}");
        assert!(out.contains("arg(&mutlaunch,out);") && !out.contains("arg(&mutlaunch,cfg)"), "{out}");
    }

    #[test]
    fn an_error_keeps_a_stand_in_launcher() {
        let out = expand_str(
            quote!(source = "extern \"C\" __global__ void z(const float* x) {}"),
            quote!(
                unsafe fn z(x: &CudaSlice<f32>);
            ),
        );
        assert!(out.contains("compile_error!"), "{out}");
        assert!(out.contains("unsafefnz(kernels:&::kdtree_jit::kernel::Kernels,x:&CudaSlice<f32>)"), "{out}");
        assert!(out.contains("::core::unreachable!()"), "{out}");
    }
}
