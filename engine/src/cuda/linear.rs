//! Linear weights on the GPU: dense ones in bf16/f16 for cuBLAS (or a streamed kernel), dense f32
//! ones for cuBLAS's f32 GEMM with no TF32 (an f32 model's activations then stay f32), INT4 ones
//! repacked for the W4A16 kernel variants their shape's plan names (tuning DB or default), uploaded
//! once at load in each layout those variants read.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice};
use half::bf16;
use kdtree_jit::cublas::{self, Compute, GemmType};
use kdtree_jit::dense16::Dense16Kernel;
use kdtree_jit::w4a16::GemmBuffers;
use kdtree_jit::w4a16::dense::{DenseFamily, DenseKernel, DenseVariant, Layout};
use kdtree_quant::{Dtype, QuantizedWeight};

use super::CudaBackend;
use super::gemm::{self, EXACT_ROWS, GemmInput};
use super::ops;
use super::select::{Mode, Plan, WeightShape};
use super::streamed::{self, MAX_STREAMED_ROWS};
use super::tensor::CudaTensor;
use crate::error::{EngineError, Result};
use crate::model::DenseShape;
use crate::registry::{DenseValues, DenseWeight};

/// The loaded kernels of one weight shape, shared by every weight of that shape.
pub struct ShapeKernels {
    pub shape: WeightShape,
    pub plan: Plan,
    /// Each variant bound to its loaded function, or why the function was not the variant's: an
    /// error at the variant's first use, since building this cannot fail.
    kernels: HashMap<DenseVariant, std::result::Result<DenseKernel, String>>,
}

impl ShapeKernels {
    /// Binds each loaded function to its variant ([`DenseKernel::new`] checks it is the variant's).
    pub(super) fn new(shape: WeightShape, plan: Plan, functions: HashMap<DenseVariant, CudaFunction>) -> Self {
        let kernels =
            functions.into_iter().map(|(v, f)| (v, DenseKernel::new(v, f).map_err(|e| e.to_string()))).collect();
        Self { shape, plan, kernels }
    }

    /// The kernel of the variant for `m` rows.
    fn for_rows(&self, m: usize) -> Result<&DenseKernel> {
        let v = self.plan.variant_for(m);
        match self.kernels.get(v) {
            Some(Ok(kernel)) => Ok(kernel),
            Some(Err(reason)) => Err(EngineError::NoKernel { shape: self.shape.to_string(), reason: reason.clone() }),
            None => Err(EngineError::NotLoaded {
                op: "linear",
                what: format!("the kernel of {}", kdtree_jit::Variant::name(v)),
            }),
        }
    }
}

/// A linear layer's weight on the GPU.
pub enum CudaLinear {
    /// bf16 or f16 bits `[n, k]`, and the streamed kernel that runs it at up to
    /// [`MAX_STREAMED_ROWS`] rows, if one was chosen. Its input rows are rounded to `dtype`.
    Dense { n: usize, k: usize, dtype: Dtype, w: CudaSlice<u16>, streamed: Option<Arc<Dense16Kernel>> },
    /// f32 `[n, k]` (the loader's compute dtype f32): its input rows are read as they are, in f32.
    Dense32 { n: usize, k: usize, w: CudaSlice<f32> },
    /// INT4 in each layout of its shape's kernels: (layout, packed, scales).
    Int4 { n: usize, k: usize, layouts: Vec<(Layout, CudaSlice<u32>, CudaSlice<u16>)>, kernels: Arc<ShapeKernels> },
}

impl CudaLinear {
    pub(crate) fn n(&self) -> usize {
        match self {
            CudaLinear::Dense { n, .. } | CudaLinear::Dense32 { n, .. } | CudaLinear::Int4 { n, .. } => *n,
        }
    }

    pub(crate) fn k(&self) -> usize {
        match self {
            CudaLinear::Dense { k, .. } | CudaLinear::Dense32 { k, .. } | CudaLinear::Int4 { k, .. } => *k,
        }
    }

    /// The 16-bit type the weight's input rows are rounded to: the INT4 weight's activation dtype
    /// (its scales'), or the dense weight's dtype; `None` for an f32 weight, which reads f32 rows.
    pub(crate) fn half_dtype(&self) -> Option<Dtype> {
        match self {
            CudaLinear::Dense { dtype, .. } => Some(*dtype),
            CudaLinear::Dense32 { .. } => None,
            CudaLinear::Int4 { kernels, .. } => Some(kernels.shape.dtype),
        }
    }

    /// [`Self::half_dtype`], bf16 for an f32 weight: for the paths that take 16-bit rows only.
    pub(crate) fn dtype(&self) -> Dtype {
        self.half_dtype().unwrap_or(Dtype::Bf16)
    }

    /// Uploads a dense weight in its dtype: the loader converted it to the model's compute dtype.
    pub(super) fn dense(b: &CudaBackend, w: &DenseWeight) -> Result<CudaLinear> {
        let s = b.stream();
        let (dtype, w16) = match &w.values {
            DenseValues::Bf16(v) => (Dtype::Bf16, s.clone_htod(bytemuck::cast_slice::<bf16, u16>(v))?),
            DenseValues::F16(v) => (Dtype::F16, s.clone_htod(bytemuck::cast_slice::<half::f16, u16>(v))?),
            DenseValues::F32(v) => return Ok(CudaLinear::Dense32 { n: w.n, k: w.k, w: s.clone_htod(v)? }),
        };
        let streamed = b.streamed_kernel(DenseShape { n: w.n, k: w.k, dtype })?;
        Ok(CudaLinear::Dense { n: w.n, k: w.k, dtype, w: w16, streamed })
    }

    /// Repacks `w` into each layout of the kernels' plan (one, unless fast mode mixes the tiles and
    /// wgmma across M) and uploads it.
    pub(super) fn int4(b: &CudaBackend, w: &QuantizedWeight, kernels: Arc<ShapeKernels>) -> Result<CudaLinear> {
        let mut layouts: Vec<(Layout, CudaSlice<u32>, CudaSlice<u16>)> = Vec::new();
        for v in kernels.plan.variants() {
            if layouts.iter().all(|(l, ..)| *l != v.layout()) {
                let d = v.repack(w)?;
                layouts.push((v.layout(), b.stream().clone_htod(&d.packed)?, b.stream().clone_htod(&d.scales)?));
            }
        }
        Ok(CudaLinear::Int4 { n: w.n, k: w.k, layouts, kernels })
    }
}

/// A GEMM's input rows in 16 bits: the bits the kernel that wrote the rows left beside them, or a
/// cast of them.
pub(super) enum HalfRows<'a> {
    Kept(&'a CudaSlice<u16>),
    Cast(CudaSlice<u16>),
}

impl std::ops::Deref for HalfRows<'_> {
    type Target = CudaSlice<u16>;

    fn deref(&self) -> &CudaSlice<u16> {
        match self {
            HalfRows::Kept(bits) => bits,
            HalfRows::Cast(bits) => bits,
        }
    }
}

/// `x` rounded to `dtype` bits, in a buffer of at least `rows` rows (the rows past `x`'s left as
/// they are: padding for exact mode's GEMMs, whose rows depend on their own row of X only): `x`'s
/// own bf16 bits where it has them for that many rows, the same bits a cast gives; else a cast.
pub(super) fn to_half<'a>(b: &CudaBackend, x: &'a CudaTensor, dtype: Dtype, rows: usize) -> Result<HalfRows<'a>> {
    let len = rows.max(x.rows) * x.cols;
    match &x.bf16 {
        Some(bits) if dtype == Dtype::Bf16 && bits.len() >= len => Ok(HalfRows::Kept(bits)),
        _ => {
            let mut out = b.output::<u16>(len)?;
            ops::to_half(b.kernels(), &x.data, dtype, &mut out)?;
            Ok(HalfRows::Cast(out))
        }
    }
}

/// `y[m, n] = x[m, k] · Wᵀ`.
pub(super) fn forward(b: &CudaBackend, x: &CudaTensor, w: &CudaLinear) -> Result<CudaTensor> {
    let (m, n, k) = (x.rows, w.n(), w.k());
    if x.cols != k {
        return Err(EngineError::shape("linear", format!("rows of {} against a weight's K of {k}", x.cols)));
    }
    if let CudaLinear::Dense32 { w, .. } = w {
        let data = dense(b, (GemmInput::F32, Compute::F32Pedantic), &x.data, w, (m, n, k))?;
        return Ok(CudaTensor::new(data, m, n));
    }
    let streamed = match w {
        CudaLinear::Dense { streamed: Some(kernel), .. } if m <= MAX_STREAMED_ROWS => Some(kernel),
        _ => None,
    };
    let padded = match (w, b.mode()) {
        (CudaLinear::Dense { .. }, Mode::Exact { .. }) if streamed.is_none() => gemm::padded_rows(m),
        _ => m,
    };
    let xh = to_half(b, x, w.dtype(), padded)?;
    let input = if w.dtype() == Dtype::F16 { GemmInput::F16 } else { GemmInput::Bf16 };
    match w {
        CudaLinear::Dense { w, .. } => {
            let data = match streamed {
                Some(kernel) => streamed::forward(b, kernel, &xh, w, (m, n, k))?,
                None => dense(b, (input, Compute::F32), &*xh, w, (m, n, k))?,
            };
            Ok(CudaTensor::new(data, m, n))
        }
        // (An f32 weight returned above: int4_half refuses it.)
        CudaLinear::Int4 { .. } | CudaLinear::Dense32 { .. } => {
            let y = int4_half(b, &xh, m, w)?;
            let mut out = b.output::<f32>(m * n)?;
            ops::from_half(b.kernels(), &y, w.dtype(), &mut out)?;
            Ok(CudaTensor::new(out, m, n))
        }
    }
}

/// The W4A16 product of `m` half rows `x` into half rows, by the plan's variant for `m`.
pub(super) fn int4_half(b: &CudaBackend, x: &CudaSlice<u16>, m: usize, w: &CudaLinear) -> Result<CudaSlice<u16>> {
    let CudaLinear::Int4 { n, k, layouts, kernels } = w else {
        return Err(EngineError::UnsupportedInput {
            op: "int4_half",
            input: "a dense weight".into(),
            accepted: "INT4 weights".into(),
        });
    };
    let kernel = kernels.for_rows(m)?;
    let v = kernel.variant();
    let (_, packed, scales) =
        layouts.iter().find(|(l, ..)| *l == v.layout()).ok_or_else(|| EngineError::NotLoaded {
            op: "int4_half",
            what: format!("the weight in {}'s layout", kdtree_jit::Variant::name(&v)),
        })?;
    let s = b.stream();
    let mut y = b.output::<u16>(m * n)?;
    // A row-limited variant (stream, gemv) runs blocks of its `bm` rows, one launch each: rows are
    // independent in every variant, so each row's bits are those of any other split.
    let block = v.row_limit().unwrap_or(m);
    // Zeroed: split-K variants keep their tile counters at its start, where they are for any rows,
    // and leave them at zero, so the row blocks (the last one shorter) can share it.
    let len = v.workspace_len(block.min(m), *n);
    let mut workspace = if len == 0 { b.output::<f32>(1)? } else { s.alloc_zeros::<f32>(len)? };
    for start in (0..m).step_by(block) {
        let rows = block.min(m - start);
        let buffers = GemmBuffers {
            x: x.slice(start * k..(start + rows) * k),
            packed,
            scales,
            y: y.slice_mut(start * n..(start + rows) * n),
            workspace: &mut workspace,
        };
        kernel.launch(b.gpu(), rows, *n, *k, buffers)?;
    }
    Ok(y)
}

/// A dense product through cuBLAS; in exact mode in padded chunks of [`EXACT_ROWS`] (see
/// [`gemm`]'s module doc), so that a row's bits never depend on `m`. f32 inputs never round to TF32;
/// [`Compute::F32Pedantic`] (f32 weights) also rules out any other reduced-precision shortcut.
pub(super) fn dense<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    b: &CudaBackend,
    (input, compute): (GemmInput, Compute),
    x: &CudaSlice<T>,
    w: &CudaSlice<T>,
    (m, n, k): (usize, usize, usize),
) -> Result<CudaSlice<f32>> {
    let s = b.stream();
    if matches!(b.mode(), Mode::Fast) {
        let mut y = b.output::<f32>(m * n)?;
        let (x, w) = (&x.as_view(), &w.as_view());
        cublas::gemm_with(b.blas(), s, compute, (input, GemmType::F32), (m, n, k), x, w, &mut y.as_view_mut())?;
        return Ok(y);
    }
    let rows = gemm::padded_rows(m);
    // Padding rows are left as they are: a GEMM's row depends on its own row of X only.
    let copied;
    let xp = if x.len() >= rows * k {
        x
    } else {
        let mut xp = b.output::<T>(rows * k)?;
        s.memcpy_dtod(&x.slice(0..m * k), &mut xp.slice_mut(0..m * k))?;
        copied = xp;
        &copied
    };
    let mut yp = b.output::<f32>(rows * n)?;
    for chunk in 0..rows / EXACT_ROWS {
        let (xs, ys) = (chunk * EXACT_ROWS * k, chunk * EXACT_ROWS * n);
        let xc = xp.slice(xs..xs + EXACT_ROWS * k);
        let mut yc = yp.slice_mut(ys..ys + EXACT_ROWS * n);
        cublas::gemm_with(
            b.blas(),
            s,
            compute,
            (input, GemmType::F32),
            (EXACT_ROWS, n, k),
            &xc,
            &w.as_view(),
            &mut yc,
        )?;
    }
    if rows == m {
        return Ok(yp);
    }
    let mut y = b.output::<f32>(m * n)?;
    s.memcpy_dtod(&yp.slice(0..m * n), &mut y)?;
    Ok(y)
}
