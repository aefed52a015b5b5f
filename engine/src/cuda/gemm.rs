//! Dense GEMMs through cuBLAS ([`kdtree_jit::cublas::gemm`]): `Y[m, n] = X[m, k] · W[n, k]ᵀ` with X
//! and W in bf16/f16 (or both f32, the router) and Y in f32, f32 accumulation.
//!
//! Exactness: cuBLAS picks its kernel (tiles, split-K) by the problem's size, so a row's result may
//! change with M. In exact mode every product therefore runs in chunks of exactly [`EXACT_ROWS`]
//! rows, padded: a GEMM's row depends only on its own row of X, so every chunk computes a row with
//! the same kernel and the same bits whatever M is. cuBLAS is flat in M up to 128 rows on the
//! weight-streaming shapes a decode step runs (GPU.md), so this costs the padded rows' output writes.

/// The element type of X and W.
pub(crate) use kdtree_jit::cublas::GemmType as GemmInput;

/// The rows of every cuBLAS call in exact mode.
pub(crate) const EXACT_ROWS: usize = 128;

/// Rows `m` rounded up to whole exact-mode chunks.
pub(crate) fn padded_rows(m: usize) -> usize {
    m.div_ceil(EXACT_ROWS) * EXACT_ROWS
}
