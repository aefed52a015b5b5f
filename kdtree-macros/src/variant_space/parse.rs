//! The syntax of `variant_space!`: parsed into a [`Space`], then checked by [`Space::validate`].
//!
//! ```text
//! /// docs
//! pub space Name {
//!     template = "file_{axis}.cu.tera";
//!     name = "prefix_{axis}_{other}";
//!     axes { axis: Enum = [A, B], other: u32 = [1, 2] }
//!     check = path::to::rule;          // optional: fn(&Name, &Target) -> Result<(), Invalid>
//! }
//! ```

use std::collections::HashSet;

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, LitInt, LitStr, Path, Token, Type, Visibility, braced, bracketed};

syn::custom_keyword!(space);

pub struct Space {
    /// Outer attributes (doc comments) of the space, moved onto the generated struct.
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub ident: Ident,
    pub template: Pattern,
    pub name: Pattern,
    pub axes: Vec<Axis>,
    pub check: Option<Path>,
}

pub struct Axis {
    pub attrs: Vec<Attribute>,
    pub ident: Ident,
    pub ty: Type,
    pub values: Values,
}

/// An axis takes either enum variants (of its type) or integer literals, never both.
pub enum Values {
    Variants(Vec<Ident>),
    Ints(Vec<LitInt>),
}

/// A format string whose `{axis}` placeholders are replaced by axis values.
pub struct Pattern {
    pub lit: LitStr,
    pub parts: Vec<Part>,
}

pub enum Part {
    Text(String),
    Axis(String),
}

impl Parse for Space {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        input.parse::<space>()?;
        let ident: Ident = input.parse()?;
        let body;
        braced!(body in input);
        let (mut template, mut name, mut axes, mut check) = (None, None, None, None);
        while !body.is_empty() {
            let key: Ident = body.parse()?;
            let duplicate = || syn::Error::new_spanned(&key, format!("`{key}` is given twice"));
            match key.to_string().as_str() {
                "template" if template.is_some() => return Err(duplicate()),
                "name" if name.is_some() => return Err(duplicate()),
                "axes" if axes.is_some() => return Err(duplicate()),
                "check" if check.is_some() => return Err(duplicate()),
                "template" => template = Some(parse_assigned(&body, Pattern::parse)?),
                "name" => name = Some(parse_assigned(&body, Pattern::parse)?),
                "check" => check = Some(parse_assigned(&body, Path::parse_mod_style)?),
                "axes" => {
                    let list;
                    braced!(list in body);
                    axes = Some(Punctuated::<Axis, Token![,]>::parse_terminated(&list)?.into_iter().collect());
                }
                _ => {
                    return Err(syn::Error::new_spanned(
                        &key,
                        format!("unknown key `{key}`: expected `template`, `name`, `axes` or `check`"),
                    ));
                }
            }
        }
        let missing = |what: &str| syn::Error::new_spanned(&ident, format!("space `{ident}` lacks {what}"));
        Ok(Space {
            attrs,
            vis,
            template: template.ok_or_else(|| missing("`template = \"...\";`"))?,
            name: name.ok_or_else(|| missing("`name = \"...\";`"))?,
            axes: axes.ok_or_else(|| missing("`axes { ... }`"))?,
            check,
            ident,
        })
    }
}

/// `= <value> ;`
fn parse_assigned<T>(input: ParseStream, value: fn(ParseStream) -> syn::Result<T>) -> syn::Result<T> {
    input.parse::<Token![=]>()?;
    let parsed = value(input)?;
    input.parse::<Token![;]>()?;
    Ok(parsed)
}

impl Parse for Axis {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let ty = input.parse()?;
        input.parse::<Token![=]>()?;
        let list;
        let brackets = bracketed!(list in input);
        let (mut variants, mut ints) = (Vec::new(), Vec::new());
        while !list.is_empty() {
            if list.peek(LitInt) {
                ints.push(list.parse::<LitInt>()?);
            } else if list.peek(Ident) {
                variants.push(list.parse::<Ident>()?);
            } else {
                return Err(list.error("expected an enum variant name or an integer literal"));
            }
            if !list.is_empty() {
                list.parse::<Token![,]>()?;
            }
        }
        let values = match (variants.is_empty(), ints.is_empty()) {
            (true, true) => return Err(syn::Error::new(brackets.span.join(), "an axis needs at least one value")),
            (false, true) => Values::Variants(variants),
            (true, false) => Values::Ints(ints),
            (false, false) => {
                return Err(syn::Error::new_spanned(&ints[0], "an axis takes enum variants or integers, not both"));
            }
        };
        Ok(Axis { attrs, ident, ty, values })
    }
}

impl Pattern {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let lit: LitStr = input.parse()?;
        let text = lit.value();
        let mut parts = Vec::new();
        let mut rest = text.as_str();
        while let Some(open) = rest.find(['{', '}']) {
            let unbalanced = || syn::Error::new_spanned(&lit, "unbalanced `{` or `}`: write axes as `{axis}`");
            if rest.as_bytes()[open] == b'}' {
                return Err(unbalanced());
            }
            let close = rest[open..].find('}').ok_or_else(unbalanced)? + open;
            parts.push(Part::Text(rest[..open].to_owned()));
            parts.push(Part::Axis(rest[open + 1..close].trim().to_owned()));
            rest = &rest[close + 1..];
        }
        parts.push(Part::Text(rest.to_owned()));
        Ok(Pattern { lit, parts })
    }

    pub fn axes(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|part| match part {
            Part::Axis(axis) => Some(axis.as_str()),
            Part::Text(_) => None,
        })
    }
}

const INTEGER_TYPES: [&str; 10] = ["u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize"];

impl Space {
    /// The checks that need the whole space: every error found, combined, so all show at once.
    pub fn validate(&self) -> syn::Result<()> {
        let mut errors: Vec<syn::Error> = Vec::new();
        let mut seen = HashSet::new();
        for axis in &self.axes {
            if !seen.insert(axis.ident.to_string()) {
                errors.push(syn::Error::new_spanned(&axis.ident, format!("axis `{}` is declared twice", axis.ident)));
            }
            errors.extend(axis.validate().err());
        }
        for pattern in [&self.template, &self.name] {
            for used in pattern.axes() {
                if !seen.contains(used) {
                    let known: Vec<String> = self.axes.iter().map(|a| a.ident.to_string()).collect();
                    let message = format!("`{{{used}}}` is not an axis of this space; axes: {}", known.join(", "));
                    errors.push(syn::Error::new_spanned(&pattern.lit, message));
                }
            }
        }
        let named: HashSet<&str> = self.name.axes().collect();
        for axis in &self.axes {
            if !named.contains(axis.ident.to_string().as_str()) {
                let message =
                    format!("the name must contain `{{{}}}` so that every variant's name is unique", axis.ident);
                errors.push(syn::Error::new_spanned(&self.name.lit, message));
            }
        }
        combine(errors)
    }
}

impl Axis {
    fn validate(&self) -> syn::Result<()> {
        let integer_type = match &self.ty {
            Type::Path(p) => p.qself.is_none() && INTEGER_TYPES.iter().any(|t| p.path.is_ident(t)),
            _ => false,
        };
        let mut errors = Vec::new();
        let mut seen = HashSet::new();
        match &self.values {
            Values::Ints(ints) => {
                if !integer_type {
                    let message = "integer values need an integer type (u8, u16, u32, u64, usize, i8, ..., isize)";
                    errors.push(syn::Error::new_spanned(&self.ty, message));
                }
                for int in ints {
                    match int.base10_parse::<i128>() {
                        Ok(v) if !seen.insert(v.to_string()) => errors.push(repeated(int, int.base10_digits())),
                        Ok(_) => {}
                        Err(e) => errors.push(e),
                    }
                }
            }
            Values::Variants(variants) => {
                if integer_type {
                    let ty = &self.ty;
                    let message = format!("`{}` axes take integer literals", quote::quote!(#ty));
                    errors.push(syn::Error::new_spanned(&variants[0], message));
                }
                for variant in variants {
                    if !seen.insert(variant.to_string()) {
                        errors.push(repeated(variant, &variant.to_string()));
                    }
                }
            }
        }
        combine(errors)
    }
}

fn repeated(at: impl quote::ToTokens, value: &str) -> syn::Error {
    syn::Error::new_spanned(at, format!("value `{value}` is listed twice"))
}

fn combine(errors: Vec<syn::Error>) -> syn::Result<()> {
    let mut errors = errors.into_iter();
    match errors.next() {
        None => Ok(()),
        Some(mut first) => {
            first.extend(errors);
            Err(first)
        }
    }
}
