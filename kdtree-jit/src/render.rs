//! Rendering variants to CUDA source with tera 1.x over the `templates/` directory, which is embedded
//! at build time (see `build.rs`): a binary renders anywhere, with no path to find.
//!
//! tera 1.x rather than 2: templates share code through `{% include %}` and `{% import %}` macros,
//! which tera 2 removed. Templates may not `#include` files: NVRTC has no include path at run time.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use tera::Tera;

use crate::{Error, Result, Variant};

include!(concat!(env!("OUT_DIR"), "/templates.rs"));

/// Every embedded template file as (path relative to `templates/`, contents), sorted by path.
pub fn templates() -> &'static [(&'static str, &'static str)] {
    TEMPLATES
}

/// sha256 (hex) of every file under `templates/`, names and contents: changes whenever any template does.
pub fn templates_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let mut hasher = Sha256::new();
        for (name, contents) in TEMPLATES {
            // Lengths first, so that no two different file sets hash the same bytes.
            for part in [name.as_bytes(), contents.as_bytes()] {
                hasher.update((part.len() as u64).to_le_bytes());
                hasher.update(part);
            }
        }
        hex::encode(hasher.finalize())
    })
}

/// The variant's CUDA source: its template rendered with its context.
pub fn render<V: Variant>(v: &V) -> Result<String> {
    let template = v.template();
    let error = |message: String| Error::Render { template: template.clone(), variant: v.name(), message };
    let tera = tera().map_err(|message| error(message.clone()))?;
    tera.render(&template, &v.context()).map_err(|e| error(chain(&e)))
}

/// All templates parsed once; a template that fails to parse fails every render, with tera's message.
fn tera() -> std::result::Result<&'static Tera, &'static String> {
    static TERA: OnceLock<std::result::Result<Tera, String>> = OnceLock::new();
    TERA.get_or_init(|| {
        let mut tera = Tera::default();
        tera.add_raw_templates(TEMPLATES.iter().copied()).map_err(|e| chain(&e))?;
        Ok(tera)
    })
    .as_ref()
}

/// A tera error with its causes: tera's own message is often just "failed to render X".
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
