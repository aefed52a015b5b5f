//! The syntax of `#[kernel(...)]`: the attribute's arguments ([`Options`]) and the annotated signature
//! ([`Signature`]).
//!
//! ```text
//! #[kernel(file = "cuda/scale.cu", grid = n.div_ceil(256), block = 256)]       // or source = "...",
//! pub unsafe fn scale(x: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u32, k: f32); // or template = "..", params(..)
//! ```

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, FnArg, ForeignItemFn, GenericArgument, Ident, Lit, LitStr, Pat, PathArguments, Token, Type};

pub enum Source {
    /// CUDA text; a tera template when `params` are given.
    Inline(LitStr),
    /// Relative to the crate's `CARGO_MANIFEST_DIR`.
    File(LitStr),
    /// A tera template file relative to `CARGO_MANIFEST_DIR`, rendered with `params`.
    Template(LitStr),
}

pub struct Options {
    pub source: Source,
    pub params: Vec<(Ident, Lit)>,
    pub grid: Option<Expr>,
    pub block: Option<Expr>,
    pub shared: Option<Expr>,
}

impl Parse for Options {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let (mut source, mut params, mut grid, mut block, mut shared) = (None, None, None, None, None);
        while !input.is_empty() {
            let key: Ident = input.parse()?;
            let twice = || syn::Error::new_spanned(&key, format!("`{key}` is given twice"));
            match key.to_string().as_str() {
                "source" | "file" | "template" if source.is_some() => {
                    return Err(syn::Error::new_spanned(&key, "give one of `source`, `file` or `template`"));
                }
                "params" if params.is_some() => return Err(twice()),
                "grid" if grid.is_some() => return Err(twice()),
                "block" if block.is_some() => return Err(twice()),
                "shared" if shared.is_some() => return Err(twice()),
                "source" => source = Some(Source::Inline(assigned(input)?)),
                "file" => source = Some(Source::File(assigned(input)?)),
                "template" => source = Some(Source::Template(assigned(input)?)),
                "grid" => grid = Some(assigned(input)?),
                "block" => block = Some(assigned(input)?),
                "shared" => shared = Some(assigned(input)?),
                "params" => {
                    let list;
                    syn::parenthesized!(list in input);
                    let pairs = Punctuated::<Param, Token![,]>::parse_terminated(&list)?;
                    params = Some(pairs.into_iter().map(|p| (p.name, p.value)).collect::<Vec<_>>());
                }
                _ => {
                    return Err(syn::Error::new_spanned(
                        &key,
                        format!(
                            "unknown #[kernel] option `{key}`: expected source, file, template, params, grid, block or shared"
                        ),
                    ));
                }
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        let Some(source) = source else {
            return Err(syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[kernel] needs the kernel's CUDA source: `source = \"...\"`, `file = \"path.cu\"` or `template = \"path.cu.tera\"`",
            ));
        };
        let params = params.unwrap_or_default();
        if let (Some((name, _)), Source::File(_)) = (params.first(), &source) {
            return Err(syn::Error::new_spanned(
                name,
                "a `file` is CUDA as written: name a file to render with `params` as `template = \"...\"`",
            ));
        }
        Ok(Options { source, params, grid, block, shared })
    }
}

fn assigned<T: Parse>(input: ParseStream) -> syn::Result<T> {
    input.parse::<Token![=]>()?;
    input.parse()
}

struct Param {
    name: Ident,
    value: Lit,
}

impl Parse for Param {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        Ok(Param { name: input.parse()?, value: assigned(input)? })
    }
}

/// Rust types a kernel argument may have; the generated launcher names them literally, so rustc checks
/// what callers pass.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Scalar {
    Bool,
    I8,
    I16,
    I32,
    I64,
    Isize,
    U8,
    U16,
    U32,
    U64,
    Usize,
    F16,
    Bf16,
    F32,
    F64,
}

impl Scalar {
    pub const ALL: [(&str, Scalar); 15] = [
        ("bool", Scalar::Bool),
        ("i8", Scalar::I8),
        ("i16", Scalar::I16),
        ("i32", Scalar::I32),
        ("i64", Scalar::I64),
        ("isize", Scalar::Isize),
        ("u8", Scalar::U8),
        ("u16", Scalar::U16),
        ("u32", Scalar::U32),
        ("u64", Scalar::U64),
        ("usize", Scalar::Usize),
        ("f16", Scalar::F16),
        ("bf16", Scalar::Bf16),
        ("f32", Scalar::F32),
        ("f64", Scalar::F64),
    ];

    fn from_type(ty: &Type) -> Option<Scalar> {
        let Type::Path(p) = ty else { return None };
        let last = p.path.segments.last()?;
        if !last.arguments.is_none() {
            return None;
        }
        Scalar::ALL.iter().find(|(name, _)| last.ident == name).map(|&(_, s)| s)
    }

    pub fn rust(self) -> &'static str {
        Scalar::ALL.iter().find(|(_, s)| *s == self).map_or("?", |(name, _)| name)
    }
}

pub enum Kind {
    /// A device buffer: the kernel gets a pointer to `elem`.
    Buffer {
        elem: Scalar,
        mutable: bool,
    },
    Scalar(Scalar),
    /// The launch configuration, not passed to the kernel.
    Config,
}

pub struct Arg {
    pub ident: Ident,
    pub ty: Type,
    pub kind: Kind,
}

pub struct Signature {
    pub item: ForeignItemFn,
    pub args: Vec<Arg>,
}

const SUPPORTED: &str = "a #[kernel] argument is `&CudaSlice<T>`, `&mut CudaSlice<T>`, `&CudaView<T>`, \
    `&mut CudaViewMut<T>` with T a primitive number or bool, such a scalar by value, or a `LaunchConfig`";

/// The annotated item as written, and whether it (wrongly) has a body; parsed before anything is
/// checked, so that an error can still emit a launcher of this signature.
pub fn declared(item: proc_macro2::TokenStream) -> syn::Result<(ForeignItemFn, Option<syn::Block>)> {
    match syn::parse2::<ForeignItemFn>(item.clone()) {
        Ok(item) => Ok((item, None)),
        Err(error) => match syn::parse2::<syn::ItemFn>(item) {
            Ok(f) => {
                let decl = ForeignItemFn { attrs: f.attrs, vis: f.vis, sig: f.sig, semi_token: Default::default() };
                Ok((decl, Some(*f.block)))
            }
            Err(_) => Err(error),
        },
    }
}

impl Signature {
    /// A signature ends in `;`: the body of a kernel is its CUDA source.
    pub fn new(item: ForeignItemFn, body: Option<syn::Block>) -> syn::Result<Signature> {
        if let Some(body) = body {
            return Err(syn::Error::new_spanned(body, "a #[kernel] fn has no body: end the signature with `;`"));
        }
        let sig = &item.sig;
        if let Some(bad) = sig.generics.params.first() {
            return Err(syn::Error::new_spanned(
                bad,
                "a #[kernel] fn cannot be generic: use a `template` with `params`",
            ));
        }
        if let Some(bad) = &sig.asyncness {
            return Err(syn::Error::new_spanned(
                bad,
                "a #[kernel] launcher only enqueues the kernel: it is not `async`",
            ));
        }
        if sig.unsafety.is_none() {
            return Err(syn::Error::new_spanned(
                sig.fn_token,
                "a #[kernel] launcher is an `unsafe fn`: the kernel indexes its buffers by its scalar arguments, \
                 which Rust cannot check; wrap it in a safe fn that checks the lengths",
            ));
        }
        if let syn::ReturnType::Type(_, ty) = &sig.output {
            return Err(syn::Error::new_spanned(
                ty,
                "a #[kernel] fn declares no return type: it returns `kdtree_jit::Result<()>`",
            ));
        }
        let args = sig.inputs.iter().map(arg).collect::<syn::Result<Vec<_>>>()?;
        let configs: Vec<&Arg> = args.iter().filter(|a| matches!(a.kind, Kind::Config)).collect();
        if let Some(second) = configs.get(1) {
            return Err(syn::Error::new_spanned(&second.ty, "only one `LaunchConfig` argument"));
        }
        Ok(Signature { item, args })
    }
}

fn arg(input: &FnArg) -> syn::Result<Arg> {
    let FnArg::Typed(typed) = input else {
        return Err(syn::Error::new_spanned(input, "a #[kernel] fn takes no `self`"));
    };
    let Pat::Ident(pat) = &*typed.pat else {
        return Err(syn::Error::new_spanned(&typed.pat, "name each #[kernel] argument with a plain identifier"));
    };
    let ty = (*typed.ty).clone();
    let kind = kind(&ty)?;
    Ok(Arg { ident: pat.ident.clone(), ty, kind })
}

fn kind(ty: &Type) -> syn::Result<Kind> {
    if let Some(s) = Scalar::from_type(ty) {
        return Ok(Kind::Scalar(s));
    }
    let unsupported = || syn::Error::new_spanned(ty, SUPPORTED);
    match ty {
        Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "LaunchConfig") => Ok(Kind::Config),
        Type::Reference(r) => {
            let Type::Path(p) = &*r.elem else { return Err(unsupported()) };
            let last = p.path.segments.last().ok_or_else(unsupported)?;
            let mutable = r.mutability.is_some();
            match (last.ident.to_string().as_str(), mutable) {
                ("CudaSlice", _) | ("CudaView", false) | ("CudaViewMut", true) => {}
                ("CudaView", true) => {
                    return Err(syn::Error::new_spanned(ty, "a `CudaView` is read-only: take `&mut CudaViewMut<T>`"));
                }
                _ => return Err(unsupported()),
            }
            let PathArguments::AngleBracketed(generics) = &last.arguments else { return Err(unsupported()) };
            let elem = generics.args.iter().find_map(|a| match a {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            });
            let elem = elem.ok_or_else(unsupported)?;
            let elem = Scalar::from_type(elem).ok_or_else(|| {
                syn::Error::new_spanned(
                    elem,
                    "a #[kernel] buffer holds a primitive number or bool (f32, bf16, u32, ...)",
                )
            })?;
            Ok(Kind::Buffer { elem, mutable })
        }
        _ => Err(unsupported()),
    }
}
