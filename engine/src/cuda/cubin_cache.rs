//! The cubin cache the backend compiles through. A directory the cache refuses (not a directory, not
//! the user's, writable by others) is no reason to refuse the GPU: kernels then compile at every
//! start, and a note on stderr says so, naming the directory and why, instead of a silent slowdown.

use std::path::Path;
use std::sync::Once;

use kdtree_jit::Cache;

/// The cache in `dir`, or `None` once the note saying why is printed: once a process, since each
/// backend opened (one per GPU) would repeat it.
pub(super) fn open(dir: &Path) -> Option<Cache> {
    static NOTED: Once = Once::new();
    open_or_note(dir).inspect_err(|note| NOTED.call_once(|| eprintln!("{note}"))).ok()
}

/// The cache in `dir`, or the note saying that it is not used and why (the error names the directory).
fn open_or_note(dir: &Path) -> Result<Cache, String> {
    Cache::open(dir).map_err(|e| format!("note: kernels compile at every start, without a cubin cache: {e}"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_cache_directory_others_may_write_is_not_used_and_the_note_names_it_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let note = open_or_note(&shared).map(|_| ()).unwrap_err();
        assert!(note.contains(&shared.display().to_string()), "{note}");
        assert!(note.contains("may be written by its group or others"), "{note}");
        assert!(open_or_note(&dir.path().join("private")).is_ok());
    }
}
