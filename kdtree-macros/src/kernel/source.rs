//! The kernel's CUDA text at expansion time: read from the attribute, a file or a rendered template, so
//! that the signature can be checked against it, plus the expression that embeds it in the binary.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Ident, Lit, LitStr};

use super::parse::{Options, Source};

pub struct Loaded {
    /// The CUDA source NVRTC will compile.
    pub text: String,
    /// Where it came from, for compile errors: the file as written, or "inline".
    pub origin: String,
    /// An expression of type `&'static str` holding `text` in the generated code.
    pub embed: TokenStream,
}

/// Without params a `source` is CUDA as written; with params (or from a `template` file) it is a tera
/// template, rendered here so that NVRTC, the signature check and the cache all see the final text.
pub fn load(options: &Options) -> syn::Result<Loaded> {
    match &options.source {
        Source::Inline(lit) if options.params.is_empty() => {
            Ok(Loaded { text: lit.value(), origin: "inline".to_owned(), embed: quote!(#lit) })
        }
        Source::Inline(lit) => {
            let text = render(&lit.value(), &options.params, lit)?;
            Ok(Loaded { embed: quote!(#text), text, origin: "inline template".to_owned() })
        }
        Source::File(lit) => {
            let text = read(lit)?;
            // include_str! (not the text read here) so that cargo rebuilds when the file changes.
            let embed = quote!(::core::include_str!(::core::concat!(::core::env!("CARGO_MANIFEST_DIR"), "/", #lit)));
            Ok(Loaded { text, origin: lit.value(), embed })
        }
        Source::Template(lit) => {
            let text = render(&read(lit)?, &options.params, lit)?;
            // The include_str! is unused except as a dependency edge on the template file.
            let embed = quote!({
                const _: &str = ::core::include_str!(::core::concat!(::core::env!("CARGO_MANIFEST_DIR"), "/", #lit));
                #text
            });
            Ok(Loaded { text, origin: lit.value(), embed })
        }
    }
}

fn read(lit: &LitStr) -> syn::Result<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR")
        .map_err(|_| syn::Error::new_spanned(lit, "CARGO_MANIFEST_DIR is not set"))?;
    std::fs::read_to_string(std::path::Path::new(&dir).join(lit.value())).map_err(|e| {
        syn::Error::new_spanned(lit, format!("cannot read `{}` (relative to the crate's directory): {e}", lit.value()))
    })
}

fn render(template: &str, params: &[(Ident, Lit)], lit: &LitStr) -> syn::Result<String> {
    let used = used_names(template);
    let mut context = tera::Context::new();
    for (name, value) in params {
        let key = name.to_string();
        if !used.contains(&key) {
            return Err(syn::Error::new_spanned(name, format!("the template does not use `{key}`")));
        }
        match value {
            Lit::Int(i) => context.insert(key, &i.base10_parse::<i64>()?),
            Lit::Float(f) => context.insert(key, &f.base10_parse::<f64>()?),
            Lit::Bool(b) => context.insert(key, &b.value),
            Lit::Str(s) => context.insert(key, &s.value()),
            other => {
                return Err(syn::Error::new_spanned(other, "a template param is an integer, float, bool or string"));
            }
        }
    }
    tera::Tera::one_off(template, &context, false).map_err(|e| {
        // tera's top-level message only says that rendering failed; the innermost cause says why.
        let mut cause: &dyn std::error::Error = &e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        let why = cause.to_string().replace(" while rendering '__tera_one_off'", "");
        syn::Error::new_spanned(lit, format!("rendering the template: {why}"))
    })
}

/// Identifiers inside `{{ }}` and `{% %}` tags: what a template can refer to.
fn used_names(template: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{").into_iter().chain(rest.find("{%")).min() {
        let close = if rest[start..].starts_with("{{") { "}}" } else { "%}" };
        let Some(end) = rest[start..].find(close) else { break };
        let tag = &rest[start + 2..start + end];
        names.extend(
            tag.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with(|c: char| c.is_alphabetic() || c == '_'))
                .map(str::to_owned),
        );
        rest = &rest[start + end + 2..];
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_tags_only() {
        let names = used_names("BLOCK {{ WIDTH * 2 }} {% if FAST %}x{% endif %} {# SLOW #}");
        assert_eq!(names, ["WIDTH", "if", "FAST", "endif"]);
    }

    #[test]
    fn renders_and_rejects_unused_params() {
        let lit: LitStr = syn::parse_quote!("t");
        let params: Vec<(Ident, Lit)> = vec![(syn::parse_quote!(N), syn::parse_quote!(4))];
        assert_eq!(render("int a[{{ N }}];", &params, &lit).unwrap(), "int a[4];");
        let error = render("int a[4];", &params, &lit).unwrap_err();
        assert_eq!(error.to_string(), "the template does not use `N`");
    }
}
