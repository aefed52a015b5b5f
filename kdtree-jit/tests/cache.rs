//! The cubin cache: a miss compiles and stores, a hit loads without compiling, a corrupt or truncated
//! entry is reported and recompiled.

use kdtree_jit::cache::{CacheKey, CacheLookup, CachedCubin};
use kdtree_jit::{Arch, Cache, KernelStats, compile_source};

const KERNEL: &str = r#"extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }"#;

fn only_entry(cache: &Cache) -> std::path::PathBuf {
    let files: Vec<_> = std::fs::read_dir(cache.dir()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

#[test]
fn a_miss_compiles_and_stores_then_a_hit_returns_the_same_cubin() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let first = compile_source("twice", "inline", KERNEL, Arch(90), Some(&cache)).unwrap();
    assert!(!first.cached && first.cache_error.is_none());
    let second = compile_source("twice", "inline", KERNEL, Arch(90), Some(&cache)).unwrap();
    assert!(second.cached && second.cache_error.is_none());
    assert_eq!((second.cubin, second.stats), (first.cubin, first.stats));
    // Another arch is another key.
    assert!(!compile_source("twice", "inline", KERNEL, Arch(120), Some(&cache)).unwrap().cached);
}

#[test]
fn a_truncated_or_corrupt_entry_is_reported_and_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let good = compile_source("twice", "inline", KERNEL, Arch(120), Some(&cache)).unwrap();
    let path = only_entry(&cache);
    let bytes = std::fs::read(&path).unwrap();

    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 1;
    for (damage, expected) in
        [(bytes[..bytes.len() / 2].to_vec(), "corrupt"), (bytes[..10].to_vec(), "truncated"), (flipped, "corrupt")]
    {
        std::fs::write(&path, damage).unwrap();
        let again = compile_source("twice", "inline", KERNEL, Arch(120), Some(&cache)).unwrap();
        assert!(!again.cached, "a damaged entry must not be used");
        let note = again.cache_error.as_deref().unwrap_or_default();
        assert!(note.contains(expected) && note.contains("recompiled"), "{note}");
        assert_eq!(again.cubin, good.cubin);
        // The recompile rewrote the entry.
        assert!(compile_source("twice", "inline", KERNEL, Arch(120), Some(&cache)).unwrap().cached);
    }
}

#[test]
fn keys_differ_with_every_input_and_entries_round_trip() {
    let options = vec!["-std=c++17".to_string()];
    let key = |name: &str, source: &str, options: &[String], nvrtc: (i32, i32), arch: u32| {
        CacheKey::new(name, source, options, nvrtc, Arch(arch))
    };
    let base = key("k", "src", &options, (13, 0), 90);
    assert_eq!(base, key("k", "src", &options, (13, 0), 90));
    for other in [
        key("j", "src", &options, (13, 0), 90),
        key("k", "src2", &options, (13, 0), 90),
        key("k", "src", &[], (13, 0), 90),
        key("k", "src", &options, (13, 1), 90),
        key("k", "src", &options, (13, 0), 120),
    ] {
        assert_ne!(base, other);
    }

    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(&dir.path().join("nested/dir")).unwrap();
    assert_eq!(cache.get(&base), CacheLookup::Miss);
    let entry = CachedCubin {
        stats: KernelStats { registers: 40, shared_bytes: 512, ..KernelStats::default() },
        cubin: vec![7; 100],
    };
    cache.put(&base, &entry).unwrap();
    assert_eq!(cache.get(&base), CacheLookup::Hit(entry));
}

#[cfg(unix)]
#[test]
fn an_entry_that_is_not_a_regular_file_or_too_large_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let key = CacheKey::new("k", "src", &[], (13, 0), Arch(90));
    // A link to an endless file: read to the end, it would exhaust memory.
    std::os::unix::fs::symlink("/dev/zero", cache.path(&key)).unwrap();
    let CacheLookup::Unusable(why) = cache.get(&key) else { panic!("a link to /dev/zero was used") };
    assert!(why.contains("not a regular file") && why.contains("recompiled"), "{why}");
    // Storing replaces the link itself, not what it points to.
    let entry = CachedCubin { stats: KernelStats::default(), cubin: vec![1, 2, 3] };
    cache.put(&key, &entry).unwrap();
    assert_eq!(cache.get(&key), CacheLookup::Hit(entry));

    // A (sparse) file larger than any entry is refused by its size, unread.
    let file = std::fs::File::create(cache.path(&key)).unwrap();
    file.set_len(kdtree_jit::cache::MAX_ENTRY_BYTES + 1).unwrap();
    let CacheLookup::Unusable(why) = cache.get(&key) else { panic!("an oversized entry was used") };
    assert!(why.contains("larger than an entry may be"), "{why}");
}
