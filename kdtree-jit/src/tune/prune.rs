//! Which variants are worth timing for one problem. The W4A16 space is small (135 valid points on
//! sm_90 for bf16 and group 32), so pruning is about not wasting time on points that cannot win,
//! not about search:
//!
//! 1. the problem fixes the dtype and group size; the device's arch fixes validity ([`crate::Variant::check`]);
//!    the shape fixes what can run ([`DenseFamily::supports`]: gemv only up to its `bm` rows);
//! 2. a block should not compute many more rows than the problem has: mma tiles of more than
//!    max(16, bucket(M)) rows and stream or gemv blocks of more than 4 bucket(M) rows only add
//!    padding;
//! 3. split-K only pays when the grid is short of the SMs: once the blocks along M and N alone
//!    fill four waves of the device, split-K's extra reduction cannot help;
//! 4. wgmma tiles (sm_90) are for M >= 16, where a weight dequantized once serves many tokens:
//!    their token tile is at most max(16, bucket(M)) and at least half of it (smaller tiles
//!    dequantize each weight again per tile); below 16 the tiles' streaming kernels own M;
//! 5. a variant NVRTC refused for the same arch, NVRTC and templates is not compiled again
//!    (the DB remembers it; `--retry-failed` tries anyway).
//!
//! Then [`super::search`] gates all that remain, screens them with 15 reps (cutting off any candidate
//! 1.5x slower than the best so far) and times the 4 fastest with 100 reps. A model's shapes at
//! 8 values of M take a few seconds of GPU time each, plus compiling once per variant.

use kdtree_quant::Dtype;

use super::key::{Shape, m_bucket};
use crate::w4a16::dense::{DenseFamily, DenseVariant};
use crate::w4a16::wgmma::W4a16Wgmma;
use crate::w4a16::{Algo, W4a16};

/// What pruning needs to know about a problem and the device.
#[derive(Clone, Copy, Debug)]
pub struct Scope {
    pub m: u32,
    pub shape: Shape,
    pub group_size: u32,
    pub dtype: Dtype,
    /// Streaming multiprocessors of the device.
    pub sms: u32,
}

/// Why `v` is not worth timing for `scope`, or `None` when it is. `v` is valid for the device.
pub(crate) fn why_not(v: &DenseVariant, scope: &Scope) -> Option<&'static str> {
    match v {
        DenseVariant::Tiles(v) => why_not_tiles(v, scope),
        DenseVariant::Wgmma(v) => why_not_wgmma(v, scope),
    }
}

fn why_not_tiles(v: &W4a16, scope: &Scope) -> Option<&'static str> {
    let (m, n, k) = (scope.m as usize, scope.shape.n as usize, scope.shape.k as usize);
    let rows = m_bucket(scope.m);
    if v.dtype != scope.dtype || v.group_size != scope.group_size {
        Some("another dtype or group size")
    } else if !v.supports(m, n, k) {
        Some("cannot compute this shape")
    } else if v.bm > rows_worth(v.algo, rows) {
        Some("block rows far beyond M")
    } else if v.split_k > 1 && blocks_without_split(v, m, n) >= 4 * scope.sms as usize {
        Some("split-K with the grid already four waves deep")
    } else {
        None
    }
}

fn why_not_wgmma(v: &W4a16Wgmma, scope: &Scope) -> Option<&'static str> {
    let (m, n, k) = (scope.m as usize, scope.shape.n as usize, scope.shape.k as usize);
    let rows = m_bucket(scope.m);
    let blocks = m.div_ceil(v.bm as usize) * n.div_ceil(v.bn as usize);
    if v.dtype != scope.dtype || v.group_size != scope.group_size {
        Some("another dtype or group size")
    } else if !v.supports(m, n, k) {
        Some("cannot compute this shape")
    } else if rows < 16 {
        Some("wgmma's smallest token tile is 16: fewer rows are the streaming kernels'")
    } else if v.bm > rows.max(16) {
        Some("block rows far beyond M")
    } else if v.bm < rows.min(256) / 2 {
        Some("token tiles far below M: each would dequantize the weight again")
    } else if v.split_k > 1 && blocks >= 4 * scope.sms as usize {
        Some("split-K with the grid already four waves deep")
    } else {
        None
    }
}

/// The variants of `valid` worth timing for `scope`.
pub fn prune(valid: &[DenseVariant], scope: &Scope) -> Vec<DenseVariant> {
    valid.iter().filter(|v| why_not(v, scope).is_none()).copied().collect()
}

/// The most rows a block of `algo` should compute for problems of `rows` rows (an M bucket): mma's
/// smallest tile or the bucket; the next row counts of stream and gemv (1, 4, 8, 16) up from the bucket.
fn rows_worth(algo: Algo, rows: u32) -> u32 {
    match algo {
        Algo::Mma => rows.max(16),
        Algo::Stream | Algo::Gemv => rows.saturating_mul(4),
    }
}

/// Blocks of the grid along M and N (the launch's grid without its split-K dimension).
fn blocks_without_split(v: &W4a16, m: usize, n: usize) -> usize {
    match v.algo {
        Algo::Gemv | Algo::Stream => n.div_ceil(v.bn as usize),
        Algo::Mma => m.div_ceil(v.bm as usize) * n.div_ceil(v.bn as usize),
    }
}
