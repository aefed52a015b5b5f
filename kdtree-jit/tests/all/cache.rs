//! The cubin cache: a miss compiles and stores, a hit loads without compiling, a corrupt or truncated
//! entry is reported and recompiled; and the cache trusts no one but its user.

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

/// Mode bits of `path` (links followed).
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Whether this process runs as root, who may give a file away to another user.
fn root() -> bool {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::metadata(dir.path()).unwrap().uid() == 0
}

/// A uid that owns nothing here.
const STRANGER: u32 = 54321;

#[test]
fn the_cache_is_created_private_and_a_directory_others_may_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b/cubin");
    Cache::open(&nested).unwrap();
    assert_eq!(mode(&nested), 0o700);
    assert_eq!(mode(&dir.path().join("a")), 0o700, "the parents it made are private too");

    for loose in [0o777, 0o770, 0o1777] {
        chmod(&nested, loose);
        let e = Cache::open(&nested).unwrap_err();
        let message = e.to_string();
        assert!(matches!(e, kdtree_jit::Error::CacheRefused { .. }), "{message}");
        assert!(message.contains(&nested.display().to_string()), "{message}");
        assert!(message.contains("written by its group or others") && message.contains("chmod go-w"), "{message}");
    }
    chmod(&nested, 0o755);
    Cache::open(&nested).unwrap();

    // Someone else's directory: as root, one given away; otherwise `/`, which is root's.
    let foreign = if root() {
        std::os::unix::fs::chown(&nested, Some(STRANGER), None).unwrap();
        nested
    } else {
        std::path::PathBuf::from("/")
    };
    let message = Cache::open(&foreign).unwrap_err().to_string();
    assert!(message.contains("is owned by uid") && message.contains("not by this user"), "{message}");
}

#[test]
fn a_path_that_is_not_a_directory_or_empty_is_refused_saying_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    for (path, says) in [(file.as_path(), "is a regular file, not a directory"), ("/dev/null".as_ref(), "is a device")]
    {
        let message = Cache::open(path).unwrap_err().to_string();
        assert!(message.contains(&format!("cubin cache at {}: {says}", path.display())), "{message}");
    }
    let message = Cache::open("".as_ref()).unwrap_err().to_string();
    assert!(message.contains("empty path") && message.contains("KDTREE_CACHE_DIR"), "{message}");
}

#[test]
fn a_forged_entry_others_could_write_is_not_loaded_but_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let good = compile_source("twice", "inline", KERNEL, Arch(90), Some(&cache)).unwrap();
    let path = only_entry(&cache);
    assert_eq!(mode(&path), 0o600, "entries are written private");
    let options = kdtree_jit::compile::options(Arch(90));
    let key = CacheKey::new("twice", KERNEL, &options, kdtree_jit::nvrtc_version().unwrap(), Arch(90));
    assert_eq!(cache.path(&key), path, "the key of the entry compile_source wrote");
    // A well-formed entry with its checksum recomputed, holding another cubin: what a forger writes.
    let forged = CachedCubin { stats: good.stats, cubin: b"not the kernel".to_vec() };
    cache.put(&key, &forged).unwrap();
    assert_eq!(cache.get(&key), CacheLookup::Hit(forged.clone()), "the user's own entry is trusted");

    chmod(&path, 0o666);
    let CacheLookup::Unusable(why) = cache.get(&key) else { panic!("an entry others may write was loaded") };
    assert!(why.contains(&path.display().to_string()) && why.contains("written by its group or others"), "{why}");
    let again = compile_source("twice", "inline", KERNEL, Arch(90), Some(&cache)).unwrap();
    assert!(!again.cached && again.cubin == good.cubin, "recompiled, not loaded");
    assert_eq!(mode(&path), 0o600, "and replaced by a private entry");

    if root() {
        cache.put(&key, &forged).unwrap();
        std::os::unix::fs::chown(&path, Some(STRANGER), None).unwrap();
        let CacheLookup::Unusable(why) = cache.get(&key) else { panic!("another user's entry was loaded") };
        assert!(why.contains(&format!("is owned by uid {STRANGER}")), "{why}");
    }
}
