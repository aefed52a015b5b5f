//! The cubin cache on disk: one file per (kernel, source, options, NVRTC version, arch).
//!
//! A file is `sha256(body) || body`, body = `u32 LE metadata length || metadata JSON || cubin`, so a
//! corrupt or truncated entry is detected, reported and recompiled, never loaded. Entries are written
//! to a temporary file in the cache directory and renamed into place: readers never see half a file,
//! and concurrent compiles of one kernel simply race to write the same bytes.
//!
//! Whoever can write the cache chooses the code the GPU runs, and a checksum recomputed by a forger
//! proves nothing. So the cache trusts no one but its user, as ccache and sccache do: the directory is
//! created private (0700), a directory not the user's or writable by group or others is refused, and
//! so is an entry (then recompiled and replaced, which only the owner of the directory can do).

use std::fs::{DirBuilder, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::compile::KernelStats;
use crate::error::CacheProblem;
use crate::{Arch, Error, Result, sys};

/// Bumped whenever the key or the file format changes: old entries then simply miss.
const FORMAT_VERSION: u32 = 2;

/// The largest entry read: one kernel's cubin is well under 1 MiB. A larger file, or one that is not a
/// regular file (a link to `/dev/zero`, a FIFO), is reported as unusable without being read.
pub const MAX_ENTRY_BYTES: u64 = 64 << 20;

/// The environment variable that overrides [`Cache::default_dir`].
pub const CACHE_DIR_ENV: &str = "KDTREE_CACHE_DIR";

/// A directory of cached cubins.
#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
}

/// The hash of everything that changes a compile's output.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey(String);

/// What a cache file holds besides the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedCubin {
    pub stats: KernelStats,
    pub cubin: Vec<u8>,
}

/// The outcome of a lookup.
#[derive(Debug, PartialEq, Eq)]
pub enum CacheLookup {
    Hit(CachedCubin),
    Miss,
    /// An entry exists but cannot be used: why (corrupt, truncated, unreadable).
    Unusable(String),
}

#[derive(Serialize, Deserialize)]
struct Metadata {
    stats: KernelStats,
}

impl CacheKey {
    pub fn new(name: &str, source: &str, options: &[String], nvrtc: (i32, i32), arch: Arch) -> CacheKey {
        let mut hasher = Sha256::new();
        hasher.update(FORMAT_VERSION.to_le_bytes());
        // Length-prefixed, so that no two different inputs hash the same byte stream.
        let mut part = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        part(name.as_bytes());
        part(source.as_bytes());
        for option in options {
            part(option.as_bytes());
        }
        part(format!("nvrtc {}.{} {arch}", nvrtc.0, nvrtc.1).as_bytes());
        CacheKey(hex::encode(hasher.finalize()))
    }
}

impl Cache {
    /// Opens the cache in `dir`, creating it (and any missing parent) private to the user. An existing
    /// `dir` must be a directory (links followed) of the user's that group and others cannot write.
    pub fn open(dir: &Path) -> Result<Cache> {
        if dir.as_os_str().is_empty() {
            return Err(Error::EmptyCacheDir);
        }
        let refused = |problem| Error::CacheRefused { path: dir.to_owned(), problem };
        let io = |source| Error::Cache { path: dir.to_owned(), source };
        match std::fs::metadata(dir) {
            Ok(metadata) if !metadata.is_dir() => {
                return Err(refused(CacheProblem::NotADirectory { kind: kind(&metadata) }));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
        }
        private(&std::fs::metadata(dir).map_err(io)?).map_err(refused)?;
        Ok(Cache { dir: dir.to_owned() })
    }

    /// `KDTREE_CACHE_DIR`, else the user's cache directory's `kdtree/cubin`.
    pub fn default_dir() -> PathBuf {
        match std::env::var_os(CACHE_DIR_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("kdtree").join("cubin"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file an entry lives in.
    pub fn path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.cubin", key.0))
    }

    pub fn get(&self, key: &CacheKey) -> CacheLookup {
        let path = self.path(key);
        let unusable =
            |why: String| CacheLookup::Unusable(format!("cache entry {} is {why}; recompiled", path.display()));
        match read_entry(&path) {
            Ok(Some(bytes)) => decode(&bytes).map_or_else(|why| unusable(why.into()), CacheLookup::Hit),
            Ok(None) => CacheLookup::Miss,
            Err(why) => unusable(why),
        }
    }

    /// Stores an entry atomically (a temporary file renamed into place).
    pub fn put(&self, key: &CacheKey, entry: &CachedCubin) -> Result<()> {
        let path = self.path(key);
        let io = |source| Error::Cache { path: path.clone(), source };
        let mut file = tempfile::NamedTempFile::new_in(&self.dir).map_err(io)?;
        file.write_all(&encode(entry)).map_err(io)?;
        file.persist(&path).map_err(|e| io(e.error))?;
        Ok(())
    }
}

/// `Ok` when `metadata` is of something the user owns and only the user may write.
fn private(metadata: &std::fs::Metadata) -> std::result::Result<(), CacheProblem> {
    let user = sys::user_id();
    if metadata.uid() != user {
        return Err(CacheProblem::NotOwned { owner: metadata.uid(), user });
    }
    // Group or others may write: they could put a cubin of their choosing in the user's place.
    if metadata.mode() & 0o022 != 0 {
        return Err(CacheProblem::WritableByOthers { mode: metadata.mode() & 0o7777 });
    }
    Ok(())
}

/// What a file that is not a directory or a regular file is, in words.
fn kind(metadata: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = metadata.file_type();
    if kind.is_file() {
        "a regular file"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else {
        "not a regular file"
    }
}

/// The bytes of the entry file at `path`, `None` if there is none, `Err(why)` if it cannot be used.
/// It is opened without following a link and without blocking (on a FIFO), and then checked through
/// the open file, so that what is checked is what is read: a regular file of the user's that only the
/// user may write, of a bounded size.
fn read_entry(path: &Path) -> std::result::Result<Option<Vec<u8>>, String> {
    let unreadable = |e: std::io::Error| format!("unreadable ({e})");
    let opened = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // O_NOFOLLOW's answer to a link.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err("a symbolic link, not a regular file".into()),
        Err(e) => return Err(unreadable(e)),
    };
    let metadata = file.metadata().map_err(unreadable)?;
    if !metadata.is_file() {
        return Err(format!("{}, not a regular file", kind(&metadata)));
    }
    private(&metadata).map_err(|problem| problem.to_string())?;
    let too_large = || format!("larger than an entry may be ({MAX_ENTRY_BYTES} bytes)");
    if metadata.len() > MAX_ENTRY_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    match file.take(MAX_ENTRY_BYTES + 1).read_to_end(&mut bytes) {
        Ok(_) if bytes.len() as u64 > MAX_ENTRY_BYTES => Err(too_large()),
        Ok(_) => Ok(Some(bytes)),
        Err(e) => Err(unreadable(e)),
    }
}

fn encode(entry: &CachedCubin) -> Vec<u8> {
    let metadata = serde_json::to_vec(&Metadata { stats: entry.stats }).expect("plain integers serialize");
    let mut body = Vec::with_capacity(4 + metadata.len() + entry.cubin.len());
    body.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
    body.extend_from_slice(&metadata);
    body.extend_from_slice(&entry.cubin);
    let mut file = Sha256::digest(&body).to_vec();
    file.extend_from_slice(&body);
    file
}

fn decode(file: &[u8]) -> std::result::Result<CachedCubin, &'static str> {
    const TRUNCATED: &str = "truncated";
    let (checksum, body) = file.split_at_checked(32).ok_or(TRUNCATED)?;
    if Sha256::digest(body).as_slice() != checksum {
        return Err("corrupt (checksum mismatch)");
    }
    let (length, rest) = body.split_first_chunk::<4>().ok_or(TRUNCATED)?;
    let (metadata, cubin) = rest.split_at_checked(u32::from_le_bytes(*length) as usize).ok_or(TRUNCATED)?;
    let metadata: Metadata = serde_json::from_slice(metadata).map_err(|_| "corrupt (bad metadata)")?;
    Ok(CachedCubin { stats: metadata.stats, cubin: cubin.to_vec() })
}
