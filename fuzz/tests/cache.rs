//! Cubin cache entries damaged at random (truncated, flipped, extended, the metadata length
//! overwritten, with the checksum redone so the damage reaches the parser): a lookup is a hit, a
//! miss or unusable, and never panics.

use kdtree_fuzz::mutate::{byte_edits, cases};
use kdtree_jit::cache::{CacheKey, CacheLookup, CachedCubin};
use kdtree_jit::{Arch, Cache, KernelStats};
use proptest::prelude::*;
use proptest::test_runner::{Config as Run, TestRunner};
use sha2::{Digest, Sha256};

#[test]
fn damaged_cache_entries_are_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let key = CacheKey::new("k", "src", &[], (13, 0), Arch(90));
    let entry = CachedCubin { stats: KernelStats { registers: 40, ..KernelStats::default() }, cubin: vec![7; 300] };
    cache.put(&key, &entry).unwrap();
    let original = std::fs::read(cache.path(&key)).unwrap();
    let strategy = (byte_edits(), prop::option::of(any::<u32>()), any::<bool>());
    TestRunner::new(Run { cases: cases(512), failure_persistence: None, ..Run::default() })
        .run(&strategy, |(edits, length, rehash)| {
            // Edits apply to the body, after the 32-byte checksum.
            let mut body = original[32..].to_vec();
            if let (Some(length), true) = (length, body.len() >= 4) {
                body[..4].copy_from_slice(&length.to_le_bytes());
            }
            edits.iter().for_each(|e| e.apply(&mut body));
            let mut file = if rehash { Sha256::digest(&body).to_vec() } else { original[..32].to_vec() };
            file.extend_from_slice(&body);
            std::fs::write(cache.path(&key), &file).unwrap();
            match cache.get(&key) {
                CacheLookup::Hit(_) | CacheLookup::Miss | CacheLookup::Unusable(_) => Ok(()),
            }
        })
        .unwrap();
}
