//! Cubin cache entries damaged at random (truncated, flipped, extended, the metadata length
//! overwritten), with or without the checksum redone so that the damage reaches the parser. An intact
//! entry is a hit; damage under the stored checksum is refused, naming the file; damage under a redone
//! checksum is refused too or, where it still parses, read as exactly what the file now says. A
//! lookup of an entry on disk is never a miss, and never panics.

use kdtree_fuzz::mutate::{byte_edits, cases};
use kdtree_jit::cache::{CacheKey, CacheLookup, CachedCubin};
use kdtree_jit::{Arch, Cache, KernelStats};
use proptest::prelude::*;
use proptest::test_runner::{Config as Run, TestCaseError, TestRunner};
use sha2::{Digest, Sha256};

/// The cubin an entry's body declares: what follows its length-prefixed metadata.
fn declared_cubin(body: &[u8]) -> Option<&[u8]> {
    let (length, rest) = body.split_first_chunk::<4>()?;
    rest.get(u32::from_le_bytes(*length) as usize..)
}

#[test]
fn damaged_cache_entries_are_refused_or_read_as_written_and_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let key = CacheKey::new("k", "src", &[], (13, 0), Arch(90));
    let entry = CachedCubin { stats: KernelStats { registers: 40, ..KernelStats::default() }, cubin: vec![7; 300] };
    cache.put(&key, &entry).unwrap();
    let path = cache.path(&key);
    let original = std::fs::read(&path).unwrap();
    assert_eq!(cache.get(&key), CacheLookup::Hit(entry.clone()), "an intact entry is a hit");
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
            std::fs::write(&path, &file).unwrap();
            let damaged = file != original;
            match cache.get(&key) {
                CacheLookup::Hit(hit) if !damaged => prop_assert_eq!(hit, entry.clone()),
                // A redone checksum makes damage that still parses a valid entry: it must be read as written.
                CacheLookup::Hit(hit) => {
                    prop_assert!(rehash, "damage under the stored checksum was loaded");
                    prop_assert_eq!(Some(hit.cubin.as_slice()), declared_cubin(&body));
                }
                CacheLookup::Unusable(why) => {
                    prop_assert!(damaged, "an intact entry was refused: {}", why);
                    prop_assert!(why.contains(&path.display().to_string()) && why.ends_with("recompiled"), "{}", why);
                    if !rehash {
                        prop_assert!(why.contains("checksum mismatch"), "{}", why);
                    }
                }
                CacheLookup::Miss => return Err(TestCaseError::fail("an entry on disk was a miss")),
            }
            Ok(())
        })
        .unwrap();
}
