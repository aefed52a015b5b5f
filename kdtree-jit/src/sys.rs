//! The crate's raw calls into C: loading the CUDA libraries, NVRTC, and the driver's queries. The
//! other unsafe blocks sit next to what they vouch for: each kernel launch beside its argument list
//! ([`crate::w4a16::dense::DenseKernel`], the tuner's L2 flush), cuBLAS in [`crate::cublas`], and the
//! launchers `#[kernel]` generates.

use std::ffi::{CStr, CString, c_char};
use std::path::Path;

use cudarc::driver::CudaFunction;
use cudarc::driver::sys as driver_sys;
use cudarc::nvrtc::result as nvrtc;
use cudarc::nvrtc::sys::{self as nvrtc_sys, nvrtcResult};
use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::{Error, Result};

/// Loads a library by full path, globally and for the life of the process: later `dlopen`s by
/// soname (cudarc's, NVRTC's own of its builtins) then find this copy.
pub(crate) fn preload(path: &Path) -> Result<()> {
    // SAFETY: the NVIDIA libraries loaded here run no initialisers with preconditions on the caller.
    let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) };
    let library = library.map_err(|e| Error::Library { path: path.to_owned(), message: e.to_string() })?;
    // Never unloaded: cudarc keeps using it through its own handle.
    std::mem::forget(library);
    Ok(())
}

/// The effective user id of this process: whose files the cubin cache trusts.
pub(crate) fn user_id() -> u32 {
    // SAFETY: geteuid takes nothing, cannot fail and only reads the process's credentials.
    unsafe { libc::geteuid() }
}

/// Whether cudarc would find NVRTC by name on the loader path.
pub(crate) fn nvrtc_on_loader_path() -> bool {
    // SAFETY: only tries to dlopen (and closes again) the candidate names; never panics.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// Whether cudarc would find the CUDA driver (libcuda) on the loader path.
pub(crate) fn driver_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The CUDA driver's version, e.g. 13000 for CUDA 13.0. Call only once the driver was found.
pub(crate) fn driver_version() -> Result<i32> {
    let mut version = 0;
    // SAFETY: the call writes one int through a valid pointer; the library is loaded (the caller's
    // precondition).
    unsafe { driver_sys::cuDriverGetVersion(&mut version) }.result()?;
    Ok(version)
}

/// The name of a loaded function, as its module has it; `None` from a driver older than CUDA 12.3,
/// which cannot tell (and whose missing symbol cudarc would panic at).
pub(crate) fn function_name(f: &CudaFunction) -> Result<Option<String>> {
    if driver_version()? < 12030 {
        return Ok(None);
    }
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: `f` keeps its module loaded, so its handle is valid; one valid out-pointer.
    unsafe { driver_sys::cuFuncGetName(&mut name, f.cu_function()) }.result()?;
    if name.is_null() {
        return Ok(None);
    }
    // SAFETY: a NUL-terminated string the driver owns while `f`'s module is loaded: copied here.
    Ok(Some(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()))
}

/// NVRTC's (major, minor). Call only once NVRTC was found: cudarc panics otherwise.
pub(crate) fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers; the library is loaded (the caller's precondition).
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(nvrtc_error)?;
    Ok((major, minor))
}

/// What one NVRTC compilation gave: the cubin if it succeeded, and the log either way.
pub(crate) struct Output {
    pub cubin: Option<Vec<u8>>,
    pub log: String,
}

/// Compiles `source` (named `file_name` in diagnostics) with `options`. A compile error is an `Output`
/// without cubin; `Err` is for NVRTC itself failing. Call only once NVRTC was found.
pub(crate) fn compile(source: &str, file_name: &str, options: &[String]) -> Result<Output> {
    let source = CString::new(source).map_err(|_| Error::Nvrtc("the source contains a NUL byte".into()))?;
    let file_name = CString::new(file_name).map_err(|_| Error::Nvrtc("the file name contains a NUL byte".into()))?;
    let program = Program(nvrtc::create_program(&source, Some(&file_name)).map_err(nvrtc_error)?);
    // SAFETY: `program` is live until dropped at the end of this function; the options hold no NUL.
    let compiled = unsafe { nvrtc::compile_program(program.0, options) };
    // SAFETY: as above.
    let log = unsafe { nvrtc::get_program_log(program.0) }.map_err(nvrtc_error)?;
    let log = text(&log);
    match compiled {
        Ok(()) => Ok(Output { cubin: Some(program.cubin()?), log }),
        Err(e) if e.0 == nvrtcResult::NVRTC_ERROR_COMPILATION => Ok(Output { cubin: None, log }),
        Err(e) => Err(nvrtc_error(e)),
    }
}

/// An NVRTC program, destroyed on drop.
struct Program(nvrtc_sys::nvrtcProgram);

impl Program {
    fn cubin(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: a live, successfully compiled program and a valid out-pointer.
        unsafe { nvrtc_sys::nvrtcGetCUBINSize(self.0, &mut size) }.result().map_err(nvrtc_error)?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds the `size` bytes NVRTC writes.
        unsafe { nvrtc_sys::nvrtcGetCUBIN(self.0, cubin.as_mut_ptr().cast::<c_char>()) }
            .result()
            .map_err(nvrtc_error)?;
        Ok(cubin)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program`, destroyed only here. A failure leaks one program: nothing to do.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

/// NVRTC's log as text: up to its NUL terminator, lossily decoded (cudarc hands out C chars).
fn text(log: &[c_char]) -> String {
    let bytes: Vec<u8> = log.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).trim_end().to_owned()
}

fn nvrtc_error(e: nvrtc::NvrtcError) -> Error {
    Error::Nvrtc(format!("{:?}", e.0))
}
