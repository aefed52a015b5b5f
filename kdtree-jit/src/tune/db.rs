//! The tuning DB: one JSON file of measured winners, keyed by problem and environment.
//!
//! Lookups never return an entry measured in another environment (device, driver, NVRTC,
//! templates): such entries come back as [`Stale`], so a caller can say why it is not using them.
//! A missing M bucket falls back to the nearest tuned one of the same problem. Reading and writing
//! the file ([`TuningDb::open`], [`TuningDb::save`]: bounded, merged under a lock, atomic) is in
//! `db/file.rs`.

mod file;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::bench::Timing;
use super::env::{Difference, Environment};
use super::key::ProblemKey;
use super::peers::Peers;
use super::search::Rejection;
use crate::arch::Arch;

/// The file format's version; a file of another version is refused, not guessed at.
pub(crate) const FORMAT: u32 = 1;

/// The environment variable that overrides the default path (`--db` overrides both).
pub const ENV_VAR: &str = "KDTREE_TUNING_DB";

/// The largest DB file read: thousands of entries take a few MiB, and a link to an endless file
/// is refused rather than read until memory runs out.
pub(crate) const MAX_FILE_BYTES: u64 = 256 << 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuningDb {
    pub format: u32,
    pub entries: Vec<Entry>,
    /// Variants NVRTC refused: not compiled again for the same arch, NVRTC and templates.
    pub compile_failures: Vec<CompileFailure>,
}

/// The fastest correct variant of one problem in one environment, with what it was measured against.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: ProblemKey,
    pub env: Environment,
    pub variant: String,
    /// The M it was timed at (the bucket's value).
    pub m: u32,
    pub timing: Timing,
    /// Its error at the correctness gate, in the gate's measure.
    pub error: f64,
    pub peers: Peers,
    /// Bytes one run must move: int4 weights, scales, activations and output.
    pub bytes: u64,
    /// How many candidates passed the gate and were timed.
    pub timed: u32,
    /// Candidates that ran but were wrong or failed, with the reason.
    pub rejected: Vec<Rejection>,
    pub tuned_at_unix: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileFailure {
    pub variant: String,
    pub arch: Arch,
    pub nvrtc: (i32, i32),
    pub templates: String,
    pub log: String,
}

/// How a hit matched the asked key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    Exact,
    /// No entry for the asked bucket: the nearest tuned bucket of the same problem.
    NearestM {
        bucket: u32,
    },
}

#[derive(Clone, Debug)]
pub struct Hit<'a> {
    pub entry: &'a Entry,
    pub matched: Match,
}

/// An entry of the asked problem measured elsewhere, and how its environment differs.
#[derive(Clone, Debug)]
pub struct Stale<'a> {
    pub entry: &'a Entry,
    pub differences: Vec<Difference>,
}

#[derive(Clone, Debug)]
pub struct Lookup<'a> {
    pub hit: Option<Hit<'a>>,
    pub stale: Vec<Stale<'a>>,
}

impl Default for TuningDb {
    fn default() -> Self {
        TuningDb { format: FORMAT, entries: Vec::new(), compile_failures: Vec::new() }
    }
}

impl TuningDb {
    /// `$KDTREE_TUNING_DB`, else `<user cache dir>/kdtree/tuning.json`.
    pub fn default_path() -> PathBuf {
        match std::env::var_os(ENV_VAR) {
            Some(path) => PathBuf::from(path),
            None => dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("kdtree").join("tuning.json"),
        }
    }

    /// Adds `entry`, replacing the entry of the same key measured on the same kind of device.
    pub fn insert(&mut self, entry: Entry) {
        self.entries.retain(|e| !entry.replaces(e));
        self.entries.push(entry);
        self.entries.sort_by(|a, b| a.key.cmp(&b.key));
    }

    /// The best fresh entry for `key`: its own bucket, else the nearest tuned bucket.
    pub fn best_variant(&self, key: &ProblemKey, env: &Environment) -> Option<&Entry> {
        self.lookup(key, env, |_| true).hit.map(|hit| hit.entry)
    }

    /// [`best_variant`](Self::best_variant) that also reports the stale entries of the problem, and
    /// takes only entries that `usable` accepts (e.g. variants that support the actual M).
    pub fn lookup(&self, key: &ProblemKey, env: &Environment, usable: impl Fn(&Entry) -> bool) -> Lookup<'_> {
        let mut fresh = Vec::new();
        let mut stale = Vec::new();
        for entry in self.entries.iter().filter(|e| key.same_but_m(&e.key)) {
            let differences = entry.env.differences(env);
            if !differences.is_empty() {
                stale.push(Stale { entry, differences });
            } else if usable(entry) {
                fresh.push(entry);
            }
        }
        // Nearest in log2(M); on a tie the larger bucket, whose tiles also cover the smaller M.
        let distance =
            |e: &Entry| (log2(e.key.m_bucket).abs_diff(log2(key.m_bucket)), std::cmp::Reverse(e.key.m_bucket));
        let hit = fresh.into_iter().min_by_key(|e| distance(e)).map(|entry| Hit {
            entry,
            matched: if entry.key.m_bucket == key.m_bucket {
                Match::Exact
            } else {
                Match::NearestM { bucket: entry.key.m_bucket }
            },
        });
        Lookup { hit, stale }
    }

    /// The entries measured in `env`, and the others (stale here) with their differences.
    pub fn partition(&self, env: &Environment) -> (Vec<&Entry>, Vec<Stale<'_>>) {
        let mut fresh = Vec::new();
        let mut stale = Vec::new();
        for entry in &self.entries {
            let differences = entry.env.differences(env);
            if differences.is_empty() { fresh.push(entry) } else { stale.push(Stale { entry, differences }) }
        }
        (fresh, stale)
    }

    pub fn record_compile_failure(&mut self, failure: CompileFailure) {
        self.compile_failures.retain(|f| !f.same_build(&failure));
        self.compile_failures.push(failure);
    }

    /// A recorded failure of `variant` for the same arch, NVRTC and templates, if any.
    pub fn compile_failure(&self, variant: &str, arch: Arch, env: &Environment) -> Option<&CompileFailure> {
        self.compile_failures
            .iter()
            .find(|f| f.variant == variant && f.arch == arch && f.nvrtc == env.nvrtc && f.templates == env.templates)
    }
}

/// `floor(log2(m))`, 0 for 0 (a bucket is a power of two from 1; a hand-made key may not be).
fn log2(m: u32) -> u32 {
    m.checked_ilog2().unwrap_or(0)
}

impl Entry {
    /// Whether this entry supersedes `other`: the same problem measured on the same kind of device.
    fn replaces(&self, other: &Entry) -> bool {
        let (a, b) = (&self.env, &other.env);
        self.key == other.key && (&a.device, a.compute_capability) == (&b.device, b.compute_capability)
    }
}

impl CompileFailure {
    fn same_build(&self, other: &CompileFailure) -> bool {
        (&self.variant, self.arch, self.nvrtc, &self.templates)
            == (&other.variant, other.arch, other.nvrtc, &other.templates)
    }
}
