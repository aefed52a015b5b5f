//! The DB on disk: read with a bound, written merged under a lock and renamed into place.

use std::io::{Read as _, Write};
use std::path::{Path, PathBuf};

use super::{Entry, MAX_FILE_BYTES, TuningDb};
use crate::tune::error::{Result, TuneError};

impl TuningDb {
    /// Reads the DB at `path`; a missing file is an empty DB. A file that does not parse (or is not
    /// a regular file, or is larger than `MAX_FILE_BYTES`) is an error naming the file and the
    /// place, and is not touched.
    pub fn open(path: &Path) -> Result<TuningDb> {
        let corrupt = |message: String| TuneError::CorruptDb { path: path.into(), message };
        let text = match read_bounded(path) {
            Ok(Contents::Missing) => return Ok(TuningDb::default()),
            Ok(Contents::Unusable(why)) => return Err(corrupt(why)),
            Ok(Contents::Text(text)) => text,
            Err(source) => return Err(TuneError::DbIo { path: path.into(), source }),
        };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| corrupt(format!("not JSON ({e})")))?;
        match value.get("format").and_then(|f| f.as_u64()) {
            Some(f) if f == super::FORMAT as u64 => {}
            Some(f) => return Err(corrupt(format!("format version {f}, this build reads version {}", super::FORMAT))),
            None => return Err(corrupt("no format version: not a kdtree tuning DB".into())),
        }
        let db: TuningDb = serde_json::from_value(value).map_err(|e| corrupt(format!("unexpected content ({e})")))?;
        if let Some((i, e)) = db.entries.iter().enumerate().find(|(_, e)| !e.key.m_bucket.is_power_of_two()) {
            let (bucket, variant) = (e.key.m_bucket, &e.variant);
            return Err(corrupt(format!("entry {i} ({variant}): M bucket {bucket} is not a power of two")));
        }
        Ok(db)
    }

    /// Writes the DB to `path`, merged with what the file holds by then, so that tuners sharing one
    /// DB never undo each other's work. Under an exclusive lock on `<path>.lock` the file is read
    /// again; of two entries for the same problem on the same device the more recently tuned is kept
    /// (this DB's on a tie), so a copy read before another tuner's newer result does not undo it;
    /// compile failures are united. The result goes to a temporary file of a unique name beside
    /// `path`, renamed over it, so a crash never leaves half a file. A file that no longer parses is
    /// an error and is left as it is.
    pub fn save(&self, path: &Path) -> Result<()> {
        let io = |source| TuneError::DbIo { path: path.into(), source };
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let _lock = Lock::take(path)?;
        let merged = self.merged_over(TuningDb::open(path)?);
        let text = serde_json::to_string_pretty(&merged).map_err(|e| io(std::io::Error::other(e)))? + "\n";
        let name = path.file_name().map_or_else(|| "tuning".into(), |n| n.to_string_lossy().into_owned());
        let mut tmp =
            tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".tmp").tempfile_in(dir).map_err(io)?;
        tmp.write_all(text.as_bytes()).and_then(|()| tmp.as_file().sync_all()).map_err(io)?;
        tmp.persist(path).map_err(|e| io(e.error))?;
        Ok(())
    }

    /// This DB written over `old`: of two entries of one problem and device the newer (this DB's on
    /// a tie), `old`'s compile failures of other builds added; entries sorted by key as
    /// [`insert`](Self::insert) keeps them.
    fn merged_over(&self, old: TuningDb) -> TuningDb {
        let mut merged = self.clone();
        merged.entries.retain(|e| !old.entries.iter().any(|o| o.replaces(e) && o.tuned_at_unix > e.tuned_at_unix));
        let newer_here = |o: &Entry| self.entries.iter().any(|e| e.replaces(o) && e.tuned_at_unix >= o.tuned_at_unix);
        merged.entries.extend(old.entries.into_iter().filter(|o| !newer_here(o)));
        merged.entries.sort_by(|a, b| a.key.cmp(&b.key));
        let failures = old.compile_failures.into_iter();
        merged.compile_failures.extend(failures.filter(|o| !self.compile_failures.iter().any(|f| f.same_build(o))));
        merged
    }
}

/// An exclusive advisory lock on `<db>.lock`, held while the DB is re-read and replaced. The OS drops
/// it when the process ends, so a killed tuner leaves no stale lock; the lock file itself stays, as
/// removing it would race with the next tuner taking it.
struct Lock(std::fs::File);

impl Lock {
    fn take(db: &Path) -> Result<Lock> {
        let mut name = db.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        let io = |source| TuneError::DbIo { path: path.clone(), source };
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io)?;
        // Called through the trait: std's File::lock (Rust 1.89) would shadow it as an inherent method.
        fs4::FileExt::lock(&file).map_err(io)?;
        Ok(Lock(file))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Closing the file releases the lock too; unlocking first just says so.
        let _ = fs4::FileExt::unlock(&self.0);
    }
}

/// What reading a DB file found.
enum Contents {
    Missing,
    /// Not a regular file, larger than [`MAX_FILE_BYTES`], or not UTF-8: why.
    Unusable(String),
    Text(String),
}

/// The file at `path`, its type checked before it is opened and its read bounded, so that a link to
/// an endless file is refused rather than read until memory runs out.
fn read_bounded(path: &Path) -> std::io::Result<Contents> {
    let metadata = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Contents::Missing),
        Err(e) => return Err(e),
    };
    if !metadata.is_file() {
        return Ok(Contents::Unusable("not a regular file".into()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Ok(Contents::Unusable(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    Ok(String::from_utf8(bytes)
        .map_or_else(|e| Contents::Unusable(format!("not JSON (not UTF-8: {e})")), Contents::Text))
}
