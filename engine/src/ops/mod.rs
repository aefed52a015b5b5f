//! The engine's operations. [`cpu`] holds the reference implementation of each: deterministic,
//! f32 activations, and batch-invariant (a row's result never depends on the other rows).

pub mod cpu;
