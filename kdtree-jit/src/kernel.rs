//! The run-time side of `#[kernel]`: every annotated signature registers a [`KernelDef`] (collected at
//! startup with `inventory`), [`Kernels::load`] compiles them all for the GPU through the same NVRTC path
//! and cubin cache as the variants, and the generated launchers find their function there.
//!
//! A kernel in a library is registered once the program links it: calling its launcher does, and so does
//! naming the `KERNEL` static in the module of the launcher's name that the macro also generates.
//!
//! ```no_run
//! use cudarc::driver::CudaSlice;
//! use kdtree_jit::kernel::{Kernels, kernel};
//!
//! /// out = k * x
//! #[kernel(
//!     source = r#"extern "C" __global__ void scale(const float* x, float* out, unsigned int n, float k) {
//!         unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
//!         if (i < n) out[i] = k * x[i];
//!     }"#,
//!     grid = n.div_ceil(256), block = 256,
//! )]
//! unsafe fn scale(x: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u32, k: f32);
//!
//! # fn main() -> kdtree_jit::Result<()> {
//! let gpu = kdtree_jit::Gpu::open(0)?;
//! let kernels = Kernels::load(&gpu, None)?;
//! let x = kernels.stream().clone_htod(&[1.0f32, 2.0, 3.0])?;
//! let mut out = kernels.stream().alloc_zeros::<f32>(3)?;
//! // SAFETY: x and out hold n = 3 elements.
//! unsafe { scale(&kernels, &x, &mut out, 3, 2.0)? };
//! assert_eq!(kernels.stream().clone_dtoh(&out)?, [2.0, 4.0, 6.0]);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchArgs};
use rayon::prelude::*;

use crate::{Arch, Cache, Compiled, Error, Gpu, Result, compile_source};

pub use cudarc::driver::LaunchConfig;
pub use kdtree_macros::kernel;

// The macro's registrations expand to `inventory::submit!`, reached through this path so that crates
// defining kernels need no dependency of their own. inventory rather than a hand-kept list: kernels live
// in any crate of the build, and a list in one place would have to know them all (and be forgotten).
#[doc(hidden)]
pub use inventory;
// Named by the generated launchers, which push arguments through it without importing it.
#[doc(hidden)]
pub use cudarc::driver::PushKernelArg;

/// One `#[kernel]`, as the macro registers it.
#[derive(Debug)]
pub struct KernelDef {
    /// The CUDA function name, which is also the Rust launcher's.
    pub name: &'static str,
    /// `module::path::name` of the launcher: unique in the program, the key of a loaded kernel.
    pub path: &'static str,
    /// The file (or template) the source came from, or "inline".
    pub origin: &'static str,
    /// The CUDA source NVRTC compiles, templates already rendered.
    pub source: &'static str,
    /// Template params as written in the attribute.
    pub params: &'static [(&'static str, &'static str)],
}

/// What the macro submits to the inventory: the address of the kernel's `name::KERNEL` static.
#[doc(hidden)]
pub struct Registered(pub &'static KernelDef);

inventory::collect!(Registered);

impl KernelDef {
    pub fn compile(&self, arch: Arch, cache: Option<&Cache>) -> Result<Compiled> {
        compile_source(self.name, &format!("{} ({})", self.origin, self.path), self.source, arch, cache)
    }
}

/// Every `#[kernel]` linked into this program, by path.
pub fn registered() -> Vec<&'static KernelDef> {
    let mut defs: Vec<&'static KernelDef> = inventory::iter::<Registered>.into_iter().map(|r| r.0).collect();
    defs.sort_by_key(|d| d.path);
    defs
}

/// Compiles every registered kernel for `arch`, in parallel; also what runs without a GPU.
pub(crate) fn compile_registered(arch: Arch, cache: Option<&Cache>) -> Vec<(&'static KernelDef, Result<Compiled>)> {
    registered().into_par_iter().map(|def| (def, def.compile(arch, cache))).collect()
}

/// The registered kernels, loaded on one GPU: what the generated launchers take.
pub struct Kernels {
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
}

impl Kernels {
    /// Compiles (or takes from `cache`) and loads every registered kernel; the first failure is the error.
    pub fn load(gpu: &Gpu, cache: Option<&Cache>) -> Result<Kernels> {
        let mut functions = HashMap::new();
        for (def, compiled) in compile_registered(gpu.arch, cache) {
            functions.insert(def.path, gpu.load(&compiled?)?);
        }
        Ok(Kernels { stream: gpu.stream.clone(), functions })
    }

    /// The stream every launcher enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Arguments of a launch of `def`, to be pushed in the kernel's order (the generated code does).
    pub fn launcher(&self, def: &KernelDef) -> Result<LaunchArgs<'_>> {
        // Only a kernel registered after `load` (none: registration runs before main) can be missing.
        let function = self
            .functions
            .get(def.path)
            .ok_or_else(|| Error::UnknownVariant { space: "#[kernel]", name: def.path.to_owned() })?;
        Ok(self.stream.launch_builder(function))
    }
}

/// A grid or block shape: `n`, `(x, y)` or `(x, y, z)`.
pub trait Dims {
    fn dims(self) -> (u32, u32, u32);
}

impl Dims for u32 {
    fn dims(self) -> (u32, u32, u32) {
        (self, 1, 1)
    }
}

impl Dims for (u32, u32) {
    fn dims(self) -> (u32, u32, u32) {
        (self.0, self.1, 1)
    }
}

impl Dims for (u32, u32, u32) {
    fn dims(self) -> (u32, u32, u32) {
        self
    }
}

/// What `grid = .., block = .., shared = ..` of a `#[kernel]` becomes.
pub fn launch_config(grid: impl Dims, block: impl Dims, shared_mem_bytes: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: grid.dims(), block_dim: block.dims(), shared_mem_bytes }
}

#[cfg(test)]
mod tests {
    use cudarc::driver::CudaSlice;

    use super::*;

    /// Defined here so that the registry has something to find in this crate's own tests.
    #[kernel(
        source = r#"extern "C" __global__ void registry_probe(float* x, unsigned int n) {
            if (blockIdx.x * blockDim.x + threadIdx.x < n) x[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
        }"#,
        grid = n.div_ceil(128), block = 128,
    )]
    #[allow(dead_code)]
    unsafe fn registry_probe(x: &mut CudaSlice<f32>, n: u32);

    #[test]
    fn the_macro_registers_its_kernel() {
        let def = registered().into_iter().find(|d| d.name == "registry_probe").expect("registered");
        assert!(std::ptr::eq(def, &registry_probe::KERNEL));
        assert_eq!(def.path, "kdtree_jit::kernel::tests::registry_probe");
        assert_eq!(def.origin, "inline");
        assert!(def.source.contains("__global__ void registry_probe"));
    }

    #[test]
    fn a_registered_kernel_compiles_without_a_gpu() {
        let compiled = registry_probe::KERNEL.compile(Arch(90), None).unwrap();
        assert_eq!(compiled.name, "registry_probe");
        assert!(!compiled.cubin.is_empty());
        let all = compile_registered(Arch(120), None);
        let (_, probe) = all.iter().find(|(d, _)| d.name == "registry_probe").expect("compiled with the rest");
        assert!(probe.is_ok());
    }

    #[test]
    fn launch_shapes_widen_to_three_dimensions() {
        let c = launch_config((4, 2), 128, 1024);
        assert_eq!((c.grid_dim, c.block_dim, c.shared_mem_bytes), ((4, 2, 1), (128, 1, 1), 1024));
    }
}
