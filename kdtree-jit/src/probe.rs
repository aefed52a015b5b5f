//! Finding NVRTC and the CUDA driver before cudarc looks for them, so that a missing library is an
//! [`Error`] instead of cudarc's panic.
//!
//! NVRTC is searched, in order: the `--nvrtc` flag or `KDTREE_NVRTC_DIR` (and nowhere else when given:
//! an explicit choice that fails is an error, not a fallback), the workspace's `target/nvrtc` (where
//! `scripts/test.sh` installs it from PyPI), then the system loader path. A library found in a
//! directory is read first (a whole ELF file with NVRTC's soname and symbols: a wrong one would
//! panic in cudarc or kill the process with SIGBUS), then preloaded by full path, so cudarc's later
//! `dlopen` by soname finds that copy.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::LibraryProblem;
use crate::{Error, Result, elf, sys};

/// The environment variable naming a directory that holds `libnvrtc.so.13`.
pub const NVRTC_DIR_ENV: &str = "KDTREE_NVRTC_DIR";

/// The NVRTC soname cudarc's `cuda-13000` build opens.
const NVRTC_LIB: &str = "libnvrtc.so.13";

/// NVRTC's functions that a library must define to be taken for it: every one kdtree calls (through
/// cudarc, which resolves each at its first call and panics where one lacks).
const NVRTC_SYMBOLS: [&str; 8] = [
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcDestroyProgram",
];

/// Where `pip install --target DIR nvidia-cuda-nvrtc` puts the libraries, under DIR.
const PIP_LIB_DIR: &str = "nvidia/cu13/lib";

/// The places to look for NVRTC, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NvrtcSearch {
    dirs: Vec<PathBuf>,
    /// Whether to fall back to the system loader path (`LD_LIBRARY_PATH`, ldconfig).
    system: bool,
}

/// Where NVRTC was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvrtcLocation {
    Dir(PathBuf),
    LoaderPath,
}

impl NvrtcSearch {
    /// `explicit` (a flag) or else `KDTREE_NVRTC_DIR`, alone; neither: the workspace, then the system.
    pub(crate) fn from_env(explicit: Option<&Path>) -> Result<NvrtcSearch> {
        NvrtcSearch::choose(explicit, std::env::var_os(NVRTC_DIR_ENV).as_deref().map(Path::new))
    }

    /// An empty directory is an error, not the current one: `KDTREE_NVRTC_DIR=` set to nothing by a
    /// script is a mistake to report, and a library under the current directory no choice at all.
    fn choose(flag: Option<&Path>, env: Option<&Path>) -> Result<NvrtcSearch> {
        match flag.or(env) {
            Some(dir) if dir.as_os_str().is_empty() => Err(Error::EmptyNvrtcDir),
            Some(dir) => Ok(NvrtcSearch::explicit(dir)),
            None => Ok(NvrtcSearch {
                dirs: vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nvrtc").join(PIP_LIB_DIR)],
                system: true,
            }),
        }
    }

    /// Only `dir`: the directory holding the library, or a `pip install --target` root.
    pub(crate) fn explicit(dir: &Path) -> NvrtcSearch {
        NvrtcSearch { dirs: vec![dir.to_owned(), dir.join(PIP_LIB_DIR)], system: false }
    }

    /// The first place that has NVRTC; loads nothing.
    pub(crate) fn locate(&self) -> Result<NvrtcLocation> {
        if let Some(dir) = self.dirs.iter().find(|dir| dir.join(NVRTC_LIB).is_file()) {
            return Ok(NvrtcLocation::Dir(dir.clone()));
        }
        if self.system && sys::nvrtc_on_loader_path() {
            return Ok(NvrtcLocation::LoaderPath);
        }
        let mut searched: Vec<PathBuf> = self.dirs.iter().map(|dir| dir.join(NVRTC_LIB)).collect();
        if self.system {
            // A bare file name: looked up by name on the loader path.
            searched.push(PathBuf::from(NVRTC_LIB));
        }
        Err(Error::NoNvrtc { searched })
    }
}

/// NVRTC as loaded for this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nvrtc {
    pub location: NvrtcLocation,
    pub version: (i32, i32),
}

static NVRTC: Mutex<Option<Nvrtc>> = Mutex::new(None);

/// Finds and loads NVRTC (see the module docs for where). The first success holds for the process:
/// later calls return it whatever `explicit` says; a failure may be retried with another directory.
pub fn load_nvrtc(explicit: Option<&Path>) -> Result<Nvrtc> {
    let mut loaded = NVRTC.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(nvrtc) = loaded.as_ref() {
        return Ok(nvrtc.clone());
    }
    let location = NvrtcSearch::from_env(explicit)?.locate()?;
    if let NvrtcLocation::Dir(dir) = &location {
        let (nvrtc, builtins) = (dir.join(NVRTC_LIB), builtins_in(dir)?);
        // Every file is checked before any is loaded: the loader would map a truncated one past its
        // end (SIGBUS), and cudarc panics on a library that lacks NVRTC's symbols.
        check_nvrtc(&nvrtc)?;
        for builtins in &builtins {
            elf::read_dynamic(builtins).map_err(|problem| Error::BadLibrary {
                path: builtins.clone(),
                library: "NVRTC's builtins library",
                problem,
            })?;
        }
        // The builtins first: libnvrtc opens them by name while compiling.
        for builtins in &builtins {
            sys::preload(builtins)?;
        }
        sys::preload(&nvrtc)?;
    }
    let nvrtc = Nvrtc { location, version: sys::nvrtc_version()? };
    *loaded = Some(nvrtc.clone());
    Ok(nvrtc)
}

/// NVRTC's (major, minor) version, loading it first if needed.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    load_nvrtc(None).map(|nvrtc| nvrtc.version)
}

/// `Ok` when the CUDA driver library can be loaded.
pub(crate) fn check_driver() -> Result<()> {
    if sys::driver_present() {
        Ok(())
    } else {
        Err(Error::NoDriver { reason: "libcuda.so.1 comes with the NVIDIA driver; is one installed?".into() })
    }
}

/// `Ok` when `path` is a whole ELF library named [`NVRTC_LIB`] that defines the functions kdtree
/// calls: cudarc finds it by that soname once it is preloaded, and panics where a symbol lacks.
fn check_nvrtc(path: &Path) -> Result<()> {
    let bad = |problem| Error::BadLibrary { path: path.to_owned(), library: "NVRTC (libnvrtc.so.13)", problem };
    let dynamic = elf::read_dynamic(path).map_err(bad)?;
    if dynamic.soname.as_deref() != Some(NVRTC_LIB) {
        return Err(bad(LibraryProblem::Soname { soname: dynamic.soname, expected: NVRTC_LIB }));
    }
    match NVRTC_SYMBOLS.into_iter().find(|symbol| !dynamic.symbols.iter().any(|s| s == symbol)) {
        Some(symbol) => Err(bad(LibraryProblem::MissingSymbol { symbol })),
        None => Ok(()),
    }
}

fn builtins_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::Library { path: dir.to_owned(), message: e.to_string() })?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        // Shared objects only: a CUDA toolkit's lib dir also holds `libnvrtc-builtins_static.a`.
        .filter(|path| path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so")))
        .collect();
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_shared_builtins_are_preloaded() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["libnvrtc-builtins.so.13.0", "libnvrtc-builtins_static.a", "libnvrtc.so.13"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        assert_eq!(builtins_in(dir.path()).unwrap(), vec![dir.path().join("libnvrtc-builtins.so.13.0")]);
    }

    #[test]
    fn an_explicit_empty_dir_is_an_error_naming_where_it_looked() {
        let dir = tempfile::tempdir().unwrap();
        let err = NvrtcSearch::explicit(dir.path()).locate().unwrap_err();
        let expected = vec![dir.path().join(NVRTC_LIB), dir.path().join(PIP_LIB_DIR).join(NVRTC_LIB)];
        assert!(matches!(&err, Error::NoNvrtc { searched } if *searched == expected), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&dir.path().join(NVRTC_LIB).display().to_string()), "{message}");
        assert!(message.contains(NVRTC_DIR_ENV), "{message}");
    }

    #[test]
    fn a_pip_install_root_is_found_under_its_lib_dir() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join(PIP_LIB_DIR);
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join(NVRTC_LIB), b"").unwrap();
        assert_eq!(NvrtcSearch::explicit(root.path()).locate().unwrap(), NvrtcLocation::Dir(lib.clone()));
        assert_eq!(NvrtcSearch::explicit(&lib).locate().unwrap(), NvrtcLocation::Dir(lib));
    }

    /// The workspace's NVRTC from PyPI (`scripts/nvrtc.sh` installs it before the tests).
    fn pip_nvrtc() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nvrtc").join(PIP_LIB_DIR).join(NVRTC_LIB)
    }

    #[test]
    fn a_library_lacking_a_function_called_after_the_first_ones_is_refused_naming_it() {
        let real = pip_nvrtc();
        check_nvrtc(&real).expect("NVRTC from PyPI (scripts/nvrtc.sh installs it) is taken");
        let bytes = std::fs::read(&real).unwrap();
        let dir = tempfile::tempdir().unwrap();
        // Each symbol's name renamed where it is stored (its last letter changed), as a library that
        // lacks it would be: cudarc would panic at the first call that needs it.
        for symbol in ["nvrtcCompileProgram", "nvrtcGetCUBIN", "nvrtcDestroyProgram"] {
            let name = format!("{symbol}\0").into_bytes();
            let mut patched = bytes.clone();
            let at: Vec<usize> =
                patched.windows(name.len()).enumerate().filter(|(_, w)| *w == name).map(|(i, _)| i).collect();
            assert!(!at.is_empty(), "{symbol} is in the real library");
            for i in at {
                patched[i + name.len() - 2] ^= 0x20;
            }
            let lib = dir.path().join(NVRTC_LIB);
            std::fs::write(&lib, &patched).unwrap();
            let err = check_nvrtc(&lib).unwrap_err();
            assert!(
                matches!(&err, Error::BadLibrary { problem: LibraryProblem::MissingSymbol { symbol: s }, .. } if *s == symbol),
                "{symbol}: {err:?}"
            );
        }
    }

    #[test]
    fn the_flag_beats_the_environment_which_beats_the_workspace_then_the_system() {
        let (flag, env) = (Path::new("/flag"), Path::new("/env"));
        assert_eq!(NvrtcSearch::choose(Some(flag), Some(env)).unwrap(), NvrtcSearch::explicit(flag));
        assert_eq!(NvrtcSearch::choose(None, Some(env)).unwrap(), NvrtcSearch::explicit(env));
        let empty = Path::new("");
        assert!(matches!(NvrtcSearch::choose(None, Some(empty)), Err(Error::EmptyNvrtcDir)));
        assert!(matches!(NvrtcSearch::choose(Some(empty), None), Err(Error::EmptyNvrtcDir)));
        let default = NvrtcSearch::choose(None, None).unwrap();
        assert!(default.system);
        assert_eq!(default.dirs.len(), 1);
        assert!(default.dirs[0].ends_with("target/nvrtc/nvidia/cu13/lib"), "{default:?}");
    }
}
