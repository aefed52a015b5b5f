//! Embeds every file under the workspace's `templates/` into the library, so rendering needs no path
//! at run time: writes `$OUT_DIR/templates.rs` with `TEMPLATES: &[(relative path, contents)]`.

use std::path::{Path, PathBuf};
use std::{env, fs, io};

fn main() -> io::Result<()> {
    let root = Path::new(&env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("../templates");
    // A directory: cargo re-runs this script when anything under it changes.
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    if root.is_dir() {
        collect(&root, &mut files)?;
    }
    files.sort();
    let mut out = String::from("pub(crate) const TEMPLATES: &[(&str, &str)] = &[\n");
    for file in &files {
        let name = file.strip_prefix(&root).expect("collected under root").to_string_lossy().replace('\\', "/");
        let path = fs::canonicalize(file)?;
        out.push_str(&format!("    ({name:?}, include_str!({:?})),\n", path.display().to_string()));
    }
    out.push_str("];\n");
    fs::write(Path::new(&env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("templates.rs"), out)
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, files)?;
        } else {
            files.push(path);
        }
    }
    Ok(())
}
