//! Reads the parameter list of `extern "C" __global__ void name(...)` out of CUDA source text, so that the
//! macro can compare it with the Rust signature. It is a tokenizer, not a C++ parser: it understands what
//! kernel signatures are made of (qualifiers, builtin types, pointers, `__launch_bounds__`) and reports
//! a type it does not know as unknown rather than guessing.

/// One parameter of a kernel, as written in CUDA.
#[derive(Debug, PartialEq)]
pub struct Param {
    /// The declaration as written, normalised to single spaces: `const float* __restrict__ x`.
    pub text: String,
    /// The element type's words without qualifiers (`unsigned int`, `__nv_bfloat16`, `T`).
    pub base: String,
    pub pointer: bool,
    /// The pointee is `const` (`const float*`); meaningless for scalars.
    pub const_pointee: bool,
}

/// What the source says about the kernel `name`.
#[derive(Debug, PartialEq)]
pub enum Found {
    Kernel(Vec<Param>),
    /// A `__global__` function of that name without `extern "C"`: NVRTC mangles its name.
    NotExternC,
    /// No `__global__` function of that name; the names of those that exist.
    Missing(Vec<String>),
}

pub fn find_kernel(source: &str, name: &str) -> Found {
    let tokens = tokenize(source);
    let mut others = Vec::new();
    for (i, _) in tokens.iter().enumerate().filter(|(_, t)| *t == "__global__") {
        let Some(open) = tokens[i..].iter().position(|t| t == "(" || t == ";" || t == "{").map(|p| p + i) else {
            continue;
        };
        // `__launch_bounds__(256)` may stand between `__global__` and the name: skip its parentheses.
        let open = if tokens[open - 1] == "__launch_bounds__" { next_open(&tokens, open) } else { Some(open) };
        let Some(open) = open.filter(|&o| tokens[o] == "(") else { continue };
        let kernel = &tokens[open - 1];
        if kernel != name {
            others.push(kernel.clone());
            continue;
        }
        if !extern_c_before(&tokens, i) {
            return Found::NotExternC;
        }
        return Found::Kernel(params(&tokens[open + 1..]));
    }
    Found::Missing(others)
}

/// The `(` that opens the parameter list after a `__launch_bounds__(...)` starting at `open`.
fn next_open(tokens: &[String], open: usize) -> Option<usize> {
    let close = matching(tokens, open)?;
    tokens[close + 1..].iter().position(|t| t == "(").map(|p| p + close + 1)
}

fn matching(tokens: &[String], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        match t.as_str() {
            "(" => depth += 1,
            ")" if depth == 1 => return Some(i),
            ")" => depth -= 1,
            _ => {}
        }
    }
    None
}

/// `extern "C"` either directly before the declaration or as an enclosing `extern "C" {` block.
fn extern_c_before(tokens: &[String], global: usize) -> bool {
    let start = tokens[..global].iter().rposition(|t| t == ";" || t == "}").map_or(0, |p| p + 1);
    let declaration = &tokens[start..global];
    if declaration.windows(2).any(|w| w[0] == "extern" && w[1] == "\"C\"") {
        return true;
    }
    // An open `extern "C" {` block: count braces from the start of the file.
    let mut stack = Vec::new();
    for (i, t) in tokens[..global].iter().enumerate() {
        match t.as_str() {
            "{" => stack.push(i >= 2 && tokens[i - 2] == "extern" && tokens[i - 1] == "\"C\""),
            "}" => {
                stack.pop();
            }
            _ => {}
        }
    }
    stack.contains(&true)
}

/// Parameters from the token after `(` up to the matching `)`.
fn params(tokens: &[String]) -> Vec<Param> {
    let mut out = Vec::new();
    let (mut depth, mut current) = (0usize, Vec::new());
    for t in tokens {
        match t.as_str() {
            ")" if depth == 0 => break,
            "," if depth == 0 => out.push(std::mem::take(&mut current)),
            "(" | "<" | "[" => {
                depth += 1;
                current.push(t.clone());
            }
            ")" | ">" | "]" => {
                depth = depth.saturating_sub(1);
                current.push(t.clone());
            }
            _ => current.push(t.clone()),
        }
    }
    out.push(current);
    let out: Vec<Vec<String>> = out.into_iter().filter(|p| !p.is_empty()).collect();
    if out.len() == 1 && out[0] == ["void"] {
        return Vec::new();
    }
    out.iter().map(|p| param(p)).collect()
}

const QUALIFIERS: &[&str] = &["volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__"];

fn param(tokens: &[String]) -> Param {
    let star = tokens.iter().position(|t| t == "*" || t == "&");
    let pointer = star.is_some();
    let before_star = &tokens[..star.unwrap_or(tokens.len())];
    let const_pointee = pointer && before_star.iter().any(|t| t == "const");
    let mut words: Vec<&str> =
        before_star.iter().map(String::as_str).filter(|t| *t != "const" && !QUALIFIERS.contains(t)).collect();
    // Without a pointer the last word is the name, unless the type stands alone (`float`).
    if !pointer && words.len() > 1 && !is_type_word(words[words.len() - 1]) {
        words.pop();
    }
    Param { text: tokens.join(" ").replace(" *", "*"), base: words.join(" "), pointer, const_pointee }
}

fn is_type_word(w: &str) -> bool {
    matches!(w, "int" | "char" | "short" | "long" | "unsigned" | "signed" | "float" | "double" | "bool")
}

/// Identifiers, string literals and single punctuation characters, comments and preprocessor lines dropped.
fn tokenize(source: &str) -> Vec<String> {
    let chars: Vec<char> = source.chars().collect();
    let (mut tokens, mut i) = (Vec::new(), 0);
    let mut line_start = true;
    while i < chars.len() {
        let c = chars[i];
        let rest = &chars[i..];
        if rest.starts_with(&['/', '/']) || (line_start && c == '#') {
            while i < chars.len() && chars[i] != '\n' {
                // A preprocessor line continues after a backslash.
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
        } else if rest.starts_with(&['/', '*']) {
            i += 2;
            while i < chars.len() && !chars[i..].starts_with(&['*', '/']) {
                i += 1;
            }
            i += 2;
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            tokens.push(chars[start..i.min(chars.len())].iter().collect());
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else {
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
            i += 1;
            line_start = c == '\n' || (line_start && c.is_whitespace());
            continue;
        }
        line_start = false;
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(source: &str, name: &str) -> Vec<Param> {
        match find_kernel(source, name) {
            Found::Kernel(params) => params,
            other => panic!("expected a kernel, got {other:?}"),
        }
    }

    #[test]
    fn reads_pointers_scalars_and_qualifiers() {
        let src = r#"
            #include <cuda_bf16.h>
            // extern "C" __global__ void decoy(int a)
            extern "C" __global__ void __launch_bounds__(256) scale(
                const float* __restrict__ x, __nv_bfloat16 *out, unsigned int n, const float eps) { }
        "#;
        let p = kernel(src, "scale");
        assert_eq!(p.len(), 4);
        assert_eq!((p[0].base.as_str(), p[0].pointer, p[0].const_pointee), ("float", true, true));
        assert_eq!((p[1].base.as_str(), p[1].pointer, p[1].const_pointee), ("__nv_bfloat16", true, false));
        assert_eq!((p[2].base.as_str(), p[2].pointer), ("unsigned int", false));
        assert_eq!((p[3].base.as_str(), p[3].pointer), ("float", false));
        assert_eq!(p[0].text, "const float* __restrict__ x");
    }

    #[test]
    fn extern_c_block_and_missing_names() {
        let src = "extern \"C\" {\n__global__ void a(void) {}\n}\n__global__ void b(int x) {}";
        assert_eq!(find_kernel(src, "a"), Found::Kernel(Vec::new()));
        assert_eq!(find_kernel(src, "b"), Found::NotExternC);
        assert_eq!(find_kernel(src, "c"), Found::Missing(vec!["a".into(), "b".into()]));
    }

    #[test]
    fn unnamed_and_multiword_scalars() {
        let p = kernel("extern \"C\" __global__ void k(unsigned long long, int n, float) {}", "k");
        let bases: Vec<&str> = p.iter().map(|p| p.base.as_str()).collect();
        assert_eq!(bases, ["unsigned long long", "int", "float"]);
    }
}
