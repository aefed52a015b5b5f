//! Render, compile, cache and tune W4A16 GEMM variants.
