//! Compares the Rust signature with the CUDA kernel's parameter list, where the CUDA side can tell:
//! count, pointer or scalar, the element type when it is a builtin, and `const` against `&`/`&mut`.

use super::cuda::{self, Found, Param};
use super::parse::{Arg, Kind, Scalar, Signature};

pub fn signature(sig: &Signature, source: &str) -> syn::Result<()> {
    let name = sig.item.sig.ident.to_string();
    let params = match cuda::find_kernel(source, &name) {
        Found::Kernel(params) => params,
        Found::NotExternC => {
            return Err(error(
                sig,
                format!("the CUDA kernel `{name}` is not `extern \"C\"`: NVRTC would mangle its name"),
            ));
        }
        Found::Missing(others) => {
            let found = if others.is_empty() { "none".to_owned() } else { others.join(", ") };
            return Err(error(
                sig,
                format!("the source has no `extern \"C\" __global__ void {name}(...)`; kernels found: {found}"),
            ));
        }
    };
    let args: Vec<&Arg> = sig.args.iter().filter(|a| !matches!(a.kind, Kind::Config)).collect();
    if args.len() != params.len() {
        return Err(error(
            sig,
            format!(
                "the CUDA kernel `{name}` takes {} parameters but this signature passes {} (a `LaunchConfig` is not passed)",
                params.len(),
                args.len()
            ),
        ));
    }
    for (i, (arg, param)) in args.iter().zip(&params).enumerate() {
        if let Some(why) = disagreement(arg, param) {
            let n = i + 1;
            return Err(syn::Error::new_spanned(&arg.ty, format!("CUDA parameter {n} is `{}`: {why}", param.text)));
        }
    }
    Ok(())
}

fn error(sig: &Signature, message: String) -> syn::Error {
    syn::Error::new_spanned(&sig.item.sig.ident, message)
}

fn disagreement(arg: &Arg, param: &Param) -> Option<String> {
    let (elem, pointer) = match arg.kind {
        Kind::Buffer { elem, .. } => (elem, true),
        Kind::Scalar(s) => (s, false),
        Kind::Config => return None,
    };
    match (pointer, param.pointer) {
        (true, false) => return Some("a scalar, but this argument is a device buffer".to_owned()),
        (false, true) => return Some("a pointer, but this argument is a scalar".to_owned()),
        _ => {}
    }
    let spellings = cuda_names(elem);
    // A typedef or template parameter the tokenizer cannot resolve: nothing to compare.
    if known_cuda_type(&param.base) && !spellings.contains(&param.base.as_str()) {
        return Some(format!("its element type is not `{}` (CUDA spells it `{}`)", elem.rust(), spellings[0]));
    }
    match arg.kind {
        Kind::Buffer { mutable: true, .. } if param.const_pointee => {
            Some("const, but this argument is `&mut`: take the buffer by `&`".to_owned())
        }
        Kind::Buffer { mutable: false, .. } if !param.const_pointee => Some(
            "writable, but this argument is shared (`&`): take it by `&mut`, or make the CUDA side `const`".to_owned(),
        ),
        _ => None,
    }
}

/// How CUDA (on 64-bit Linux) may spell each Rust scalar; the first is the one suggested.
fn cuda_names(s: Scalar) -> &'static [&'static str] {
    match s {
        Scalar::Bool => &["bool"],
        Scalar::I8 => &["int8_t", "signed char", "char"],
        Scalar::I16 => &["int16_t", "short", "short int", "signed short"],
        Scalar::I32 => &["int", "int32_t", "signed", "signed int"],
        Scalar::I64 | Scalar::Isize => &["int64_t", "long long", "long long int", "long", "ptrdiff_t"],
        Scalar::U8 => &["uint8_t", "unsigned char"],
        Scalar::U16 => &["uint16_t", "unsigned short", "unsigned short int"],
        Scalar::U32 => &["unsigned int", "unsigned", "uint32_t"],
        Scalar::U64 | Scalar::Usize => {
            &["uint64_t", "unsigned long long", "unsigned long long int", "unsigned long", "size_t"]
        }
        Scalar::F16 => &["__half", "half"],
        Scalar::Bf16 => &["__nv_bfloat16", "nv_bfloat16"],
        Scalar::F32 => &["float"],
        Scalar::F64 => &["double"],
    }
}

fn known_cuda_type(base: &str) -> bool {
    Scalar::ALL.iter().any(|&(_, s)| cuda_names(s).contains(&base))
}
