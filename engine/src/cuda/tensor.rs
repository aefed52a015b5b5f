//! The CUDA backend's activations and per-forward inputs.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use crate::registry::{Length, Shaped};
use kdtree_jit::mla::NewMask;

/// f32 rows on the GPU; `data` holds exactly `rows * cols` values.
///
/// `bf16`: where the kernel that wrote `data` also wrote it rounded to bf16 (the norms, the SiLU
/// gate), those bits, for at least the rows an exact-mode GEMM reads (`gemm::padded_rows`); a GEMM
/// that reads bf16 takes them instead of a cast launch (`linear::to_half`). Code that writes `data`
/// in place goes through `CudaTensor::data_mut`, which drops them.
pub struct CudaTensor {
    pub data: CudaSlice<f32>,
    pub rows: usize,
    pub cols: usize,
    pub(crate) bf16: Option<CudaSlice<u16>>,
}

/// The backend's parameter vectors.
impl Length for CudaSlice<f32> {
    fn length(&self) -> usize {
        CudaSlice::len(self)
    }
}

impl Shaped for CudaTensor {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }
}

impl CudaTensor {
    pub fn new(data: CudaSlice<f32>, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor { data, rows, cols, bf16: None }
    }

    /// `data` for writing in place: its bf16 bits, which would go stale, are dropped.
    pub(crate) fn data_mut(&mut self) -> &mut CudaSlice<f32> {
        self.bf16 = None;
        &mut self.data
    }

    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One forward's inputs on the GPU, uploaded once and read by every layer.
pub struct CudaBatch {
    pub n: usize,
    pub tokens: CudaSlice<u32>,
    pub positions: CudaSlice<u32>,
    /// How the MLA kernels read the mask: causal, full, or `mask`'s bits.
    pub mask_mode: MaskMode,
    /// Visibility among the new tokens when `mask_mode` is `MaskMode::Bits`, `[n, words]` with
    /// `words = n.div_ceil(32)`: bit `b` of word `w` of row `i` is whether token `i` sees token
    /// `32 w + b`. One unused word otherwise.
    pub mask: CudaSlice<u32>,
    /// One value: the cache's committed entries, after which the batch's are appended. On the device
    /// so that a recorded graph of the forward reads each replay's own.
    pub past: CudaSlice<u32>,
}

impl CudaBatch {
    /// The mask as the MLA kernels take it.
    pub(crate) fn device_mask(&self) -> kdtree_jit::mla::DeviceMask<'_> {
        use kdtree_jit::mla::DeviceMask;
        match self.mask_mode {
            MaskMode::Causal => DeviceMask::Causal,
            MaskMode::Full => DeviceMask::Full,
            MaskMode::Bits => DeviceMask::Bits(self.mask.as_view()),
        }
    }
}

/// How a batch's mask reaches the MLA kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskMode {
    Causal = 0,
    Full = 1,
    Bits = 2,
}

/// The most tokens a recorded forward has: tree verification's sizes. Larger forwards (prompts) run
/// eagerly.
pub(crate) const MAX_GRAPH_TOKENS: usize = 256;
/// The most tokens of a forward whose mask is sent as bits whatever it is: every size a graph
/// records, so that one recorded forward serves trees and chains alike. Longer forwards (prompt
/// chunks) send a causal or full mask as its mode alone, and a tree's bits up to [`MAX_TREE_BITS`].
const ALWAYS_BITS: usize = MAX_GRAPH_TOKENS;
/// The largest tree whose bits are sent (512 KiB of them).
pub(crate) const MAX_TREE_BITS: usize = 2048;

/// A forward's inputs on the host, in the layout of [`CudaBatch`].
pub(super) struct HostBatch {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    mask_mode: MaskMode,
    mask: Vec<u32>,
    past: u32,
}

impl HostBatch {
    pub(super) fn new(tokens: &[u32], positions: &[usize], mask: &TreeMask, past: usize) -> Result<HostBatch> {
        let over = |what: &str, v: usize| EngineError::ArgumentOutOfRange {
            what: format!("a batch's {what}"),
            value: v as u64,
            limit: format!("at most {} (u32)", u32::MAX),
        };
        let positions =
            positions.iter().map(|&p| u32::try_from(p).map_err(|_| over("position", p))).collect::<Result<_>>()?;
        let (mask_mode, words) = match mask.new_mask() {
            _ if mask.len() <= ALWAYS_BITS => (MaskMode::Bits, mask.words()),
            NewMask::Causal => (MaskMode::Causal, vec![0]),
            NewMask::Full => (MaskMode::Full, vec![0]),
            NewMask::Bits(_) if mask.len() > MAX_TREE_BITS => {
                return Err(EngineError::ArgumentOutOfRange {
                    what: "a batch's tree size".into(),
                    value: mask.len() as u64,
                    limit: format!("at most {MAX_TREE_BITS} tokens"),
                });
            }
            NewMask::Bits(words) => (MaskMode::Bits, words.clone()),
        };
        Ok(HostBatch {
            tokens: tokens.to_vec(),
            positions,
            mask_mode,
            mask: words,
            past: u32::try_from(past).map_err(|_| over("cache length", past))?,
        })
    }

    pub(super) fn upload(&self, s: &Arc<CudaStream>) -> Result<CudaBatch> {
        Ok(CudaBatch {
            n: self.tokens.len(),
            tokens: s.clone_htod(&self.tokens)?,
            positions: s.clone_htod(&self.positions)?,
            mask_mode: self.mask_mode,
            mask: s.clone_htod(&self.mask)?,
            past: s.clone_htod(&[self.past])?,
        })
    }

    /// Overwrites `batch`, a batch of as many tokens, with these inputs.
    pub(super) fn write(&self, s: &Arc<CudaStream>, batch: &mut CudaBatch) -> Result<()> {
        if batch.n != self.tokens.len() || batch.mask_mode != self.mask_mode {
            return Err(EngineError::shape(
                "batch",
                format!(
                    "{} tokens ({:?} mask) written over a batch of {} ({:?})",
                    self.tokens.len(),
                    self.mask_mode,
                    batch.n,
                    batch.mask_mode
                ),
            ));
        }
        s.memcpy_htod(&self.tokens, &mut batch.tokens)?;
        s.memcpy_htod(&self.positions, &mut batch.positions)?;
        s.memcpy_htod(&self.mask, &mut batch.mask)?;
        s.memcpy_htod(&[self.past], &mut batch.past)?;
        Ok(())
    }
}
