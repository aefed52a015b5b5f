//! A model folder written all or nothing: every file goes to a temporary name in the folder and is
//! renamed into place only once all are written. A run that fails (a full disk, a bad spec found
//! late) removes its temporary files and the folders it created, and leaves the files of an earlier
//! model there untouched, rather than a mix of partial shards and old ones.

use std::fs::File;
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::error::{EngineError, Result};

/// The folder being written and the files staged in it.
pub(crate) struct Staging {
    dir: PathBuf,
    /// The folders this run created, outermost first: removed again (when empty) on failure.
    created: Vec<PathBuf>,
    /// Each staged file and the name it takes when committed.
    files: Vec<(NamedTempFile, String)>,
}

impl Staging {
    /// Creates `dir` and the missing folders above it. An existing `dir` must be a folder.
    pub fn create(dir: &Path) -> Result<Staging> {
        let io = |path: &Path, source| EngineError::Io { file: path.display().to_string(), source };
        if dir.exists() && !dir.is_dir() {
            return Err(EngineError::NotAFolder { path: dir.display().to_string() });
        }
        let mut created: Vec<PathBuf> =
            dir.ancestors().take_while(|a| !a.as_os_str().is_empty() && !a.exists()).map(Path::to_owned).collect();
        created.reverse();
        let staging = Staging { dir: dir.to_owned(), created, files: Vec::new() };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        Ok(staging)
    }

    /// A new file that will be `name` in the folder once committed; `write` fills it, and is told the
    /// path it will have, for its errors.
    pub(crate) fn stage(&mut self, name: &str, write: impl FnOnce(&File, &Path) -> Result<()>) -> Result<()> {
        let path = self.dir.join(name);
        let io = |source| EngineError::Io { file: path.display().to_string(), source };
        let file = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .tempfile_in(&self.dir)
            .map_err(io)?;
        write(file.as_file(), &path)?;
        self.files.push((file, name.to_owned()));
        Ok(())
    }

    /// Renames every staged file into place.
    pub fn commit(mut self) -> Result<()> {
        for (file, name) in std::mem::take(&mut self.files) {
            let path = self.dir.join(&name);
            file.persist(&path).map_err(|e| EngineError::Io { file: path.display().to_string(), source: e.error })?;
        }
        self.created.clear();
        Ok(())
    }
}

impl Drop for Staging {
    /// Uncommitted: the staged files go (each removes itself when dropped), then the folders this run
    /// made, innermost first, where nothing else was put in them meanwhile.
    fn drop(&mut self) {
        self.files.clear();
        for dir in self.created.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
