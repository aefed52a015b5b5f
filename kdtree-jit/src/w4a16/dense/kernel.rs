//! The one launch of every dense family: a variant bound to its loaded function, and the device
//! buffers of one GEMM.

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};
use kdtree_quant::QuantizedWeight;

use crate::launch::{allow_shared, check_name, short_buffer};
use crate::w4a16::dense::{DenseFamily, DenseVariant};
use crate::{Compiled, Error, Gpu, Result, Variant};

/// The device buffers of one GEMM. `workspace` must hold [`DenseFamily::workspace_len`] elements
/// and be zeroed once when allocated: split-K variants keep their tile counters there and leave
/// them at zero.
pub struct GemmBuffers<'a> {
    /// X, [M, K] row-major, activation dtype bits: a view, so that a block of rows of a larger
    /// buffer can be one launch's X.
    pub x: CudaView<'a, u16>,
    /// [`crate::w4a16::DeviceWeights::packed`], in the variant's layout.
    pub packed: &'a CudaSlice<u32>,
    /// [`crate::w4a16::DeviceWeights::scales`], in the variant's layout.
    pub scales: &'a CudaSlice<u16>,
    /// Y, [M, N] row-major, activation dtype bits.
    pub y: CudaViewMut<'a, u16>,
    pub workspace: &'a mut CudaSlice<f32>,
}

/// A dense variant bound to its loaded function: the only way to launch one, so that no function
/// runs with an argument list that is not its own.
#[derive(Clone, Debug)]
pub struct DenseKernel {
    variant: DenseVariant,
    function: CudaFunction,
}

impl DenseKernel {
    /// Binds `function` to `variant`: [`Error::WrongKernel`] unless the function's name (which the
    /// templates make the variant's) is the variant's.
    pub fn new(variant: impl Into<DenseVariant>, function: CudaFunction) -> Result<DenseKernel> {
        let variant = variant.into();
        check_name(variant.name(), &function)?;
        Ok(DenseKernel { variant, function })
    }

    /// Loads `compiled` (the cubin of `variant` for [`DenseFamily::compile_arch`]) and binds it.
    pub fn load(gpu: &Gpu, variant: impl Into<DenseVariant>, compiled: &Compiled) -> Result<DenseKernel> {
        DenseKernel::new(variant, gpu.load(compiled)?)
    }

    pub fn variant(&self) -> DenseVariant {
        self.variant
    }

    /// Enqueues `Y = X · dequant(W)ᵀ` on `gpu`'s stream; `b.packed` and `b.scales` must be in the
    /// variant's layout.
    pub fn launch(&self, gpu: &Gpu, m: usize, n: usize, k: usize, b: GemmBuffers) -> Result<()> {
        let (v, f) = (&self.variant, &self.function);
        let fail = |reason: String| Error::Unsupported { variant: v.name(), reason };
        if let Some(reason) = v.unsupported(m, n, k) {
            return Err(fail(reason));
        }
        let (packed_len, scales_len) = v.lengths(n, k);
        let needs = [
            ("x", b.x.len(), m * k),
            ("packed", b.packed.len(), packed_len),
            ("scales", b.scales.len(), scales_len),
            ("y", b.y.len(), m * n),
            ("workspace", b.workspace.len(), v.workspace_len(m, n)),
        ];
        if let Some(reason) = short_buffer(&needs) {
            return Err(fail(reason));
        }
        let smem = v.shared_bytes();
        allow_shared(f, smem, v.static_bytes())?;
        let (gx, gy, gz) = v.grid(m, n);
        let cfg = LaunchConfig {
            grid_dim: (gx as u32, gy as u32, gz as u32),
            block_dim: (v.threads(), 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (m, n, k) = (m as i32, n as i32, k as i32);
        let mut args = gpu.stream.launch_builder(f);
        let (x, mut y) = (b.x, b.y);
        args.arg(&x).arg(b.packed).arg(b.scales).arg(&mut y).arg(b.workspace).arg(&m).arg(&n).arg(&k);
        // SAFETY: `f` is `v`'s kernel (checked when bound), and the argument list matches every dense
        // template's kernel signature (x, packed, scales, y, workspace, m, n, k); every buffer was
        // checked above to hold what the kernel indexes.
        unsafe { args.launch(cfg) }?;
        Ok(())
    }

    /// One GEMM from host data: repacks `w` into the variant's layout, uploads, launches and
    /// returns Y ([m, n] bits of the activation dtype). For tests and correctness gates, not speed.
    pub fn gemm_host(&self, gpu: &Gpu, x: &[u16], m: usize, w: &QuantizedWeight) -> Result<Vec<u16>> {
        let v = &self.variant;
        let d = v.repack(w)?;
        let s = &gpu.stream;
        let (xd, packed, scales) = (s.clone_htod(x)?, s.clone_htod(&d.packed)?, s.clone_htod(&d.scales)?);
        let mut y = s.alloc_zeros::<u16>(m * w.n)?;
        let mut workspace = s.alloc_zeros::<f32>(v.workspace_len(m, w.n).max(1))?;
        let b = GemmBuffers {
            x: xd.as_view(),
            packed: &packed,
            scales: &scales,
            y: y.as_view_mut(),
            workspace: &mut workspace,
        };
        self.launch(gpu, m, w.n, w.k, b)?;
        Ok(s.clone_dtoh(&y)?)
    }
}
