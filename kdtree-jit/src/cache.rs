//! The cubin cache on disk: one file per (kernel, source, options, NVRTC version, arch).
//!
//! A file is `sha256(body) || body`, body = `u32 LE metadata length || metadata JSON || cubin`, so a
//! corrupt or truncated entry is detected, reported and recompiled, never loaded. Entries are written
//! to a temporary file in the cache directory and renamed into place: readers never see half a file,
//! and concurrent compiles of one kernel simply race to write the same bytes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::compile::KernelStats;
use crate::{Arch, Error, Result};

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
    /// Opens (creating if needed) the cache in `dir`.
    pub fn open(dir: &Path) -> Result<Cache> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Cache { path: dir.to_owned(), source })?;
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

/// The bytes of the entry file at `path`, `None` if there is none, `Err(why)` if it cannot be used.
/// The type is checked before opening (opening a FIFO would block) and the read is bounded.
fn read_entry(path: &Path) -> std::result::Result<Option<Vec<u8>>, String> {
    let unreadable = |e: std::io::Error| format!("unreadable ({e})");
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(e)),
    };
    if !metadata.is_file() {
        return Err("not a regular file".into());
    }
    let too_large = || format!("larger than an entry may be ({MAX_ENTRY_BYTES} bytes)");
    if metadata.len() > MAX_ENTRY_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    match std::fs::File::open(path).and_then(|f| f.take(MAX_ENTRY_BYTES + 1).read_to_end(&mut bytes)) {
        Ok(_) if bytes.len() as u64 > MAX_ENTRY_BYTES => Err(too_large()),
        Ok(_) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
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
