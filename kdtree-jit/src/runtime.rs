//! The GPU, through cudarc's driver API: opened only after probing for the driver, so that a machine
//! without one gets an [`Error`], not a panic.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::{Arch, Compiled, Error, Result, probe};

/// One GPU: its context, the stream work is issued on, and what it is.
#[derive(Clone, Debug)]
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub arch: Arch,
    pub name: String,
}

impl Gpu {
    /// Opens GPU `ordinal` (0 is the first). [`Error::NoDriver`] without a driver, [`Error::NoGpu`]
    /// when there is no such device.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        probe::check_driver()?;
        let no_gpu = |reason: String| Error::NoGpu { ordinal, reason };
        let count = CudaContext::device_count().map_err(|e| no_gpu(e.to_string()))?;
        if ordinal >= count.max(0) as usize {
            return Err(no_gpu(format!("the driver sees {count} device(s)")));
        }
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        Ok(Gpu { stream: ctx.default_stream(), arch: Arch::from_capability(major, minor), name: ctx.name()?, ctx })
    }

    /// Loads a compiled kernel; its function is `c.name`. The cubin must be for this GPU's arch, or
    /// its arch-specific target (sm_90a on an sm_90 device).
    pub fn load(&self, c: &Compiled) -> Result<CudaFunction> {
        let [f] = self.load_entries(c, [c.name.clone()])?;
        Ok(f)
    }

    /// Loads a compiled module once with several of its `extern "C"` entries (a template may define
    /// more than its variant's function). The cubin must be for this GPU's arch, or its
    /// arch-specific target.
    pub(crate) fn load_entries<const N: usize>(&self, c: &Compiled, names: [String; N]) -> Result<[CudaFunction; N]> {
        let functions = self.load_named(c, &names)?;
        Ok(functions.try_into().unwrap_or_else(|_| unreachable!("one function per name")))
    }

    /// [`load_entries`](Gpu::load_entries) for a list of names known at run time, in their order.
    pub(crate) fn load_named(&self, c: &Compiled, names: &[String]) -> Result<Vec<CudaFunction>> {
        if !c.arch.runs_on(self.arch) {
            return Err(Error::WrongArch { name: c.name.clone(), compiled: c.arch, device: self.arch });
        }
        let module = self.ctx.load_module(Ptx::from_binary(c.cubin.clone()))?;
        names.iter().map(|name| Ok(module.load_function(name)?)).collect()
    }
}
