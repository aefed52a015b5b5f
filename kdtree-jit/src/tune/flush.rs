//! Evicting the L2 between timed reps, so that every rep reads its weights from memory, as a decode
//! step does.
//!
//! How it is evicted matters as much as that it is. A write (triton's `do_bench` zeroes a buffer)
//! leaves the L2 full of dirty lines, and the timed operation then pays for writing them back as it
//! evicts them: up to an L2's worth (60 MB on an H200, more than a 4096x7168 int4 weight), a tax on
//! every memory-bound kernel that a decode step, whose previous kernels mostly read weights, does
//! not pay. A read leaves clean lines, which cost nothing to evict. `Write` stays for comparison.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use serde::{Deserialize, Serialize};

use super::error::Result;
use crate::{Arch, Compiled, Gpu};

/// How the L2 is evicted before each timed rep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// Read a buffer four times the L2 (the L2 is left clean).
    #[default]
    Read,
    /// Zero a buffer four times the L2, as triton's `do_bench` does (the L2 is left dirty).
    Write,
}

impl std::fmt::Display for FlushMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FlushMode::Read => "read",
            FlushMode::Write => "write",
        })
    }
}

/// Reads every byte of `buf` (16 at a time, grid-strided). The buffer is zeros, so the store never
/// happens, but the compiler cannot know that and keeps every load.
const READ_KERNEL: &str = r#"
extern "C" __global__ void kdtree_l2_flush(const uint4* __restrict__ buf, unsigned long long n, unsigned* sink) {
    unsigned acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint4 v = buf[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}
"#;

/// The read kernel compiled for `arch`.
fn compile_read_kernel(arch: Arch) -> Result<Compiled> {
    Ok(crate::compile_source("kdtree_l2_flush", "tune/flush.rs", READ_KERNEL, arch, None)?)
}

/// The read kernel, loaded from [`READ_KERNEL`] and nothing else, so that its launch's argument
/// list is its own.
struct ReadKernel(CudaFunction);

impl ReadKernel {
    fn load(gpu: &Gpu) -> Result<ReadKernel> {
        Ok(ReadKernel(gpu.load(&compile_read_kernel(gpu.arch)?)?))
    }

    /// Reads all of `buf` with `blocks` blocks of 256 threads.
    fn read_all(
        &self,
        stream: &Arc<CudaStream>,
        buf: &CudaSlice<u8>,
        sink: &mut CudaSlice<u32>,
        blocks: u32,
    ) -> Result<()> {
        let chunks = (buf.len() / 16) as u64;
        let cfg = LaunchConfig { grid_dim: (blocks.max(1), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut args = stream.launch_builder(&self.0);
        args.arg(buf).arg(&chunks).arg(sink);
        // SAFETY: the arguments match the kernel's (const uint4*, unsigned long long, unsigned*): it
        // reads `chunks` 16-byte chunks of `buf` (cudarc allocations are 256-byte aligned) and writes
        // at most one u32 of `sink`, which holds one.
        unsafe { args.launch(cfg) }?;
        Ok(())
    }
}

pub struct Flusher {
    buf: CudaSlice<u8>,
    /// The read kernel, its sink and its grid (blocks); `None` flushes by a write.
    read: Option<(ReadKernel, CudaSlice<u32>, u32)>,
}

impl Flusher {
    /// 256 MiB: over four times the 60 MB L2 of an H200 (50 MB on an H100).
    const BYTES: usize = 256 << 20;

    /// Allocates the buffer and, for `Read`, compiles the read kernel for `gpu` (NVRTC must be loaded).
    pub fn new(gpu: &Gpu, mode: FlushMode, sms: u32) -> Result<Flusher> {
        let buf = gpu.stream.alloc_zeros(Self::BYTES)?;
        let read = match mode {
            FlushMode::Write => None,
            FlushMode::Read => Some((ReadKernel::load(gpu)?, gpu.stream.alloc_zeros(1)?, sms * 8)),
        };
        Ok(Flusher { buf, read })
    }

    pub fn mode(&self) -> FlushMode {
        if self.read.is_some() { FlushMode::Read } else { FlushMode::Write }
    }

    pub fn flush(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        match &mut self.read {
            None => Ok(stream.memset_zeros(&mut self.buf)?),
            Some((kernel, sink, blocks)) => kernel.read_all(stream, &self.buf, sink, *blocks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_kernel_compiles_for_every_named_arch() {
        for arch in [Arch(90), Arch(120)] {
            let c = compile_read_kernel(arch).unwrap();
            assert!(c.cubin.starts_with(b"\x7fELF"), "{arch}: not a cubin");
        }
    }
}
